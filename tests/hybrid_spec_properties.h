// Speculative decoding on a hybrid (Mamba2 + attention) model (issue 19), and its RapidCheck
// property "greedy tokens are bit-identical with the drafter on and off": a verified decode row
// runs its W tokens through the recurrence keeping the state after each (core/limits.h
// mamba_verify_slot), commits the state after the last accepted token, and snapshots page
// boundaries by the seed's rule with a drafter; so a request served with W > 1 and a drafter of
// any acceptance emits the tokens it emits with W = 1, and every logits row of an accepted
// position is the same bits. Served through the scheduler (chunked prefill at the workload's
// chunk size, the prefix cache with its checkpoints, page pressure that retracts by recompute,
// overlap) on the CPU reference.
//
// The file depends on core and the scheduler only, so it builds against
// lockstep_scheduler_on_verify_planted (tests/planted/late_verify_state.cpp: the state one verify
// token late), where the property must fail (tests/hybrid_spec_planted_test.cpp).
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

namespace ls::hybrid_spec {

// tiny-hybrid with seeded weights (the hybrid properties' model).
const ModelWeights& tiny_hybrid_weights();

struct SpecWorld {
  int32_t max_batch_rows = 2;
  int32_t page_size = 4;
  int32_t chunk = 8;          // prefill_chunk_tokens of both runs
  int32_t verify_width = 4;   // W of the run with the drafter
  int32_t acceptance = 50;    // percent of drafts the reference drafter gets right
  bool prefix_cache = false;  // with checkpoint slots past the working ones
  bool tight_pool = false;    // pages for about one request: retraction by recompute
  bool overlap = true;

  std::string describe() const;
};

struct SpecRun {
  std::map<RequestId, std::vector<int32_t>> tokens;
  // The logits digest of every (request, position) whose logits row decided an emitted token.
  std::map<std::pair<RequestId, int32_t>, uint64_t> digests;
  int64_t prefix_hit_tokens = 0;
  int64_t retractions = 0;
  int64_t partial_rows = 0;  // verified rows that accepted fewer than W tokens
  std::string problem;       // a position computed twice with different bits, broken accounting
};

// Greedy requests (`requests`' sampling is ignored) served on `weights`: with `drafted` false
// W = 1 and no drafter; else W = world.verify_width and a drafter proposing `references` (each
// request's prompt + greedy tokens) with world.acceptance percent of its drafts right.
SpecRun serve(const ModelWeights& weights, const SpecWorld& world,
              const std::vector<RequestSpec>& requests, bool drafted,
              const std::map<RequestId, std::vector<int32_t>>& references = {});

// "" when the drafted run of `requests` gives every request the W = 1 run's tokens, and every
// position both runs computed the same logits bits; else the first difference.
std::string same_with_and_without_drafter(const ModelWeights& weights, const SpecWorld& world,
                                          const std::vector<RequestSpec>& requests,
                                          SpecRun* drafted_out = nullptr);

struct SpecWorkload {
  SpecWorld world;
  std::vector<int32_t> prompt_lengths;  // one request each
  std::vector<int32_t> shared_prefix;   // [requests] leading tokens shared with request 1's prompt
  std::vector<int32_t> new_tokens;      // [requests]
  // [requests] 0, or (requests after the first) how many of request 1's generated tokens (as W = 1
  // generates them) follow its prompt at the start of this one, so that a hit may stop at a
  // checkpoint request 1 took while decoding — with B = 1 it finishes first.
  std::vector<int32_t> follow_up;

  // Without follow-ups; `first_generated` (request 1's W = 1 tokens) supplies them.
  std::vector<RequestSpec> requests(int32_t vocab_size,
                                    const std::vector<int32_t>& first_generated = {}) const;
  std::string describe() const;
};

rc::Gen<SpecWorkload> gen_spec_workload();
void showValue(const SpecWorkload& w, std::ostream& os);

// The property on tiny-hybrid: "" when `w` keeps it, else what broke.
std::string tokens_same_with_and_without_drafter(const SpecWorkload& w);

// Runs the property over `cases` generated workloads (a fixed seed unless RC_PARAMS says
// otherwise); the shrunk counterexample's description when one fails, nullopt when none does.
std::optional<std::string> counterexample(int cases);

}  // namespace ls::hybrid_spec
