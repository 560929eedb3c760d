// The simulator's oracle-mix drafter (issue 7): it proposes the target's true continuation with a
// seeded probability p and a junk id otherwise, so a test sets the acceptance rate. The "true
// continuation" is a reference: each request's tokens (prompt + generated) from a run without
// speculative decoding, which greedy requests must reproduce token for token.
#pragma once

#include "core/drafter.h"
#include "core/model/weights.h"
#include "sim/params.h"

#include <cstdint>
#include <map>
#include <memory>
#include <vector>

namespace ls::sim {

using References = std::map<RequestId, std::vector<int32_t>>;

class OracleMixDrafter final : public Drafter {
 public:
  // `acceptance` in [0, 1]; the draws are Philox keyed by (seed, request, position, draft index).
  OracleMixDrafter(References references, double acceptance, uint64_t seed);

  // d_i = reference[position + i] with probability p, else an id that differs from it (any id
  // where the reference has ended or the request has none).
  void draft(const DraftContext& context, std::span<int32_t> drafts) const override;
  std::string name() const override;

 private:
  References references_;
  double acceptance_;
  uint64_t seed_;
};

// The greedy requests of the world's workload run once without speculative decoding (W = 1, no
// faults, no overlap) on the same model: prompt + generated tokens per request id.
References reference_continuations(const SimParams& params, const ModelWeights& weights,
                                   bool stub_model);

// The drafter a world runs with: null without speculative decoding, else the n-gram drafter or
// an oracle-mix drafter over reference_continuations().
std::unique_ptr<Drafter> make_sim_drafter(const SimParams& params, const ModelWeights& weights,
                                          bool stub_model);

}  // namespace ls::sim
