// The decode attention's combine: merges the split kernels' partials of a token, in split order,
// into its output. Included by attention.cu only (its AttentionArgs and partial layout).
#pragma once

namespace ls::kernels {
namespace {

// grid: (query heads, tokens of the chunk). Merges a token's partials in split order: the splits'
// maxima and weights are read in parallel into shared memory, then each thread sums its elements
// over the splits in order (loads unrolled so they are in flight together).
template <typename T>
__global__ void attention_combine_kernel(AttentionArgs<T> a) {
  extern __shared__ float combine_shared[];  // [splits] weights, then [splits] weighted l
  __shared__ float scratch[32];
  __shared__ float l_total;
  allow_successor();
  // The token's split count before the wait: its position is a step input, final before the
  // predecessor started (kernels/launch.cuh).
  const AttentionShape& s = a.shape;
  const int32_t local_token = blockIdx.y;
  const int32_t token = a.token_begin + local_token;
  const int32_t head = blockIdx.x;
  const int32_t d = s.head_dim;
  const int32_t keys = min(a.positions[token], s.positions_count - 1) + 1;
  const int32_t splits = (keys + kAttentionSplitKeys - 1) / kAttentionSplitKeys;
  wait_for_predecessor();
  if (splits == 1) return;  // written directly by the split kernel
  const int32_t total_splits = (s.positions_count + kAttentionSplitKeys - 1) / kAttentionSplitKeys;
  const auto part = [&](int32_t k) {
    return partial_at(a.workspace, local_token, head, k, s.query_heads, total_splits, d);
  };
  float* weights = combine_shared;
  float* weighted_l = combine_shared + total_splits;
  float m = -INFINITY;
  for (int32_t k = threadIdx.x; k < splits; k += blockDim.x) m = fmaxf(m, part(k)[0]);
  m = block_max(m, scratch);  // a maximum: exact in any order
  for (int32_t k = threadIdx.x; k < splits; k += blockDim.x) {
    const float* p = part(k);
    weights[k] = expf(p[0] - m);
    weighted_l[k] = p[1] * weights[k];
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    float l = 0.0f;
    for (int32_t k = 0; k < splits; ++k) l += weighted_l[k];
    l_total = l;
  }
  __syncthreads();
  for (int32_t i = threadIdx.x; i < d; i += blockDim.x) {
    float acc = 0.0f;
#pragma unroll 8
    for (int32_t k = 0; k < splits; ++k) acc += part(k)[2 + i] * weights[k];
    store(a.out + int64_t{token} * s.query_heads * d + head * d + i, acc / l_total);
  }
}

}  // namespace
}  // namespace ls::kernels
