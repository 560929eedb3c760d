#include "kernels/attention.h"

#include "kernels/reduce.cuh"

#include <algorithm>

namespace ls::kernels {

namespace {

using bf16 = __nv_bfloat16;

constexpr int32_t kThreads = 128;
constexpr int32_t kWarps = kThreads / 32;
constexpr int32_t kSplitLanesMax = 16;  // blocks per (token, kv head); each walks splits x, x+16..
constexpr int32_t kGroupMax = 16;       // query heads per KV head
constexpr int32_t kHeadDimMax = 256;

int32_t splits_max(const AttentionShape& s) {
  return (s.positions_count + kAttentionSplitKeys - 1) / kAttentionSplitKeys;
}

// Partial layout per (token, query head, split): [m, l, acc[head_dim]].
__device__ __forceinline__ float* partial_at(float* workspace, int32_t token, int32_t head,
                                             int32_t split, int32_t query_heads,
                                             int32_t splits, int32_t head_dim) {
  return workspace + ((int64_t{token} * query_heads + head) * splits + split) * (head_dim + 2);
}

struct AttentionArgs {
  AttentionShape shape;
  const float* q;
  const bf16* k_cache;
  const bf16* v_cache;
  const int32_t* positions;
  const int32_t* token_pool_rows;
  const int32_t* table;
  int32_t token_begin;
  float* workspace;
  bf16* out;
};

// grid: (split lanes, kv heads, tokens of the chunk). Each block handles the `group` query heads
// that share one KV head, for the splits split_lane, split_lane + lanes, ...
__global__ void __launch_bounds__(kThreads)
attention_split_kernel(AttentionArgs a) {
  __shared__ float q_s[kGroupMax * kHeadDimMax];
  __shared__ float scores[kGroupMax * kAttentionSplitKeys];
  __shared__ int64_t slot_s[kAttentionSplitKeys];
  __shared__ float m_s[kGroupMax];
  __shared__ float l_s[kGroupMax];
  const AttentionShape& s = a.shape;
  const int32_t local_token = blockIdx.z;
  const int32_t token = a.token_begin + local_token;
  const int32_t kv_head = blockIdx.y;
  const int32_t d = s.head_dim;
  const int32_t group = s.query_heads / s.kv_heads;
  const int32_t kv_size = s.kv_heads * d;
  const int32_t q_size = s.query_heads * d;
  const int32_t keys = min(a.positions[token], s.positions_count - 1) + 1;
  const int32_t splits = (keys + kAttentionSplitKeys - 1) / kAttentionSplitKeys;
  if (static_cast<int32_t>(blockIdx.x) >= splits) return;
  const int32_t total_splits = (s.positions_count + kAttentionSplitKeys - 1) / kAttentionSplitKeys;
  const int32_t* table_row = a.table + int64_t{a.token_pool_rows[token]} * s.table_width;
  const float scale = 1.0f / sqrtf(static_cast<float>(d));
  const int32_t warp = threadIdx.x / 32;
  const int32_t lane = threadIdx.x % 32;

  for (int32_t i = threadIdx.x; i < group * d; i += kThreads) {
    q_s[i] = a.q[int64_t{token} * q_size + (kv_head * group) * d + i];
  }
  for (int32_t split = blockIdx.x; split < splits; split += gridDim.x) {
    const int32_t first = split * kAttentionSplitKeys;
    const int32_t count = min(kAttentionSplitKeys, keys - first);
    __syncthreads();  // q_s loaded; the previous split's scores and slots consumed
    for (int32_t j = threadIdx.x; j < count; j += kThreads) {
      const int32_t p = first + j;
      slot_s[j] = int64_t{table_row[p / s.page_size]} * s.page_size + p % s.page_size;
    }
    __syncthreads();
    // Scores: one warp per key, lanes across the head dimension, a fixed butterfly sum.
    for (int32_t j = warp; j < count; j += kWarps) {
      const bf16* k = a.k_cache + slot_s[j] * kv_size + kv_head * d;
      for (int32_t h = 0; h < group; ++h) {
        float partial = 0.0f;
        for (int32_t i = lane; i < d; i += 32) partial += q_s[h * d + i] * __bfloat162float(k[i]);
        partial = warp_sum(partial);
        if (lane == 0) scores[h * kAttentionSplitKeys + j] = partial * scale;
      }
    }
    __syncthreads();
    // Softmax pieces per head: one warp per head.
    for (int32_t h = warp; h < group; h += kWarps) {
      float* sc = scores + h * kAttentionSplitKeys;
      float m = -INFINITY;
      for (int32_t j = lane; j < count; j += 32) m = fmaxf(m, sc[j]);
      m = warp_max(m);
      float l = 0.0f;
      for (int32_t j = lane; j < count; j += 32) {
        const float e = expf(sc[j] - m);
        sc[j] = e;
        l += e;
      }
      l = warp_sum(l);
      if (lane == 0) m_s[h] = m, l_s[h] = l;
    }
    __syncthreads();
    // Weighted values: one thread per (head, dimension), keys in ascending order.
    for (int32_t idx = threadIdx.x; idx < group * d; idx += kThreads) {
      const int32_t h = idx / d;
      const int32_t i = idx % d;
      const float* sc = scores + h * kAttentionSplitKeys;
      float acc = 0.0f;
      for (int32_t j = 0; j < count; ++j) {
        acc += sc[j] * __bfloat162float(a.v_cache[slot_s[j] * kv_size + kv_head * d + i]);
      }
      const int32_t head = kv_head * group + h;
      if (splits == 1) {
        a.out[int64_t{token} * q_size + head * d + i] = __float2bfloat16_rn(acc / l_s[h]);
      } else {
        float* part = partial_at(a.workspace, local_token, head, split, s.query_heads,
                                 total_splits, d);
        if (i == 0) part[0] = m_s[h], part[1] = l_s[h];
        part[2 + i] = acc;
      }
    }
  }
}

// grid: (query heads, tokens of the chunk). Merges a token's partials in split order.
__global__ void attention_combine_kernel(AttentionArgs a) {
  const AttentionShape& s = a.shape;
  const int32_t local_token = blockIdx.y;
  const int32_t token = a.token_begin + local_token;
  const int32_t head = blockIdx.x;
  const int32_t d = s.head_dim;
  const int32_t keys = min(a.positions[token], s.positions_count - 1) + 1;
  const int32_t splits = (keys + kAttentionSplitKeys - 1) / kAttentionSplitKeys;
  if (splits == 1) return;  // written directly by the split kernel
  const int32_t total_splits = (s.positions_count + kAttentionSplitKeys - 1) / kAttentionSplitKeys;
  float m = -INFINITY;
  for (int32_t k = 0; k < splits; ++k) {
    m = fmaxf(m, partial_at(a.workspace, local_token, head, k, s.query_heads, total_splits, d)[0]);
  }
  float l = 0.0f;
  for (int32_t k = 0; k < splits; ++k) {
    const float* part = partial_at(a.workspace, local_token, head, k, s.query_heads, total_splits, d);
    l += part[1] * expf(part[0] - m);
  }
  for (int32_t i = threadIdx.x; i < d; i += blockDim.x) {
    float acc = 0.0f;
    for (int32_t k = 0; k < splits; ++k) {
      const float* part =
          partial_at(a.workspace, local_token, head, k, s.query_heads, total_splits, d);
      acc += part[2 + i] * expf(part[0] - m);
    }
    a.out[int64_t{token} * s.query_heads * d + head * d + i] = __float2bfloat16_rn(acc / l);
  }
}

}  // namespace

size_t attention_workspace_floats(const AttentionShape& shape, int32_t tokens) {
  return static_cast<size_t>(tokens) * shape.query_heads * splits_max(shape) *
         (shape.head_dim + 2);
}

cudaError_t launch_paged_attention(const AttentionShape& shape, const float* q,
                                   const bf16* k_cache, const bf16* v_cache,
                                   const int32_t* positions, const int32_t* token_pool_rows,
                                   const int32_t* table, int32_t tokens_count, float* workspace,
                                   size_t workspace_floats, bf16* out, cudaStream_t stream) {
  const AttentionShape& s = shape;
  if (tokens_count < 0 || s.query_heads < 1 || s.kv_heads < 1 ||
      s.query_heads % s.kv_heads != 0 || s.query_heads / s.kv_heads > kGroupMax ||
      s.head_dim < 1 || s.head_dim > kHeadDimMax || s.table_width < 1 || s.page_size < 1 ||
      s.positions_count != s.table_width * s.page_size) {
    return cudaErrorInvalidValue;
  }
  if (tokens_count == 0) return cudaSuccess;
  const size_t per_token = attention_workspace_floats(s, 1);
  // Tokens per launch: what the workspace holds, and at most the grid's z limit.
  const int32_t chunk = static_cast<int32_t>(std::min<size_t>(
      {workspace_floats / per_token, static_cast<size_t>(tokens_count), size_t{65535}}));
  if (chunk < 1 || workspace == nullptr) return cudaErrorInvalidValue;
  const int32_t lanes = std::min(splits_max(s), kSplitLanesMax);
  for (int32_t begin = 0; begin < tokens_count; begin += chunk) {
    const int32_t n = std::min(chunk, tokens_count - begin);
    const AttentionArgs args{s, q, k_cache, v_cache, positions, token_pool_rows, table, begin,
                             workspace, out};
    attention_split_kernel<<<dim3(lanes, s.kv_heads, n), kThreads, 0, stream>>>(args);
    if (splits_max(s) > 1) {
      attention_combine_kernel<<<dim3(s.query_heads, n), 64, 0, stream>>>(args);
    }
    const cudaError_t status = cudaGetLastError();
    if (status != cudaSuccess) return status;
  }
  return cudaSuccess;
}

}  // namespace ls::kernels
