// Properties of the context clamp with speculative decoding (issue 7), over generated workloads
// whose requests run into the context length L with W up to 8:
//   - vcl never exceeds L;
//   - no KV slot past a request's pages is written (every position a row writes lies in a page the
//     host reserved for it — never in a stale table column, never diverted to the dummy slot);
//   - the step result's accepted lengths equal vcl's growth, and the next round starts from the last
//     token the result reports.
// RapidCheck properties that depend on core only, so the same properties build against
// lockstep_core_clamp_planted (the clamp applied at only one of its two sites), where each must
// fail.
#pragma once

#include <rapidcheck.h>

#include <cstdint>
#include <functional>
#include <optional>
#include <ostream>
#include <string>
#include <vector>

namespace ls::spec_props {

// One generated workload (printed on failure).
struct ClampWorkload {
  uint64_t seed = 0;           // the seeded verifier's accepted lengths
  int32_t verify_width = 2;    // W in 2..8
  int32_t page_size = 4;       // P
  int32_t context_length = 32; // L
  std::vector<int32_t> prompt_lengths;  // one request per pool row; most end a few tokens short of L
  int32_t lingering_steps = 1;  // decode steps a request still runs once its reported length is L
  bool ngram_drafter = true;
  bool recover_midway = false;  // one request is retracted and recovered (hist + override) midway

  std::string describe() const;
};

rc::Gen<ClampWorkload> gen_clamp_workload();
// How RapidCheck prints a generated workload.
void showValue(const ClampWorkload& w, std::ostream& os);

// Empty when the property held over the whole run; else the first counterexample.
std::string vcl_within_context(const ClampWorkload& w);
std::string kv_slots_within_own_pages(const ClampWorkload& w);
std::string accepted_lengths_equal_vcl_growth(const ClampWorkload& w);

using ClampProperty = std::function<std::string(const ClampWorkload&)>;

// Runs `property` under RapidCheck over `cases` generated workloads (RC_PARAMS's seed, and its
// reproduce map for a printed case): nothing when it held on all, else the shrunk counterexample
// and RapidCheck's report.
std::optional<std::string> counterexample(const std::string& id, const ClampProperty& property,
                                          int cases);

}  // namespace ls::spec_props
