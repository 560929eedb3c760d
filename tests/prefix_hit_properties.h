// Serving a small hybrid (Mamba2 + attention) model end to end with its recurrent state through
// the prefix cache and retraction (issue 19), and the RapidCheck property "a request's tokens are
// the same with and without a prefix hit": requests that share prompt prefixes, served with the
// prefix cache on and off under the same limits (chunking, page pressure, swap or recompute
// retraction, overlap drawn), give every request the same greedy tokens, and every (request,
// position) logits row both runs computed has the same digest bits. The model is
// tests/hybrid_checkpoint.h's random Bamba checkpoint on the CPU reference.
//
// It depends on the scheduler library, so the same property builds against
// lockstep_scheduler_checkpoint_planted (tests/planted/late_checkpoint.cpp: checkpoints booked one
// page late), where it must fail.
#pragma once

#include "core/model/weights.h"
#include "core/scheduler.h"

#include <rapidcheck.h>

#include <cstdint>
#include <map>
#include <optional>
#include <ostream>
#include <string>
#include <utility>
#include <vector>

namespace ls::prefix_props {

inline constexpr int32_t kVocab = 512;  // tests/hybrid_checkpoint.h's

// tests/hybrid_checkpoint.h's model (seed 19), written to a scratch directory and loaded once.
const ModelWeights& hybrid_weights();

// The limits of one served run (W = 1, L = 96).
struct HybridWorld {
  int32_t max_batch_rows = 2;
  int32_t page_size = 4;
  int32_t pages_count = 80;
  int32_t prefill_chunk_tokens = 16;
  int32_t checkpoint_slots = 4;  // mamba_slots_count − B
  int32_t host_pages_count = 0;
  bool prefix_cache = true;
  bool overlap = true;

  std::string describe() const;
};

struct ServedRun {
  std::map<RequestId, std::vector<int32_t>> tokens;
  // The digest of the logits row of each (request, position) the run computed.
  std::map<std::pair<RequestId, int32_t>, uint64_t> digests;
  int32_t prefix_hit_tokens = 0;
  int32_t swaps = 0;       // retractions by swap
  int32_t recomputes = 0;  // retractions by recompute
  std::string problem;     // a position computed twice with different bits, or broken accounting
};

ServedRun serve(const HybridWorld& world, const std::vector<RequestSpec>& requests);

// "" when the runs agree: each request's tokens, and the digest at every (request, position) both
// computed, which must include every generated token's position; else the first difference.
std::string compare_runs(const ServedRun& a, const ServedRun& b,
                         const std::vector<RequestSpec>& requests);

struct PrefixWorkload {
  HybridWorld world;
  std::vector<int32_t> shared;                 // the prefix every prompt starts with
  std::vector<std::vector<int32_t>> suffixes;  // one request each
  std::vector<int32_t> new_tokens;             // [requests]

  std::vector<RequestSpec> requests() const;
  std::string describe() const;
};

rc::Gen<PrefixWorkload> gen_prefix_workload();
void showValue(const PrefixWorkload& w, std::ostream& os);

// "" when the workload keeps the property, else what broke.
std::string tokens_same_with_and_without_hits(const PrefixWorkload& w);

// Runs the property over `cases` generated workloads (a fixed seed unless RC_PARAMS says
// otherwise); the shrunk counterexample's description when one fails, nullopt when none does.
// `hits`, when given, receives the number of cases whose cached run hit at all.
std::optional<std::string> counterexample(int cases, int* hits = nullptr);

}  // namespace ls::prefix_props
