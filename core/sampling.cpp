// The sampling definition. The CUDA kernels must reproduce it bit for bit, so it is written out
// here in full and the code below follows it step by step.
//
// All arithmetic is IEEE fp32, round to nearest, without FMA contraction, in the order written.
// For one logits row l[0 .. V) and ResolvedSampling {seed, T, k, top_p, min_p}:
//
//  1. Greedy (k == 1): the token is argmax l, lowest id on ties; logprob 0. Nothing below runs.
//  2. s_i = l_i / T (a true division, not a multiply by 1/T); m = max_i s_i.
//  3. Weights w_i = e^(s_i - m), e^ as core/ops/portable_exp.h computes it (libm's expf differs
//     between the host and CUDA). The maximum's weight is exactly 1.
//  4. Order: ids sorted by (w desc, id asc). This is a strict total order, so every correct sort
//     or selection yields the same sequence o_0, o_1, ... Ties are broken on w, not on l: two
//     distinct logits can round to one weight.
//  Sums over the order are prefix(j) = w_{o_0} + ... + w_{o_j} added in blocks of 128 as
//  core/ops/order_sums.h defines (each block left to right, the blocks' sums left to right):
//  fixed fp32 operations that a device computes from the blocks' sums in parallel.
//  5. Top-k: keep o_0 .. o_{K-1}, K = min(k, V). S_k = prefix(K-1).
//  6. Top-p, only when top_p < 1: the prefix is cut to n = j + 1 for the first j with
//     prefix(j) >= top_p * S_k (one fp32 product, at most S_k, so some j reaches it). top_p == 1
//     skips the step, so rounding can never drop a token that has mass.
//  7. Min-p: keep the longest prefix of o_0 .. o_{n-1} with w_{o_j} >= min_p * w_{o_0}
//     (o_0 always stays). min_p == 0 keeps all n.
//  8. The kept ids are o_0 .. o_{n-1}; S = prefix(n-1). The filtered distribution is
//     q(t) = w_t / S (one fp32 division) for a kept t, and 0 for any other t.
//  9. Inverting the CDF at u in [0, 1): target = u * S; the token is o_j for the first j < n with
//     prefix(j) > target, or, should none qualify, the last kept id. sample_token uses
//     u = draw_uniform(seed, position, 0); its logprob is logf(w_t / S).
//
// Verify, stochastic rows (target-only rejection sampling, seed spec §5). Row i of the logits
// (i = 0 .. W-1) predicts position c + i, c = first_position, inputs = [t0, d_1 .. d_{W-1}],
// and q_i is row i's filtered distribution (steps 2-8). For i = 1 .. W-1 in order:
//    coin = draw_uniform(seed, c + i - 1, 1); d_i is accepted iff q_{i-1}(d_i) > 0 and
//    coin <= q_{i-1}(d_i); then out[i-1] = d_i. At the first rejection, out[i-1] is step 9 on
//    q_{i-1} with d_i skipped — its weight taken as 0 in S and every prefix, and never the
//    token (nor the last kept id the walk falls back on) — at
//    u = draw_uniform(seed, c + i - 1, 2), and a = i.
// If every draft is accepted, out[W-1] = sample_token(row W-1, position c + W - 1) and a = W.
// The q > 0 condition departs from the seed's bare `coin <= q`: the coin can be exactly 0, and
// `0 <= 0` would accept a token the filters removed.
#include "core/sampling.h"

#include "core/check.h"
#include "core/ops/order_sums.h"
#include "core/ops/philox.h"
#include "core/ops/portable_exp.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>

namespace ls {

namespace {

using ops::kDrawCoin;
using ops::kDrawCorrection;
using ops::kDrawSample;

constexpr int32_t kNoToken = -1;

// Step 4's order: weight descending, then id ascending.
bool precedes(std::span<const float> weights, int32_t a, int32_t b) {
  return weights[a] > weights[b] || (weights[a] == weights[b] && a < b);
}

// The ordered weights w(j) = w_{o_j} of `ids` (a prefix of step 4's order) and their blocks'
// sums, for core/ops/order_sums.h; the device reads the same sums precomputed.
struct OrderedWeights {
  std::span<const float> weights;
  std::span<const int32_t> ids;

