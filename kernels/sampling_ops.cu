// Compiled with --fmad=false: core/sampling.cpp's definition is IEEE fp32 without contraction.
#include "kernels/sampling_ops.h"

#include "core/ops/context_clamp.h"
#include "core/ops/order_sums.h"
#include "core/ops/philox.h"
#include "core/ops/portable_exp.h"
#include "kernels/record_state.cuh"
#include "kernels/reduce.cuh"

#include <algorithm>

namespace ls::kernels {

namespace {

using ops::kDrawCoin;
using ops::kDrawCorrection;
using ops::kDrawSample;
constexpr int32_t kNoToken = -1;

__device__ float draw_uniform(const SamplingRow& s, int64_t position, uint32_t draw) {
  return ops::draw_uniform((uint64_t{s.seed_hi} << 32) | s.seed_lo, position, draw);
}

// A row's keys (sampling_ops.h): the weight's bits above the id's complement.
struct KeyCodec {
  int32_t id_bits;

  __device__ explicit KeyCodec(int32_t vocab) : id_bits(sampling_key_id_bits(vocab)) {}
  __device__ uint64_t mask() const { return (uint64_t{1} << id_bits) - 1; }
  __device__ uint64_t key(float w, int32_t id) const {
    return (uint64_t{__float_as_uint(w)} << id_bits) | (mask() - static_cast<uint64_t>(id));
  }
  __device__ float weight(uint64_t key) const {
    return __uint_as_float(static_cast<uint32_t>(key >> id_bits));
  }
  __device__ int32_t id(uint64_t key) const {
    return static_cast<int32_t>(mask() - (key & mask()));
  }
};

__device__ int32_t op_row_of(const StepHeader& h, int32_t logits_row) {
  const int32_t ne = h.prefill_rows_count;
  return logits_row < ne ? logits_row : ne + (logits_row - ne) / h.verify_width;
}

constexpr int32_t kWeightThreads = 1024;
constexpr int32_t kWeightBlocksMax = 128;  // a row's blocks share about this many (H200: 132 SMs)
constexpr int32_t kWeightChunksMax = 16;   // the most blocks one row's weights are split over

// grid: (logits rows, chunks of a row's ids). Each block finds its row's maximum (the whole row,
// read again from the L2 by each of the row's blocks: a maximum is exact, so every block finds the
// same) and writes its chunk's keys: a row's fp64 exponentials spread over several SMs.
__global__ void __launch_bounds__(kWeightThreads)
sampling_weights_kernel(StepInputs in, const float* logits, int32_t vocab, SamplingKeys keys) {
  __shared__ float scratch[32];
  const StepHeader& h = *in.header;
  const int32_t r = blockIdx.x;
  if (r >= h.logits_rows_count) return;
  const SamplingRow s = in.sampling[op_row_of(h, r)];
  if (s.top_k == 1) return;
  const float* row = logits + int64_t{r} * vocab;
  float m = -INFINITY;
  for (int32_t i = threadIdx.x; i < vocab; i += blockDim.x) m = fmaxf(m, row[i] / s.temperature);
  m = block_max(m, scratch);
  uint64_t* out = keys.keys + int64_t{r} * vocab;
  const KeyCodec codec(vocab);
  const int32_t chunks = static_cast<int32_t>(gridDim.y), piece = static_cast<int32_t>(blockIdx.y);
  const int32_t chunk = (vocab + chunks - 1) / chunks;
  const int32_t end = min(vocab, (piece + 1) * chunk);
  for (int32_t i = piece * chunk + static_cast<int32_t>(threadIdx.x); i < end; i += blockDim.x) {
    out[i] = codec.key(ops::portable_exp(row[i] / s.temperature - m), i);
  }
}

constexpr int32_t kBlockSumThreads = 1024;

// grid: logits rows. The threads of a stochastic row's block sum its order blocks left to right
// (B_c of core/ops/order_sums.h, one block a thread at a time); then thread 0 chains them into P_c,
// left to right from 0 — the additions order_prefix_reaching makes, once for every query.
__global__ void __launch_bounds__(kBlockSumThreads)
sampling_block_sums_kernel(StepInputs in, int32_t vocab, SamplingKeys keys) {
  const StepHeader& h = *in.header;
  const int32_t r = blockIdx.x;
  if (r >= h.logits_rows_count || in.sampling[op_row_of(h, r)].top_k == 1) return;
  const int32_t blocks = ops::order_sum_blocks(vocab);
  const uint64_t* sorted = keys.sorted_keys + int64_t{r} * vocab;
  float* sums = keys.block_sums + int64_t{r} * ops::order_sum_stride(vocab);
  float* prefixes = keys.block_prefixes + int64_t{r} * ops::order_sum_stride(vocab);
  const KeyCodec codec(vocab);
  const auto w = [sorted, codec](int32_t j) { return codec.weight(sorted[j]); };
  for (int32_t c = threadIdx.x; c < blocks; c += blockDim.x) {
    const int32_t first = c * ops::kOrderSumBlock;
    sums[c] = ops::order_part(w, first, min(first + ops::kOrderSumBlock, vocab) - 1, ops::kNoSkip);
  }
  __syncthreads();  // every B_c written, and visible to the block
  if (threadIdx.x != 0) return;
  float before = 0.0f;
  prefixes[0] = before;
  for (int32_t c = 0; c < blocks; ++c) prefixes[c + 1] = before = ops::add_rn(before, sums[c]);
}

// One row's weights in step 4's order and their blocks' sums, for core/ops/order_sums.h.
struct DeviceOrder {
  const uint64_t* sorted;    // [vocab] keys in step 4's order
  const float* blocks;       // [order_sum_blocks(vocab)] B_c
  const float* prefixes;     // [order_sum_blocks(vocab) + 1] P_c
  KeyCodec codec;

