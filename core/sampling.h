// Sampling and verification on one row of logits — the CPU reference the CUDA kernels must match.
//
// Randomness is a pure function of (request seed, position, draw index): Philox4x32-10 with the
// seed as key and (position, draw index) as counter, and our own float conversion, so the CPU and
// CUDA backends draw the same bits and no draw depends on the batch or the pool row.
// `position` is the sequence position of the token being produced (the prompt length for the first
// generated token), which — unlike the seed's vcl offset — does not change with prompt chunking.
#pragma once

#include "core/logits_digest.h"
#include "core/sampling_params.h"

#include <array>
#include <cstdint>
#include <span>
#include <vector>

namespace ls {

// Philox4x32-10 (Salmon et al., SC'11): key = (seed lo, seed hi), counter = (c0 lo, c0 hi, c1, 0).
std::array<uint32_t, 4> philox4x32_10(uint64_t key, uint64_t counter0, uint32_t counter1);

// The same generator on a full 4-word counter, as Random123 defines it (and its known answers).
std::array<uint32_t, 4> philox4x32_10_raw(std::array<uint32_t, 4> counter,
                                          std::array<uint32_t, 2> key);

// A uniform float in [0, 1) from the top 24 bits of a Philox word: exact on every platform.
float uniform_from_bits(uint32_t bits);

// The draw used for token sampling at `position` (draw_index 0) and verify coins (1, 2, ...).
float draw_uniform(uint64_t seed, int64_t position, uint32_t draw_index);

// Reused buffers so sampling allocates nothing per call once warmed up.
struct SamplingScratch {
  std::vector<float> probs;
  std::vector<int32_t> order;
};

// Steps 2-3 of the definition (core/sampling.cpp) on one row: weights[i] = w_i, the bits the
// device sampler's weights have too. Logits must be finite.
void sampling_weights(std::span<const float> logits, float temperature,
                      std::vector<float>& weights);

struct SampleOutcome {
  int32_t token = 0;
  float logprob = 0.0f;  // log of the probability the token was drawn with (0 for greedy)
};

// Greedy: argmax, lowest id on ties. Otherwise softmax(logits / T), then top-k, top-p (the
// smallest prefix of tokens sorted by (prob desc, id asc) whose mass reaches p), min-p (keep
// p >= min_p · p_max), renormalise, and invert the CDF at draw_uniform(seed, position, 0).
// Logits must be finite (the NaN guard runs first).
// `top`: the row's top logits as a recording step computed them (append_top_logits: logit
// descending, the lower id first on ties — argmax's order), or empty; a greedy row then takes
// top[0] instead of scanning the row again.
SampleOutcome sample_token(std::span<const float> logits, const ResolvedSampling& sampling,
                           int64_t position, SamplingScratch& scratch,
                           std::span<const TopLogit> top = {});

// Greedy argmax with lowest-id tie-break.
int32_t argmax_token(std::span<const float> logits);

// argmax_token(logits), read off the row's recorded top logits when there are any.
int32_t greedy_token(std::span<const float> logits, std::span<const TopLogit> top);

// Verifying one decode row of width W (seed spec §5): inputs = [t0, d1 .. d_{W-1}],
// logits = [W, V]. Writes predict[0 .. a-1] into `out_tokens` and returns a in [1, W].
struct VerifyRow {
  std::span<const float> logits;     // [W, V]
  std::span<const int32_t> inputs;   // [W]
  int32_t vocab_size = 0;
  ResolvedSampling sampling;
  int64_t first_position = 0;        // position of the token predict[0] produces
  bool force_single = false;         // accept exactly one token (dummy draft columns)
  // A recording step's top logits of the W rows (top_count each, as sample_token's `top`), or
  // empty.
  std::span<const TopLogit> top;
  int32_t top_count = 0;
};

class Verifier {
 public:
  virtual ~Verifier() = default;
  virtual int32_t verify(const VerifyRow& row, std::span<int32_t> out_tokens,
                         SamplingScratch& scratch) const = 0;
};

// Greedy rows: the longest prefix where d_i = argmax(logits_{i-1}), plus the bonus/correction.
// Stochastic rows: target-only rejection sampling with the counter-based RNG.
// W = 1 degenerates to sample_token.
class StandardVerifier final : public Verifier {
 public:
  int32_t verify(const VerifyRow& row, std::span<int32_t> out_tokens,
                 SamplingScratch& scratch) const override;
};

}  // namespace ls
