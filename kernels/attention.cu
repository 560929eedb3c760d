#include "kernels/attention.h"

#include "kernels/reduce.cuh"
#include "kernels/storage.cuh"

#include <algorithm>

namespace ls::kernels {

namespace {

using bf16 = __nv_bfloat16;

constexpr int32_t kThreads = 128;
constexpr int32_t kWarps = kThreads / 32;
constexpr int32_t kSplitLanesMax = 16;  // blocks per (token, kv head); each walks splits x, x+16..
constexpr int32_t kGroupMax = 16;       // query heads per KV head
constexpr int32_t kHeadDimMax = 256;
constexpr int32_t kGroupDimMax = 1024;  // group · head_dim: one block's queries
static_assert(kAttentionSplitKeys == kThreads, "one thread per key of a split scores it");

int32_t splits_max(const AttentionShape& s) {
  return (s.positions_count + kAttentionSplitKeys - 1) / kAttentionSplitKeys;
}

// Partial layout per (token, query head, split): [m, l, acc[head_dim]].
__device__ __forceinline__ float* partial_at(float* workspace, int32_t token, int32_t head,
                                             int32_t split, int32_t query_heads,
                                             int32_t splits, int32_t head_dim) {
  return workspace + ((int64_t{token} * query_heads + head) * splits + split) * (head_dim + 2);
}

template <typename T>
struct AttentionArgs {
  AttentionShape shape;
  const float* q;
  const T* k_cache;
  const T* v_cache;
  const int32_t* positions;
  const int32_t* token_pool_rows;
  const int32_t* table;
  int32_t token_begin;
  float* workspace;
  T* out;
};

// Eight consecutive elements of a key row as floats (one 16-byte load for bf16, two for float).
__device__ __forceinline__ void load8(const bf16* p, float* out) {
  const uint4 raw = *reinterpret_cast<const uint4*>(p);
  const __nv_bfloat162* pairs = reinterpret_cast<const __nv_bfloat162*>(&raw);
#pragma unroll
  for (int32_t k = 0; k < 4; ++k) {
    const float2 f = __bfloat1622float2(pairs[k]);
    out[2 * k] = f.x;
    out[2 * k + 1] = f.y;
  }
}
__device__ __forceinline__ void load8(const float* p, float* out) {
  const float4 a = *reinterpret_cast<const float4*>(p);
  const float4 b = *reinterpret_cast<const float4*>(p + 4);
  out[0] = a.x, out[1] = a.y, out[2] = a.z, out[3] = a.w;
  out[4] = b.x, out[5] = b.y, out[6] = b.z, out[7] = b.w;
}

// Two consecutive elements of a value row as floats.
__device__ __forceinline__ float2 load2(const bf16* p) {
  return __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(p));
}
__device__ __forceinline__ float2 load2(const float* p) {
  return *reinterpret_cast<const float2*>(p);
}

__device__ __forceinline__ void store(bf16* p, float x) { *p = __float2bfloat16_rn(x); }
__device__ __forceinline__ void store(float* p, float x) { *p = x; }

// grid: (split lanes, kv heads, tokens of the chunk). Each block handles the `group` query heads
// that share one KV head, for the splits split_lane, split_lane + lanes, ... Per split: thread j
// scores key j against every head of the group (the whole key row in its registers); one warp
// per head takes the softmax pieces; then warp w sums the values of keys w, w + 4, ... with
// lanes across dimension pairs, and the four warps' sums are added in warp order. Every order is
// fixed by the token's position alone, so a token's output does not depend on the batch.
template <typename T>
__global__ void __launch_bounds__(kThreads) attention_split_kernel(AttentionArgs<T> a) {
  __shared__ float q_s[kGroupDimMax];
  __shared__ float scores[kGroupMax * kAttentionSplitKeys];
  __shared__ float acc_s[kWarps * kGroupDimMax];
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
  const int32_t j = threadIdx.x;  // this thread's key within a split

  for (int32_t i = threadIdx.x; i < group * d; i += kThreads) {
    q_s[i] = a.q[int64_t{token} * q_size + (kv_head * group) * d + i];
  }
  for (int32_t split = blockIdx.x; split < splits; split += gridDim.x) {
    const int32_t first = split * kAttentionSplitKeys;
    const int32_t count = min(kAttentionSplitKeys, keys - first);
    __syncthreads();  // q_s loaded; the previous split's scores and sums consumed
    if (j < count) {
      const int32_t p = first + j;
      const int64_t slot = int64_t{table_row[p / s.page_size]} * s.page_size + p % s.page_size;
      slot_s[j] = slot;
      const T* k = a.k_cache + slot * kv_size + kv_head * d;
      float dots[kGroupMax];
#pragma unroll
      for (int32_t h = 0; h < kGroupMax; ++h) dots[h] = 0.0f;
      for (int32_t i = 0; i < d; i += 8) {
        float kv[8];
        load8(k + i, kv);
#pragma unroll
        for (int32_t h = 0; h < kGroupMax; ++h) {
          if (h < group) {
#pragma unroll
            for (int32_t e = 0; e < 8; ++e) dots[h] += q_s[h * d + i + e] * kv[e];
          }
        }
      }
#pragma unroll
      for (int32_t h = 0; h < kGroupMax; ++h) {
        if (h < group) scores[h * kAttentionSplitKeys + j] = dots[h] * scale;
      }
    }
    __syncthreads();
    // Softmax pieces per head: one warp per head.
    for (int32_t h = warp; h < group; h += kWarps) {
      float* sc = scores + h * kAttentionSplitKeys;
      float m = -INFINITY;
      for (int32_t x = lane; x < count; x += 32) m = fmaxf(m, sc[x]);
      m = warp_max(m);
      float l = 0.0f;
      for (int32_t x = lane; x < count; x += 32) {
        const float e = expf(sc[x] - m);
        sc[x] = e;
        l += e;
      }
      l = warp_sum(l);
      if (lane == 0) m_s[h] = m, l_s[h] = l;
    }
    __syncthreads();
    // Weighted values: warp w takes keys w, w + 4, ...; lane takes dimension pairs lane, lane + 32.
    for (int32_t pair = lane; pair < d / 2; pair += 32) {
      float2 acc[kGroupMax];
#pragma unroll
      for (int32_t h = 0; h < kGroupMax; ++h) acc[h] = make_float2(0.0f, 0.0f);
#pragma unroll 4
      for (int32_t x = warp; x < count; x += kWarps) {
        const float2 v = load2(a.v_cache + slot_s[x] * kv_size + kv_head * d + 2 * pair);
#pragma unroll
        for (int32_t h = 0; h < kGroupMax; ++h) {
          if (h < group) {
            const float e = scores[h * kAttentionSplitKeys + x];
            acc[h].x += e * v.x;
            acc[h].y += e * v.y;
          }
        }
      }
#pragma unroll
      for (int32_t h = 0; h < kGroupMax; ++h) {
        if (h < group) {
          acc_s[warp * kGroupDimMax + h * d + 2 * pair] = acc[h].x;
          acc_s[warp * kGroupDimMax + h * d + 2 * pair + 1] = acc[h].y;
        }
      }
    }
    __syncthreads();
    for (int32_t idx = threadIdx.x; idx < group * d; idx += kThreads) {
      const int32_t h = idx / d;
      const int32_t i = idx % d;
      float acc = acc_s[idx];
#pragma unroll
      for (int32_t w = 1; w < kWarps; ++w) acc += acc_s[w * kGroupDimMax + idx];
      const int32_t head = kv_head * group + h;
      if (splits == 1) {
        store(a.out + int64_t{token} * q_size + head * d + i, acc / l_s[h]);
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
template <typename T>
__global__ void attention_combine_kernel(AttentionArgs<T> a) {
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
    store(a.out + int64_t{token} * s.query_heads * d + head * d + i, acc / l);
  }
}

}  // namespace

size_t attention_workspace_floats(const AttentionShape& shape, int32_t tokens) {
  return static_cast<size_t>(tokens) * shape.query_heads * splits_max(shape) *
         (shape.head_dim + 2);
}

template <typename T>
cudaError_t launch_paged_attention(const AttentionShape& shape, const float* q, const T* k_cache,
                                   const T* v_cache, const int32_t* positions,
                                   const int32_t* token_pool_rows, const int32_t* table,
                                   int32_t tokens_count, float* workspace,
                                   size_t workspace_floats, T* out, cudaStream_t stream) {
  const AttentionShape& s = shape;
  if (tokens_count < 0 || s.query_heads < 1 || s.kv_heads < 1 ||
      s.query_heads % s.kv_heads != 0 || s.query_heads / s.kv_heads > kGroupMax ||
      s.head_dim < 8 || s.head_dim % 8 != 0 || s.head_dim > kHeadDimMax ||
      (s.query_heads / s.kv_heads) * s.head_dim > kGroupDimMax || s.table_width < 1 ||
      s.page_size < 1 || s.positions_count != s.table_width * s.page_size) {
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
    const AttentionArgs<T> args{s, q, k_cache, v_cache, positions, token_pool_rows, table, begin,
                                workspace, out};
    attention_split_kernel<T><<<dim3(lanes, s.kv_heads, n), kThreads, 0, stream>>>(args);
    if (splits_max(s) > 1) {
      attention_combine_kernel<T><<<dim3(s.query_heads, n), 64, 0, stream>>>(args);
    }
    const cudaError_t status = cudaGetLastError();
    if (status != cudaSuccess) return status;
  }
  return cudaSuccess;
}

template cudaError_t launch_paged_attention<bf16>(const AttentionShape&, const float*, const bf16*,
                                                  const bf16*, const int32_t*, const int32_t*,
                                                  const int32_t*, int32_t, float*, size_t, bf16*,
                                                  cudaStream_t);
template cudaError_t launch_paged_attention<float>(const AttentionShape&, const float*,
                                                   const float*, const float*, const int32_t*,
                                                   const int32_t*, const int32_t*, int32_t, float*,
                                                   size_t, float*, cudaStream_t);

}  // namespace ls::kernels
