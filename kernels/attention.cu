#include "kernels/attention.h"

#include "core/ops/slot.h"
#include "kernels/copy_async.cuh"
#include "kernels/kernel_fit.h"
#include "kernels/launch.cuh"
#include "kernels/reduce.cuh"
#include "kernels/storage.cuh"

#include <algorithm>
#include <type_traits>

namespace ls::kernels {

namespace {

using bf16 = __nv_bfloat16;

constexpr int32_t kThreads = 128;
constexpr int32_t kWarps = kThreads / 32;
constexpr int32_t kSplitLanesMax = 16;  // blocks per (token, kv head); each walks splits x, x+16..
constexpr int32_t kGroupMax = 16;       // query heads per KV head
constexpr int32_t kHeadDimMax = 256;
constexpr int32_t kGroupDimMax = 1024;  // group · head_dim: one block's queries
static_assert(kAttentionSplitKeys == kThreads, "one thread per key of a split finds its slot");
static_assert(kAttentionSplitKeys == kWarps * 32, "each warp takes 32 keys of a split");

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

__device__ __forceinline__ void store(bf16* p, float x) { *p = __float2bfloat16_rn(x); }
__device__ __forceinline__ void store(float* p, float x) { *p = x; }

__device__ __forceinline__ void copy_async_8_elements(bf16* shared, const bf16* global) {
  copy_async_16(shared, global);
}
__device__ __forceinline__ void copy_async_8_elements(float* shared, const float* global) {
  copy_async_16(shared, global);
  copy_async_16(shared + 4, global + 4);
}

// Key-row pieces a lane has in flight at once (registers: 4 words per bf16 piece, 8 per fp32 one).
template <typename T>
constexpr int32_t kKeyLoads = sizeof(T) == 2 ? 8 : 4;

// Dynamic shared memory of the split kernel: one split's value rows, [kAttentionSplitKeys, d] T,
// reused for the warps' partial sums [kWarps, group·d] fp32 once the values are consumed.
template <typename T>
size_t split_shared_bytes(int32_t head_dim, int32_t group) {
  return std::max(size_t{kAttentionSplitKeys} * head_dim * sizeof(T),
                  size_t{kWarps} * group * head_dim * sizeof(float));
}

// What one block of a split kernel works on (grid: split lanes × kv heads × tokens of the chunk):
// its token, kv head, the token's keys and splits (a block past them returns), every token's
// split count (the workspace's pitch) and the token's page-table row.
struct SplitBlock {
  int32_t local_token, token, kv_head, group, keys, splits, total_splits;
  const int32_t* table_row;
};

template <typename T>
__device__ __forceinline__ SplitBlock split_block(const AttentionArgs<T>& a) {
  const AttentionShape& s = a.shape;
  SplitBlock b;
  b.local_token = blockIdx.z;
  b.token = a.token_begin + b.local_token;
  b.kv_head = blockIdx.y;
  b.group = s.query_heads / s.kv_heads;
  b.keys = min(a.positions[b.token], s.positions_count - 1) + 1;
  b.splits = (b.keys + kAttentionSplitKeys - 1) / kAttentionSplitKeys;
  b.total_splits = (s.positions_count + kAttentionSplitKeys - 1) / kAttentionSplitKeys;
  b.table_row = a.table + int64_t{a.token_pool_rows[b.token]} * s.table_width;
  return b;
}

// A split's softmax pieces, one warp a head: each head's scores[0, count) (head h's row at h ·
// pitch) become e = exp(score − m) with m their maximum, m and Σ e go to m_s / l_s (the combine
// merges splits from them), and scores[count, padded) are zeroed (the MMA path multiplies whole
// 16-key tiles).
__device__ __forceinline__ void split_softmax_pieces(float* scores, int32_t pitch, int32_t group,
                                                     int32_t count, int32_t padded, int32_t warp,
                                                     int32_t lane, float* m_s, float* l_s) {
  for (int32_t h = warp; h < group; h += kWarps) {
    float* sc = scores + h * pitch;
    float m = -INFINITY;
    for (int32_t x = lane; x < count; x += 32) m = fmaxf(m, sc[x]);
    m = warp_max(m);
    float l = 0.0f;
    for (int32_t x = lane; x < count; x += 32) {
      const float e = expf(sc[x] - m);
      sc[x] = e;
      l += e;
    }
    for (int32_t x = count + lane; x < padded; x += 32) sc[x] = 0.0f;
    l = warp_sum(l);
    if (lane == 0) m_s[h] = m, l_s[h] = l;
  }
}

// grid: (split lanes, kv heads, tokens of the chunk). Each block handles the `group` query heads
// that share one KV head (every K/V element is read once per KV head, not once per query head),
// for the splits split_lane, split_lane + lanes, ... How many lanes a launch uses depends on the
// batch (enough blocks to fill the GPU), but every split is computed the same way whichever block
// takes it, so a token's output does not depend on the batch.
//
// Per split, the memory reads overlap: the value rows are copied to shared memory asynchronously
// (cp.async) while the key rows are read into registers and scored, and the next split's slots
// are read from the block table while this split's softmax and values run. Key layout: `L`
// lanes (the smallest power of two >= head_dim / 8) each take one 16-byte piece (8 elements) of a
// row, so a warp reads 32 / L whole rows per load, coalesced; warp w takes keys 32w .. 32w + 31
// of the split. Scores: each lane dots its piece with every head of the group, the L lanes' dots
// are added by an xor butterfly; one warp per head takes the softmax pieces; values: each lane
// sums its piece of its keys' rows from shared memory, the lanes that share a piece are added by
// an xor butterfly, and the four warps' sums are added in warp order. Every order is fixed by the
// token's position alone. G: the group rounded up to a power of two (the accumulators' count).
template <typename T, int32_t G>
__global__ void __launch_bounds__(kThreads) attention_split_kernel(AttentionArgs<T> a) {
  extern __shared__ __align__(16) unsigned char split_shared[];
  T* value_rows = reinterpret_cast<T*>(split_shared);          // [keys of the split, d]
  float* warp_sums = reinterpret_cast<float*>(split_shared);   // [kWarps, group·d], afterwards
  __shared__ __align__(16) float q_s[kGroupDimMax];
  __shared__ float scores[G * kAttentionSplitKeys];
  __shared__ int64_t slot_s[kAttentionSplitKeys];
  __shared__ float m_s[G];
  __shared__ float l_s[G];
  allow_successor();
  // Before the wait, as the MMA kernel: the block's token, keys and first slots, from the step's
  // inputs alone (final before the predecessor started, kernels/launch.cuh).
  const AttentionShape& s = a.shape;
  const SplitBlock block = split_block(a);  // named copies: CUDA's C++17 lambdas capture them
  const int32_t local_token = block.local_token, token = block.token, kv_head = block.kv_head,
                group = block.group, keys = block.keys, splits = block.splits,
                total_splits = block.total_splits;
  const int32_t* table_row = block.table_row;
  const int32_t d = s.head_dim;
  const int32_t group_dim = group * d;
  const int32_t kv_size = s.kv_heads * d;
  const int32_t q_size = s.query_heads * d;
  const float scale = 1.0f / sqrtf(static_cast<float>(d));
  const int32_t warp = threadIdx.x / 32;
  const int32_t lane = threadIdx.x % 32;
  const int32_t pieces = d / 8;  // <= 32
  int32_t lanes_per_key = 1;
  while (lanes_per_key < pieces) lanes_per_key *= 2;
  const int32_t rows_per_load = 32 / lanes_per_key;
  const int32_t piece = lane % lanes_per_key;
  const int32_t sub = lane / lanes_per_key;  // which of the load's rows
  const bool has_piece = piece < pieces;
  const int32_t loads = 32 / rows_per_load;  // per warp per split (32 keys)
  const int32_t key0 = warp * 32;
  const int64_t head_offset = int64_t{kv_head} * d;
  constexpr int32_t key_loads = kKeyLoads<T>;

  // The slot of this thread's key of a split (one key per thread: kThreads == split keys).
  const auto slot_of = [&](int32_t split) -> int64_t {
    const int32_t p = split * kAttentionSplitKeys + static_cast<int32_t>(threadIdx.x);
    if (p >= keys) return 0;
    return ops::slot_in_table(table_row, s.page_size, p);
  };
  int64_t next_slot = slot_of(blockIdx.x);  // 0 past the keys
  wait_for_predecessor();
  if (static_cast<int32_t>(blockIdx.x) >= splits) return;
  for (int32_t i = threadIdx.x; i < group_dim; i += kThreads) {
    q_s[i] = a.q[int64_t{token} * q_size + (kv_head * group) * d + i];
  }
  for (int32_t split = blockIdx.x; split < splits; split += gridDim.x) {
    const int32_t first = split * kAttentionSplitKeys;
    const int32_t count = min(kAttentionSplitKeys, keys - first);
    __syncthreads();  // q_s loaded; the previous split's slots, scores and sums consumed
    slot_s[threadIdx.x] = next_slot;
    __syncthreads();
    // Value rows → shared memory, in flight while the keys are scored.
    for (int32_t idx = threadIdx.x; idx < count * pieces; idx += kThreads) {
      const int32_t x = idx / pieces;
      const int32_t j = idx - x * pieces;
      copy_async_8_elements(value_rows + x * d + 8 * j,
                            a.v_cache + slot_s[x] * kv_size + head_offset + 8 * j);
    }
    copy_async_commit();
    // Scores: key_loads row pieces in flight per lane, then used in ascending order.
    for (int32_t u0 = 0; u0 < loads; u0 += key_loads) {
      Raw8<T> raw[key_loads] = {};
#pragma unroll
      for (int32_t u = 0; u < key_loads; ++u) {
        const int32_t x = key0 + (u0 + u) * rows_per_load + sub;
        if (u0 + u < loads && x < count && has_piece) {
          raw[u] = load_raw8(a.k_cache + slot_s[x] * kv_size + head_offset + 8 * piece);
        }
      }
#pragma unroll
      for (int32_t u = 0; u < key_loads; ++u) {
        if (u0 + u >= loads) break;  // warp-uniform
        const int32_t x = key0 + (u0 + u) * rows_per_load + sub;
        float kv[8];
        unpack_raw8(raw[u], kv);
        float dots[G];
#pragma unroll
        for (int32_t h = 0; h < G; ++h) {
          dots[h] = 0.0f;
          if (h < group && has_piece) {
            const float4 qa = *reinterpret_cast<const float4*>(q_s + h * d + 8 * piece);
            const float4 qb = *reinterpret_cast<const float4*>(q_s + h * d + 8 * piece + 4);
            dots[h] = qa.x * kv[0];
            dots[h] += qa.y * kv[1];
            dots[h] += qa.z * kv[2];
            dots[h] += qa.w * kv[3];
            dots[h] += qb.x * kv[4];
            dots[h] += qb.y * kv[5];
            dots[h] += qb.z * kv[6];
            dots[h] += qb.w * kv[7];
          }
        }
        for (int32_t offset = lanes_per_key / 2; offset > 0; offset >>= 1) {
#pragma unroll
          for (int32_t h = 0; h < G; ++h) dots[h] += __shfl_xor_sync(0xffffffffu, dots[h], offset);
        }
        if (piece == 0 && x < count) {
#pragma unroll
          for (int32_t h = 0; h < G; ++h) {
            if (h < group) scores[h * kAttentionSplitKeys + x] = dots[h] * scale;
          }
        }
      }
    }
    // The next split's slots: a table read whose latency overlaps this split's softmax and values.
    const int32_t next = split + static_cast<int32_t>(gridDim.x);
    next_slot = next < splits ? slot_of(next) : 0;
    __syncthreads();
    split_softmax_pieces(scores, kAttentionSplitKeys, group, count, count, warp, lane, m_s, l_s);
    copy_async_wait_all();
    __syncthreads();  // probabilities and every thread's value rows visible
    // Weighted values from shared memory, the same lane layout as the keys.
    float acc[G][8];
#pragma unroll
    for (int32_t h = 0; h < G; ++h) {
#pragma unroll
      for (int32_t e = 0; e < 8; ++e) acc[h][e] = 0.0f;
    }
    for (int32_t u = 0; u < loads; ++u) {
      const int32_t x = key0 + u * rows_per_load + sub;
      if (x < count && has_piece) {
        float v[8];
        unpack_raw8(load_raw8(value_rows + x * d + 8 * piece), v);
#pragma unroll
        for (int32_t h = 0; h < G; ++h) {
          if (h < group) {
            const float e = scores[h * kAttentionSplitKeys + x];
#pragma unroll
            for (int32_t k = 0; k < 8; ++k) acc[h][k] += e * v[k];
          }
        }
      }
    }
    // The lanes that hold the same piece (of different rows) are added by an xor butterfly.
    for (int32_t offset = lanes_per_key; offset < 32; offset <<= 1) {
#pragma unroll
      for (int32_t h = 0; h < G; ++h) {
#pragma unroll
        for (int32_t k = 0; k < 8; ++k) {
          acc[h][k] += __shfl_xor_sync(0xffffffffu, acc[h][k], offset);
        }
      }
    }
    __syncthreads();  // every warp is done with the value rows: their memory takes the sums
    if (sub == 0 && has_piece) {
#pragma unroll
      for (int32_t h = 0; h < G; ++h) {
        if (h < group) {
          float* dst = warp_sums + warp * group_dim + h * d + 8 * piece;
          *reinterpret_cast<float4*>(dst) = make_float4(acc[h][0], acc[h][1], acc[h][2], acc[h][3]);
          *reinterpret_cast<float4*>(dst + 4) =
              make_float4(acc[h][4], acc[h][5], acc[h][6], acc[h][7]);
        }
      }
    }
    __syncthreads();
    for (int32_t idx = threadIdx.x; idx < group_dim; idx += kThreads) {
      const int32_t h = idx / d;
      const int32_t i = idx % d;
      float acc_sum = warp_sums[idx];
#pragma unroll
      for (int32_t w = 1; w < kWarps; ++w) acc_sum += warp_sums[w * group_dim + idx];
      const int32_t head = kv_head * group + h;
      if (splits == 1) {
        store(a.out + int64_t{token} * q_size + head * d + i, acc_sum / l_s[h]);
      } else {
        float* part = partial_at(a.workspace, local_token, head, split, s.query_heads,
                                 total_splits, d);
        if (i == 0) part[0] = m_s[h], part[1] = l_s[h];
        part[2 + i] = acc_sum;
      }
    }
  }
}

}  // namespace
}  // namespace ls::kernels