  __device__ float operator()(int32_t j) const { return codec.weight(sorted[j]); }
  // order_prefix_reaching's answer. With nothing skipped, by a binary search over the P_c
  // computed once (sampling_block_sums_kernel); a skip changes every P after its block: then the
  // blocks are chained one by one, as the definition reads.
  __device__ ops::OrderPrefix reaching(int32_t n, float x, bool strictly, int32_t skip) const {
    if (skip == ops::kNoSkip) {
      const float* p = prefixes;
      return ops::order_prefix_searched(*this, [p](int32_t c) { return p[c]; }, n, x, strictly);
    }
    const float* b = blocks;
    return ops::order_prefix_reaching(*this, [b](int32_t c) { return b[c]; }, n, x, strictly,
                                      skip);
  }
  __device__ float sum(int32_t n, int32_t skip) const {
    return reaching(n, __builtin_huge_valf(), false, skip).value;  // nothing reaches +inf
  }
};

// Steps 5–8 on one sorted row: the kept prefix and its sum S.
struct Filtered {
  const uint64_t* by_id;   // [vocab] keys by id
  DeviceOrder order;
  int32_t kept;            // n >= 1
  float kept_sum;          // S

  __device__ bool contains(int32_t token) const {
    return by_id[token] >= order.sorted[kept - 1];  // distinct keys: the kept set is a prefix
  }
  // Where a kept token stands in the order: how many keys precede its own (binary search).
  __device__ int32_t position(int32_t token) const {
    const uint64_t key = by_id[token];
    int32_t low = 0, high = kept - 1;
    while (low < high) {
      const int32_t mid = low + (high - low) / 2;
      if (order.sorted[mid] > key) {
        low = mid + 1;
      } else {
        high = mid;
      }
    }
    return low;
  }
  __device__ float probability(int32_t token) const {
    return contains(token) ? order.codec.weight(by_id[token]) / kept_sum : 0.0f;
  }
};

__device__ Filtered filter(const FinishArgs& a, int32_t logits_row, const SamplingRow& s) {
  const int64_t base = int64_t{logits_row} * a.vocab;
  const int64_t sums = int64_t{logits_row} * ops::order_sum_stride(a.vocab);
  const DeviceOrder order{a.keys.sorted_keys + base, a.keys.block_sums + sums,
                          a.keys.block_prefixes + sums, KeyCodec(a.vocab)};
  Filtered q{a.keys.keys + base, order, 0, 0.0f};
  const int32_t k = min(s.top_k, a.vocab);
  int32_t n = k;
  if (s.top_p < 1.0f) {  // top_p · S_k <= S_k: some prefix reaches it
    n = min(order.reaching(k, s.top_p * order.sum(k, ops::kNoSkip), false, ops::kNoSkip).index + 1,
            k);
  }
  q.kept = ops::order_count_at_least(order, n, s.min_p * order(0));
  q.kept_sum = order.sum(q.kept, ops::kNoSkip);
  return q;
}

__device__ int32_t invert_cdf(const Filtered& q, float u, int32_t skipped) {
  const int32_t skip =
      skipped != kNoToken && q.contains(skipped) ? q.position(skipped) : ops::kNoSkip;
  const float total = skip == ops::kNoSkip ? q.kept_sum : q.order.sum(q.kept, skip);
  // The skipped position adds 0, so it never raises the prefix past the target first.
  const int32_t hit = q.order.reaching(q.kept, u * total, true, skip).index;
  if (hit < q.kept) return q.order.codec.id(q.order.sorted[hit]);
  const int32_t last = q.kept - 1 == skip ? q.kept - 2 : q.kept - 1;
  return last >= 0 ? q.order.codec.id(q.order.sorted[last]) : kNoToken;
}

__device__ int32_t sample_token(const FinishArgs& a, int32_t logits_row, const SamplingRow& s,
                                int64_t position) {
  if (s.top_k == 1) return a.argmax[logits_row];
  const Filtered q = filter(a, logits_row, s);
  return invert_cdf(q, draw_uniform(s, position, kDrawSample), kNoToken);
}

// Returns a in [1, W]; writes out[0 .. a-1]. inputs = [t0, d1 .. d_{W-1}].
__device__ int32_t verify_row(const FinishArgs& a, int32_t first_logits, const int32_t* inputs,
                              int32_t w, const SamplingRow& s, int64_t first_position,
                              bool force_single, int32_t* out) {
  if (force_single || w == 1) {
    out[0] = sample_token(a, first_logits, s, first_position);
    return 1;
  }
  if (s.top_k == 1) {
    int32_t i = 0;
    out[0] = a.argmax[first_logits];
    while (i + 1 < w && inputs[i + 1] == out[i]) {
      ++i;
      out[i] = a.argmax[first_logits + i];
    }
    return i + 1;
  }
  for (int32_t i = 1; i < w; ++i) {
    const int32_t draft = inputs[i];
    const int64_t position = first_position + i - 1;
    const Filtered q = filter(a, first_logits + i - 1, s);
    const float probability = q.probability(draft);
    if (probability > 0.0f && draw_uniform(s, position, kDrawCoin) <= probability) {
      out[i - 1] = draft;
      continue;
    }
    out[i - 1] = invert_cdf(q, draw_uniform(s, position, kDrawCorrection), draft);
    return i;
  }
  out[w - 1] = sample_token(a, first_logits + w - 1, s, first_position + w - 1);
  return w;
}

// Rules 6–9 for one op row, on one thread: the order is sorted and its blocks summed already, so
// each of the definition's sums is a binary search over the P_c and at most one block's walk.
__device__ void finish_row(const FinishArgs& a, int32_t row) {
  const StepHeader& h = *a.in.header;
  const int32_t ne = h.prefill_rows_count;
  const int32_t w = h.verify_width;
  const int32_t p = a.in.pool_rows[row];
  const SamplingRow s = a.in.sampling[row];
  const DeviceState& st = a.state;
  int32_t first = row;
  int32_t count = 1;
  if (row < ne) {
    const int32_t length = a.in.input_lengths[row];
    const int64_t position = int64_t{a.in.prefill_prefix[row]} + length;
    const int32_t token = sample_token(a, row, s, position);
    a.out.tokens[row] = token;
    a.out.accepted_lengths[row] = 1;
    st.future_inputs[int64_t{p} * w] = token;
    st.vcl[p] += length;
  } else {
    first = ne + (row - ne) * w;
    count = w;
    const int32_t vcl_old = st.vcl_before[row];
    int32_t* out = a.out.tokens + first;
    const int32_t accepted =
        verify_row(a, first, a.input_ids + a.in.token_offsets[row], w, s, int64_t{vcl_old} + 1,
                   a.in.force_single[row - ne] != 0, out);
    // Rule 7, the context clamp.
    const int32_t clamped = ops::clamp_accepted_to_context(accepted, vcl_old, st.context_length);
    // Next round's input is read before the result's tail is zeroed: with a' = 0 it is predict[0]
    // (the seed's dummy index clamp(a, 1, N)), exactly as the CPU reference's commit.
    const int32_t last = min(max(out[max(clamped, 1) - 1], 0), st.vocab_size - 1);
    for (int32_t i = clamped; i < w; ++i) out[i] = 0;
    a.out.accepted_lengths[row] = clamped;
    for (int32_t i = 0; i < w; ++i) st.future_inputs[int64_t{p} * w + i] = last;
    st.vcl[p] += clamped;
  }
  // The fault site's forced ids, then the OOV flag and the output clamp (rule 9).
  for (int32_t f = 0; f < h.forced_count; ++f) {
    const int32_t index = a.in.forced_outputs[2 * f];
    if (index >= first && index < first + count) a.out.tokens[index] = a.in.forced_outputs[2 * f + 1];
  }
  int32_t oov = 0;
  int32_t nan = 0;
  for (int32_t i = first; i < first + count; ++i) {
    const int32_t token = a.out.tokens[i];
    if (token < 0 || token >= a.vocab) {
      oov = 1;
      a.out.tokens[i] = min(max(token, 0), a.vocab - 1);
    }
    nan |= a.row_nan_flags[i];
    if (h.want_logprobs) {
      a.out.logprobs[i] = a.logits[int64_t{i} * a.vocab + a.out.tokens[i]] - a.row_max[i] -
                          logf(a.row_sum[i]);
    }
  }
  a.out.oov_flags[row] = oov;
  a.out.nan_flags[row] = nan;
}

// One warp per op row: lane 0 finishes it; then, recording, the warp snapshots its state.
__global__ void finish_rows_kernel(FinishArgs a) {
  const int32_t row = blockIdx.x;
  if (row >= a.in.header->rows_count) return;
  if (threadIdx.x == 0) finish_row(a, row);
  if (a.snapshot.vcl == nullptr) return;
  __syncwarp();  // lane 0's commit (vcl, future inputs) before the copy
  snapshot_row(a.in, a.state, a.snapshot, row, 32);
}

}  // namespace

cudaError_t launch_sampling_weights(StepInputs in, const float* logits, int32_t rows_grid,
                                    int32_t vocab, SamplingKeys keys, cudaStream_t stream) {
  if (rows_grid < 0 || vocab < 1 || logits == nullptr || keys.keys == nullptr) {
    return cudaErrorInvalidValue;
  }
  if (rows_grid == 0) return cudaSuccess;
  const int32_t chunks = std::clamp(kWeightBlocksMax / rows_grid, 1, kWeightChunksMax);
  sampling_weights_kernel<<<dim3(rows_grid, chunks), kWeightThreads, 0, stream>>>(in, logits,
                                                                                  vocab, keys);
  return cudaGetLastError();
}

cudaError_t launch_sampling_block_sums(StepInputs in, int32_t rows_grid, int32_t vocab,
                                       SamplingKeys keys, cudaStream_t stream) {
  if (rows_grid < 0 || vocab < 1 || keys.sorted_keys == nullptr || keys.block_sums == nullptr ||
      keys.block_prefixes == nullptr) {
    return cudaErrorInvalidValue;
  }
  if (rows_grid == 0) return cudaSuccess;
  sampling_block_sums_kernel<<<rows_grid, kBlockSumThreads, 0, stream>>>(in, vocab, keys);
  return cudaGetLastError();
}

cudaError_t launch_finish_rows(const FinishArgs& args, int32_t rows_grid, cudaStream_t stream) {
  if (rows_grid < 0 || args.vocab < 1 || args.logits == nullptr || args.argmax == nullptr ||
      args.row_nan_flags == nullptr || args.input_ids == nullptr) {
    return cudaErrorInvalidValue;
  }
  if (rows_grid == 0) return cudaSuccess;
  finish_rows_kernel<<<rows_grid, 32, 0, stream>>>(args);
  return cudaGetLastError();
}

}  // namespace ls::kernels
