// The decode kernels' combine: a token's split partials ([m, l, acc[head_dim]] each, partial_at)
// merged in split order into its attention output. Included by attention.cu only.
//
// One merge, two ways of reading it, the same bits:
//  * Up to kCombineHeldSplits splits (context 2,048 at 128-key splits: every decode step of the
//    figures, at any batch), each thread loads every split's m and l beside its own elements, all
//    in flight at once, and merges them in registers: after the launch's wait one round trip to
//    the L2 for the position and one for the partials, no barrier. Every thread computes the same
//    maximum, weights and weight sum in the same order as the shared-memory form's thread 0.
//  * Beyond, the threads share the work of the maxima and weights through shared memory (each
//    thread would otherwise compute e^x for every split: thousands at long contexts).
//
// The merge: m = max_k m_k (exact in any order), w_k = e^(m_k − m), l = Σ_k l_k·w_k in split
// order (each product rounded on its own, as when it went through shared memory), out_i = (Σ_k
// acc_k,i · w_k in split order) / l.
#pragma once

namespace ls::kernels {
namespace {

constexpr int32_t kCombineHeldSplits = 16;

// Element `i` of the merge of `splits` (≤ kCombineHeldSplits) partials, part(k) being split k's.
template <typename Part>
__device__ __forceinline__ float merge_held(const Part& part, int32_t splits, int32_t i) {
  float m_k[kCombineHeldSplits], l_k[kCombineHeldSplits], x_k[kCombineHeldSplits];
#pragma unroll
  for (int32_t k = 0; k < kCombineHeldSplits; ++k) {
    if (k < splits) {
      const float* p = part(k);
      m_k[k] = p[0], l_k[k] = p[1], x_k[k] = p[2 + i];
    }
  }
  float m = -INFINITY;
#pragma unroll
  for (int32_t k = 0; k < kCombineHeldSplits; ++k) {
    if (k < splits) m = fmaxf(m, m_k[k]);
  }
  float l = 0.0f, acc = 0.0f;
#pragma unroll
  for (int32_t k = 0; k < kCombineHeldSplits; ++k) {
    if (k < splits) {
      const float w = expf(m_k[k] - m);
      l += __fmul_rn(l_k[k], w);
      acc += x_k[k] * w;
    }
  }
  return acc / l;
}

// grid: (query heads, tokens of the chunk); 128 threads.
template <typename T>
__global__ void attention_combine_kernel(AttentionArgs<T> a) {
  extern __shared__ float combine_shared[];  // [splits] weights, then [splits] weighted l
  __shared__ float scratch[32];
  __shared__ float l_total;
  allow_successor();
  wait_for_predecessor();
  const AttentionShape& s = a.shape;
  const int32_t local_token = blockIdx.y;
  const int32_t token = a.token_begin + local_token;
  const int32_t head = blockIdx.x;
  const int32_t d = s.head_dim;
  const int32_t keys = min(a.positions[token], s.positions_count - 1) + 1;
  const int32_t splits = (keys + kAttentionSplitKeys - 1) / kAttentionSplitKeys;
  if (splits == 1) return;  // written directly by the split kernel
  const int32_t total_splits = (s.positions_count + kAttentionSplitKeys - 1) / kAttentionSplitKeys;
  const auto part = [&](int32_t k) {
    return partial_at(a.workspace, local_token, head, k, s.query_heads, total_splits, d);
  };
  T* out = a.out + int64_t{token} * s.query_heads * d + head * d;
  if (splits <= kCombineHeldSplits) {
    for (int32_t i = threadIdx.x; i < d; i += blockDim.x) store(out + i, merge_held(part, splits, i));
    return;
  }
  float* weights = combine_shared;
  float* weighted_l = combine_shared + total_splits;
  float m = -INFINITY;
  for (int32_t k = threadIdx.x; k < splits; k += blockDim.x) m = fmaxf(m, part(k)[0]);
  m = block_max(m, scratch);
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
    store(out + i, acc / l_total);
  }
}

}  // namespace
}  // namespace ls::kernels