  float operator()(int32_t j) const { return weights[ids[static_cast<size_t>(j)]]; }
  float block(int32_t c) const {
    const int32_t first = c * ops::kOrderSumBlock;
    return ops::order_part(*this, first, first + ops::kOrderSumBlock - 1, ops::kNoSkip);
  }
  auto blocks() const {
    return [this](int32_t c) { return block(c); };
  }
  int32_t size() const { return static_cast<int32_t>(ids.size()); }
  ops::OrderPrefix reaching(float x, bool strictly, int32_t skip) const {
    return ops::order_prefix_reaching(*this, blocks(), size(), x, strictly, skip);
  }
  float sum(int32_t skip) const { return ops::order_prefix_sum(*this, blocks(), size(), skip); }
};

// Step 8's q: borrows the scratch buffers, so it is valid until the scratch is used again.
struct FilteredDistribution {
  std::span<const float> weights;  // [V] w by token id
  std::span<const int32_t> kept;   // [n] kept ids in step 4's order, n >= 1
  float kept_sum = 0.0f;           // S

  // The kept ids are a prefix of a total order, so membership is one comparison with the last.
  bool contains(int32_t token) const {
    const int32_t last = kept.back();
    return token == last || precedes(weights, token, last);
  }
  float probability(int32_t token) const {
    return contains(token) ? weights[token] / kept_sum : 0.0f;
  }
};

void assert_stochastic(const ResolvedSampling& sampling) {
  LS_ASSERT(std::isfinite(sampling.temperature), "temperature {}", sampling.temperature);
  LS_ASSERT(sampling.temperature > 0.0f, "temperature {}", sampling.temperature);
  LS_ASSERT(sampling.top_k >= 1, "top_k {}", sampling.top_k);
  LS_ASSERT(sampling.top_p > 0.0f, "top_p {}", sampling.top_p);
  LS_ASSERT(sampling.top_p <= 1.0f, "top_p {}", sampling.top_p);
  LS_ASSERT(sampling.min_p >= 0.0f, "min_p {}", sampling.min_p);
  LS_ASSERT(sampling.min_p <= 1.0f, "min_p {}", sampling.min_p);
}


// Steps 4-5: the first K ids of the order, sorted.
std::span<const int32_t> order_top_k(std::span<const float> weights, int32_t top_k,
                                     std::vector<int32_t>& order) {
  const size_t vocab = weights.size();
  const size_t k = std::min(static_cast<size_t>(top_k), vocab);
  order.resize(vocab);
  std::iota(order.begin(), order.end(), 0);
  const auto by_weight = [weights](int32_t a, int32_t b) { return precedes(weights, a, b); };
  const auto kth = order.begin() + static_cast<std::ptrdiff_t>(k);
  if (k < vocab) {
    // Select, then sort only k ids: O(V + k log k). The order is total, so the prefix is
    // exactly that of a full sort.
    std::nth_element(order.begin(), kth, order.end(), by_weight);
  }
  std::sort(order.begin(), kth, by_weight);
  return {order.data(), k};
}

// Step 6: how many of the ordered ids top-p keeps.
size_t top_p_count(std::span<const float> weights, std::span<const int32_t> ordered,
                   float top_p) {
  if (top_p >= 1.0f) return ordered.size();
  const OrderedWeights w{weights, ordered};
  const ops::OrderPrefix cut = w.reaching(top_p * w.sum(ops::kNoSkip), false, ops::kNoSkip);
  LS_ASSERT(cut.index < w.size(), "top_p {} of S_k reached by no prefix", top_p);
  return static_cast<size_t>(cut.index) + 1;
}

// Step 7: how many of the ordered ids min-p keeps.
size_t min_p_count(std::span<const float> weights, std::span<const int32_t> ordered,
                   float min_p) {
  const OrderedWeights w{weights, ordered};
  return static_cast<size_t>(ops::order_count_at_least(w, w.size(), min_p * w(0)));
}

// Steps 2-8 on one logits row, for sample_token and verify alike.
FilteredDistribution filter_distribution(std::span<const float> logits,
                                         const ResolvedSampling& sampling,
                                         SamplingScratch& scratch) {
  LS_ASSERT(!logits.empty());
  LS_ASSERT(logits.size() <= static_cast<size_t>(std::numeric_limits<int32_t>::max()),
            "vocabulary of {} tokens", logits.size());
  assert_stochastic(sampling);
  sampling_weights(logits, sampling.temperature, scratch.probs);
  const std::span<const float> weights(scratch.probs);
  std::span<const int32_t> kept = order_top_k(weights, sampling.top_k, scratch.order);
  kept = kept.first(top_p_count(weights, kept, sampling.top_p));
  kept = kept.first(min_p_count(weights, kept, sampling.min_p));
  return {weights, kept, OrderedWeights{weights, kept}.sum(ops::kNoSkip)};
}

// Step 9, with `skipped` (or kNoToken) left out of the distribution.
int32_t invert_cdf(const FilteredDistribution& q, float u, int32_t skipped) {
  const OrderedWeights w{q.weights, q.kept};
  const auto at = std::find(q.kept.begin(), q.kept.end(), skipped);
  const int32_t skip =
      at == q.kept.end() ? ops::kNoSkip : static_cast<int32_t>(at - q.kept.begin());
  const float total = skip == ops::kNoSkip ? q.kept_sum : w.sum(skip);
  // The skipped position adds 0, so it never raises the prefix past the target first.
  const ops::OrderPrefix hit = w.reaching(u * total, true, skip);
  LS_ASSERT(hit.index != skip, "the skipped position {} reached the target", skip);
  if (hit.index < w.size()) return q.kept[static_cast<size_t>(hit.index)];
  const int32_t last = w.size() - 1 == skip ? w.size() - 2 : w.size() - 1;
  LS_ASSERT(last >= 0, "no token left to sample once {} is removed", skipped);
  return q.kept[static_cast<size_t>(last)];
}

bool accepts(const FilteredDistribution& q, int32_t draft, float coin) {
  const float probability = q.probability(draft);
  return probability > 0.0f && coin <= probability;
}

std::span<const float> row_logits(const VerifyRow& row, int32_t i) {
  const size_t vocab = static_cast<size_t>(row.vocab_size);
  return row.logits.subspan(static_cast<size_t>(i) * vocab, vocab);
}

std::span<const TopLogit> row_top(const VerifyRow& row, int32_t i) {
  if (row.top.empty()) return {};
  const size_t count = static_cast<size_t>(row.top_count);
  return row.top.subspan(static_cast<size_t>(i) * count, count);
}

void assert_row_shape(const VerifyRow& row, std::span<const int32_t> out_tokens) {
  const size_t width = row.inputs.size();
  LS_ASSERT(width >= 1);
  LS_ASSERT(width <= static_cast<size_t>(std::numeric_limits<int32_t>::max()), "width {}", width);
  LS_ASSERT(row.vocab_size >= 1, "vocab_size {}", row.vocab_size);
  LS_ASSERT(row.logits.size() == width * static_cast<size_t>(row.vocab_size),
            "logits hold {} values for width {} and vocab_size {}", row.logits.size(), width,
            row.vocab_size);
  LS_ASSERT(out_tokens.size() >= width, "out_tokens holds {} for width {}", out_tokens.size(),
            width);
}

// out[i] = p_i for as long as the draft d_{i+1} equals p_i; the first mismatch (or the end of
// the row) makes p_i the correction (or bonus) token.
int32_t verify_greedy(const VerifyRow& row, std::span<int32_t> out_tokens) {
  const int32_t width = static_cast<int32_t>(row.inputs.size());
  int32_t i = 0;
  out_tokens[0] = greedy_token(row_logits(row, 0), row_top(row, 0));
  while (i + 1 < width && row.inputs[i + 1] == out_tokens[i]) {
    ++i;
    out_tokens[i] = greedy_token(row_logits(row, i), row_top(row, i));
  }
  return i + 1;
}

int32_t verify_stochastic(const VerifyRow& row, std::span<int32_t> out_tokens,
                          SamplingScratch& scratch) {
  const int32_t width = static_cast<int32_t>(row.inputs.size());
  const ResolvedSampling& sampling = row.sampling;
  for (int32_t i = 1; i < width; ++i) {
    const int32_t draft = row.inputs[i];
    LS_ASSERT(draft >= 0, "draft {} at column {}", draft, i);
    LS_ASSERT(draft < row.vocab_size, "draft {} at column {} of vocab {}", draft, i,
              row.vocab_size);
    const int64_t position = row.first_position + i - 1;
    const FilteredDistribution q = filter_distribution(row_logits(row, i - 1), sampling, scratch);
    if (accepts(q, draft, draw_uniform(sampling.seed, position, kDrawCoin))) {
      out_tokens[i - 1] = draft;
      continue;
    }
    out_tokens[i - 1] =
        invert_cdf(q, draw_uniform(sampling.seed, position, kDrawCorrection), draft);
    return i;
  }
  const int32_t last = width - 1;
  out_tokens[last] = sample_token(row_logits(row, last), sampling, row.first_position + last,
                                  scratch, row_top(row, last))
                         .token;
  return width;
}

}  // namespace

void sampling_weights(std::span<const float> logits, float temperature,
                      std::vector<float>& weights) {
  weights.resize(logits.size());
  float scaled_max = -std::numeric_limits<float>::infinity();
  bool all_finite = true;
  for (size_t i = 0; i < logits.size(); ++i) {
    const float scaled = logits[i] / temperature;
    all_finite = all_finite && std::isfinite(scaled);
    scaled_max = std::max(scaled_max, scaled);
    weights[i] = scaled;
  }
  // A non-finite value would break the sort's ordering; the NaN guard should have caught it.
  LS_ASSERT(all_finite, "logits / temperature {} has a non-finite value", temperature);
  for (float& weight : weights) weight = ops::portable_exp(weight - scaled_max);
}

std::array<uint32_t, 4> philox4x32_10_raw(std::array<uint32_t, 4> counter,
                                          std::array<uint32_t, 2> key) {
  const ops::PhiloxBlock out = ops::philox4x32_10({{counter[0], counter[1], counter[2], counter[3]}},
                                                  {{key[0], key[1]}});
  return {out.word[0], out.word[1], out.word[2], out.word[3]};
}

std::array<uint32_t, 4> philox4x32_10(uint64_t key, uint64_t counter0, uint32_t counter1) {
  return philox4x32_10_raw(
      {static_cast<uint32_t>(counter0), static_cast<uint32_t>(counter0 >> 32), counter1, 0},
      {static_cast<uint32_t>(key), static_cast<uint32_t>(key >> 32)});
}

float uniform_from_bits(uint32_t bits) { return ops::uniform_from_bits(bits); }

float draw_uniform(uint64_t seed, int64_t position, uint32_t draw_index) {
  LS_ASSERT(position >= 0, "position {}", position);
  return ops::draw_uniform(seed, position, draw_index);
}

int32_t argmax_token(std::span<const float> logits) {
  LS_ASSERT(!logits.empty());
  size_t best = 0;
  for (size_t i = 1; i < logits.size(); ++i) {
    if (logits[i] > logits[best]) best = i;  // strict: the lowest id wins a tie
  }
  return static_cast<int32_t>(best);
}

int32_t greedy_token(std::span<const float> logits, std::span<const TopLogit> top) {
  return top.empty() ? argmax_token(logits) : top.front().id;
}

SampleOutcome sample_token(std::span<const float> logits, const ResolvedSampling& sampling,
                           int64_t position, SamplingScratch& scratch,
                           std::span<const TopLogit> top) {
  if (sampling.top_k == 1) return {greedy_token(logits, top), 0.0f};
  const FilteredDistribution q = filter_distribution(logits, sampling, scratch);
  const int32_t token = invert_cdf(q, draw_uniform(sampling.seed, position, kDrawSample), kNoToken);
  return {token, std::log(q.weights[token] / q.kept_sum)};
}

int32_t StandardVerifier::verify(const VerifyRow& row, std::span<int32_t> out_tokens,
                                 SamplingScratch& scratch) const {
  assert_row_shape(row, out_tokens);
  if (row.force_single || row.inputs.size() == 1) {
    out_tokens[0] = sample_token(row_logits(row, 0), row.sampling, row.first_position, scratch,
                                 row_top(row, 0))
                        .token;
    return 1;
  }
  if (row.sampling.top_k == 1) return verify_greedy(row, out_tokens);
  return verify_stochastic(row, out_tokens, scratch);
}

}  // namespace ls
