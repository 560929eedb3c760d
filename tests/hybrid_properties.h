// RapidCheck properties of a hybrid (Mamba2 + attention) model served end to end (issue 19), on
// `tiny-hybrid` with seeded weights: the scheduler (chunked prefill, retraction by recompute under
// page pressure, overlap on or off), the executor and the CPU reference, one step at a time.
//   tokens   a request's tokens are the same whatever the chunk size and the page pool (so
//            across retractions by recompute, which restart its state from a zeroed slot);
//   slots    after every step the simulator's recurrent-state checkers hold (sim/checkers.h
//            check_mamba_step): no two live requests share a working slot, padded tokens carry
//            no slot (never slot 0, a real one), only the slots the step's rows own change state,
//            and a request's first chunk zeroes its working slot.
// The file depends on core, the scheduler and sim/checkers.cpp only, so it builds against the
// planted libraries (tests/planted/, tests/hybrid_planted_test.cpp), where a property must fail:
// skip_mamba_zeroing.cpp breaks `tokens`, pad_mamba_slot_zero.cpp and share_mamba_slot.cpp break
// `slots`.
#pragma once

#include <rapidcheck.h>

#include <cstdint>
#include <optional>
#include <ostream>
#include <string>
#include <vector>

namespace ls::hybrid_props {

struct HybridWorkload {
  int32_t max_batch_rows = 2;
  int32_t page_size = 4;
  int32_t chunk_a = 8;  // the two chunkings compared by `tokens`
  int32_t chunk_b = 3;
  bool overlap = true;
  std::vector<int32_t> prompt_lengths;  // one request each
  std::vector<int32_t> new_tokens;      // [requests]
  std::vector<uint8_t> greedy;          // [requests] 1 greedy, 0 seeded sampling

  std::string describe() const;
};

rc::Gen<HybridWorkload> gen_hybrid_workload();
void showValue(const HybridWorkload& w, std::ostream& os);

// "" when the workload keeps the property, else what broke.
std::string tokens_same_across_chunkings_and_retraction(const HybridWorkload& w);
std::string state_slots_kept(const HybridWorkload& w);
// The retractions of the tokens property's tight-pool run of `w` (tests: it does retract).
int64_t tight_pool_retractions(const HybridWorkload& w);

enum class Property : uint8_t { kTokens, kSlots };

// Runs `property` over `cases` generated workloads (a fixed seed unless RC_PARAMS says
// otherwise); the shrunk counterexample's description when one fails, nullopt when none does.
std::optional<std::string> counterexample(Property property, int cases);

}  // namespace ls::hybrid_props