#include "kernels/attention_mma.cuh"
#include "kernels/attention_tiles.cuh"
#include "kernels/attention_combine.cuh"

namespace ls::kernels {
namespace {

// Launches `kKernel` over (split lanes, kv heads, tokens): enough split lanes to fill the GPU once
// (kernels/kernel_fit.h: how many of its blocks it holds), never more lanes than splits.
template <auto kKernel, typename T>
cudaError_t launch_splits(size_t shared, const AttentionArgs<T>& args, int32_t tokens,
                          LaunchStream stream) {
  const AttentionShape& s = args.shape;
  int32_t resident = 0;
  const cudaError_t status = resident_on_gpu<kKernel>(kThreads, shared, &resident);
  if (status != cudaSuccess) return status;
  const int32_t lanes = std::clamp(resident / (tokens * s.kv_heads), 1,
                                   std::min(splits_max(s), kSplitLanesMax));
  return launch_kernel(kKernel, dim3(lanes, s.kv_heads, tokens), kThreads, shared, stream, args);
}

// The tensor-core split kernel, or one of its forms with a part left out (`split_leave_out`: at
// most one of AttentionLeaveOut's split-kernel bits; those forms exist at kAttentionLeaveOutGroup).
template <int32_t D, int32_t G>
cudaError_t launch_mma(const AttentionArgs<bf16>& args, int32_t tokens, LaunchStream stream,
                       uint32_t split_leave_out) {
  constexpr size_t kShared = mma_shared_bytes<D>();
  if (split_leave_out == 0) {
    return launch_splits<attention_mma_kernel<D, G>>(kShared, args, tokens, stream);
  }
  if constexpr (G == kAttentionLeaveOutGroup) {
    if (split_leave_out == kAttentionSplitBody) {
      return launch_splits<attention_mma_kernel<D, G, kAttentionSplitBody>>(kShared, args, tokens,
                                                                             stream);
    }
    if (split_leave_out == kAttentionKvReads) {
      return launch_splits<attention_mma_kernel<D, G, kAttentionKvReads>>(kShared, args, tokens,
                                                                           stream);
    }
    if (split_leave_out == kAttentionArithmetic) {
      return launch_splits<attention_mma_kernel<D, G, kAttentionArithmetic>>(kShared, args,
                                                                              tokens, stream);
    }
  }
  return cudaErrorInvalidValue;
}

template <typename T, int32_t G>
cudaError_t launch_split(const AttentionArgs<T>& args, int32_t tokens, LaunchStream stream,
                         uint32_t split_leave_out) {
  const int32_t d = args.shape.head_dim;
  if constexpr (std::is_same_v<T, bf16>) {
    if (d == 64) return launch_mma<64, G>(args, tokens, stream, split_leave_out);
    if (d == 128) return launch_mma<128, G>(args, tokens, stream, split_leave_out);
  }
  if (split_leave_out != 0) return cudaErrorInvalidValue;  // only the tensor-core kernel has parts
  const size_t shared = split_shared_bytes<T>(d, args.shape.query_heads / args.shape.kv_heads);
  return launch_splits<attention_split_kernel<T, G>>(shared, args, tokens, stream);
}

// The decode kernel and the combine (less the parts `leave_out` names) over tokens [first, end)
// of `base`, in launches of at most `chunk` tokens.
template <typename T>
cudaError_t launch_decode_kernel(const AttentionArgs<T>& base, int32_t first, int32_t end,
                                 int32_t chunk, LaunchStream stream, uint32_t leave_out) {
  const AttentionShape& s = base.shape;
  const uint32_t split_leave_out = leave_out & kAttentionSplitParts;
  const bool combine = (leave_out & kAttentionCombine) == 0;
  for (int32_t begin = first; begin < end; begin += chunk) {
    const int32_t n = std::min(chunk, end - begin);
    AttentionArgs<T> args = base;
    args.token_begin = begin;
    const int32_t group = s.query_heads / s.kv_heads;
    cudaError_t launched = cudaSuccess;
    if (group <= 1) {
      launched = launch_split<T, 1>(args, n, stream, split_leave_out);
    } else if (group <= 2) {
      launched = launch_split<T, 2>(args, n, stream, split_leave_out);
    } else if (group <= 4) {
      launched = launch_split<T, 4>(args, n, stream, split_leave_out);
    } else if (group <= 8) {
      launched = launch_split<T, 8>(args, n, stream, split_leave_out);
    } else {
      launched = launch_split<T, 16>(args, n, stream, split_leave_out);
    }
    if (launched != cudaSuccess) return launched;
    if (combine && splits_max(s) > 1) {
      const size_t shared = size_t{2} * splits_max(s) * sizeof(float);
      cudaError_t status = grant_shared<attention_combine_kernel<T>>(shared);
      if (status != cudaSuccess) return status;
      status = launch_kernel(attention_combine_kernel<T>, dim3(s.query_heads, n), 128, shared,
                             stream, args);
      if (status != cudaSuccess) return status;
    }
  }
  return cudaSuccess;
}

template <int32_t D>
cudaError_t launch_tiles(const AttentionArgs<bf16>& base, int32_t tokens, size_t workspace_floats,
                         LaunchStream stream) {
  int32_t resident = 0;
  const cudaError_t status =
      resident_on_gpu<attention_tile_kernel<D>>(kTileThreads, tile_shared_bytes<D>(), &resident);
  if (status != cudaSuccess) return status;
  return launch_tile_range<D>(base, tokens, workspace_floats, resident, stream);
}

}  // namespace

int32_t attention_tiled_tokens(const AttentionShape& shape, bool bf16_kv, int32_t prefill_tokens,
                               AttentionPrefill prefill) {
  const bool has_tiles = bf16_kv && attention_on_tensor_cores(shape.head_dim);
  const bool takes_tiles = prefill == AttentionPrefill::kTiles &&
                           prefill_tokens >= kAttentionTilePrefillTokensMin;
  return has_tiles && takes_tiles ? prefill_tokens : 0;
}

size_t attention_workspace_floats(const AttentionShape& shape, int32_t tokens) {
  const size_t partials = static_cast<size_t>(tokens) * shape.query_heads * splits_max(shape) *
                          (shape.head_dim + 2);
  const size_t tile_list = static_cast<size_t>(kTileListHeader) + static_cast<size_t>(tokens);
  return std::max(partials, tile_list);
}

cudaError_t attention_positions_max(int64_t* positions) {
  int device = 0, block_shared_max = 0;
  cudaFuncAttributes combine{};
  cudaError_t status = cudaGetDevice(&device);
  if (status == cudaSuccess) {
    status = cudaDeviceGetAttribute(&block_shared_max, cudaDevAttrMaxSharedMemoryPerBlockOptin,
                                    device);
  }
  if (status == cudaSuccess) {
    status = cudaFuncGetAttributes(&combine, attention_combine_kernel<float>);
  }
  if (status != cudaSuccess) return status;
  const int64_t dynamic = int64_t{block_shared_max} - static_cast<int64_t>(combine.sharedSizeBytes);
  *positions = std::max<int64_t>(dynamic, 0) / int64_t{2 * sizeof(float)} * kAttentionSplitKeys;
  return cudaSuccess;
}

template <typename T>
cudaError_t launch_paged_attention(const AttentionShape& shape, const float* q, const T* k_cache,
                                   const T* v_cache, const int32_t* positions,
                                   const int32_t* token_pool_rows, const int32_t* table,
                                   int32_t tokens_count, int32_t prefill_tokens_count,
                                   AttentionPrefill prefill, float* workspace,
                                   size_t workspace_floats, T* out, LaunchStream stream,
                                   uint32_t leave_out) {
  const AttentionShape& s = shape;
  if (tokens_count < 0 || s.query_heads < 1 || s.kv_heads < 1 ||
      s.query_heads % s.kv_heads != 0 || s.query_heads / s.kv_heads > kGroupMax ||
      s.head_dim < 8 || s.head_dim % 8 != 0 || s.head_dim > kHeadDimMax ||
      (s.query_heads / s.kv_heads) * s.head_dim > kGroupDimMax || s.table_width < 1 ||
      s.page_size < 1 || s.positions_count != s.table_width * s.page_size) {
    return cudaErrorInvalidValue;
  }
  if (prefill_tokens_count < 0 || prefill_tokens_count > tokens_count) return cudaErrorInvalidValue;
  if (prefill != AttentionPrefill::kTiles && prefill != AttentionPrefill::kDecodeKernel) {
    return cudaErrorInvalidValue;
  }
  const uint32_t parts = leave_out & kAttentionSplitParts;
  if ((leave_out & ~kAttentionLeaveOutAll) != 0 || (parts & (parts - 1)) != 0) {  // one at a time
    return cudaErrorInvalidValue;
  }
  if (tokens_count == 0) return cudaSuccess;
  const size_t per_token = attention_workspace_floats(s, 1);
  // Tokens per decode-kernel launch: what the workspace holds, and at most the grid's z limit.
  const int32_t chunk = static_cast<int32_t>(std::min<size_t>(
      {workspace_floats / per_token, static_cast<size_t>(tokens_count), size_t{65535}}));
  if (chunk < 1 || workspace == nullptr) return cudaErrorInvalidValue;
  const AttentionArgs<T> base{s, q, k_cache, v_cache, positions, token_pool_rows, table, 0,
                              workspace, out};
  const int32_t tiled =
      attention_tiled_tokens(s, std::is_same_v<T, bf16>, prefill_tokens_count, prefill);
  if constexpr (std::is_same_v<T, bf16>) {
    if (tiled > 0) {
      const cudaError_t status = s.head_dim == 64
                                     ? launch_tiles<64>(base, tiled, workspace_floats, stream)
                                     : launch_tiles<128>(base, tiled, workspace_floats, stream);
      if (status != cudaSuccess) return status;
    }
  }
  return launch_decode_kernel<T>(base, tiled, tokens_count, chunk, stream, leave_out);
}

template cudaError_t launch_paged_attention<bf16>(const AttentionShape&, const float*, const bf16*,
                                                  const bf16*, const int32_t*, const int32_t*,
                                                  const int32_t*, int32_t, int32_t,
                                                  AttentionPrefill, float*, size_t, bf16*,
                                                  LaunchStream, uint32_t);
template cudaError_t launch_paged_attention<float>(const AttentionShape&, const float*,
                                                   const float*, const float*, const int32_t*,
                                                   const int32_t*, const int32_t*, int32_t,
                                                   int32_t, AttentionPrefill, float*, size_t,
                                                   float*, LaunchStream, uint32_t);

}  // namespace ls::kernels
