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
constexpr int32_t kKeyLoads = 8;    // 16-byte pieces of a key row a thread has in flight
constexpr int32_t kValueLoads = 8;  // value pieces a lane has in flight

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

// Eight elements of a key row as loaded (kept raw so that several loads fit in registers).
template <typename T>
struct Raw8;
template <>
struct Raw8<bf16> {
  uint4 bits;
};
template <>
struct Raw8<float> {
  float4 lo, hi;
};
__device__ __forceinline__ Raw8<bf16> load_raw8(const bf16* p) {
  return Raw8<bf16>{*reinterpret_cast<const uint4*>(p)};
}
__device__ __forceinline__ Raw8<float> load_raw8(const float* p) {
  return Raw8<float>{*reinterpret_cast<const float4*>(p), *reinterpret_cast<const float4*>(p + 4)};
}
__device__ __forceinline__ void unpack_raw8(const Raw8<bf16>& raw, float* out) {
  const __nv_bfloat162* pairs = reinterpret_cast<const __nv_bfloat162*>(&raw.bits);
#pragma unroll
  for (int32_t k = 0; k < 4; ++k) {
    const float2 f = __bfloat1622float2(pairs[k]);
    out[2 * k] = f.x;
    out[2 * k + 1] = f.y;
  }
}
__device__ __forceinline__ void unpack_raw8(const Raw8<float>& raw, float* out) {
  out[0] = raw.lo.x, out[1] = raw.lo.y, out[2] = raw.lo.z, out[3] = raw.lo.w;
  out[4] = raw.hi.x, out[5] = raw.hi.y, out[6] = raw.hi.z, out[7] = raw.hi.w;
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
      // kKeyLoads 8-element pieces of the key row in flight at once, then used in ascending
      // order (the sums' order is that of one piece after another).
      for (int32_t i0 = 0; i0 < d; i0 += 8 * kKeyLoads) {
        Raw8<T> raw[kKeyLoads];
#pragma unroll
        for (int32_t u = 0; u < kKeyLoads; ++u) {
          if (i0 + 8 * u < d) raw[u] = load_raw8(k + i0 + 8 * u);
        }
#pragma unroll
        for (int32_t u = 0; u < kKeyLoads; ++u) {
          if (i0 + 8 * u < d) {
            float kv[8];
            unpack_raw8(raw[u], kv);
            const int32_t i = i0 + 8 * u;
#pragma unroll
            for (int32_t h = 0; h < kGroupMax; ++h) {
              if (h < group) {
#pragma unroll
                for (int32_t e = 0; e < 8; ++e) dots[h] += q_s[h * d + i + e] * kv[e];
              }
            }
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
      // kValueLoads value pieces in flight at once, then summed in ascending key order.
      for (int32_t x0 = warp; x0 < count; x0 += kWarps * kValueLoads) {
        float2 vals[kValueLoads];
#pragma unroll
        for (int32_t u = 0; u < kValueLoads; ++u) {
          const int32_t x = x0 + u * kWarps;
          if (x < count) vals[u] = load2(a.v_cache + slot_s[x] * kv_size + kv_head * d + 2 * pair);
        }
#pragma unroll
        for (int32_t u = 0; u < kValueLoads; ++u) {
          const int32_t x = x0 + u * kWarps;
          if (x < count) {
#pragma unroll
            for (int32_t h = 0; h < kGroupMax; ++h) {
              if (h < group) {
                const float e = scores[h * kAttentionSplitKeys + x];
                acc[h].x += e * vals[u].x;
                acc[h].y += e * vals[u].y;
              }
            }
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
