// Decode/prefill paged attention on the tensor cores, for bf16 KV with head_dim 64 or 128: the
// production path (llama-1b, llama-8b). Included by attention.cu only.
//
// Same contract and split rule as the CUDA-core kernel in attention.cu (fixed 128-key splits,
// partials combined in split order by the combine kernel): what changes is how a split is
// computed. A block takes one (token, KV head) and the splits split_lane, split_lane + lanes, ...;
// its `group` query heads are the rows of a 16-row MMA tile (rows >= group are zero).
//
//  * Scores S = Q·Kᵀ with mma.m16n8k16 (bf16 in, fp32 accumulate). Warp w scores keys
//    32w .. 32w + 31 of the split. The reduction dimension (head_dim) is visited in a permuted
//    order — the same permutation for Q and K, so the dot products are unchanged — chosen so that
//    each thread's B fragment is one 16-byte load of a key row: thread (g, c) = (lane / 4, lane % 4)
//    loads dims [32s + 8c, 32s + 8c + 8) of key g of an 8-key tile, and k-step 2s + r uses the
//    words 2r, 2r + 1 of that load. Q's A fragments (fp32 → bf16) are built once per block.
//  * Softmax per split in fp32 (one warp per head), exactly as the CUDA-core kernel.
//  * Output O = P·V with mma.m16n8k16: P (fp32 → bf16) from shared memory, V from a shared-memory
//    tile filled by cp.async while the keys are scored, read as B fragments with ldmatrix.trans.
//    Warp w owns dims [w·d/4, (w + 1)·d/4) over all the split's keys, so no cross-warp sum.
//
// Every order (MMA, softmax, split combine) is fixed by the token's position alone, so a token's
// output does not depend on the batch or on how many split lanes the launch uses.
#pragma once

#include "kernels/mma.cuh"

namespace ls::kernels {
namespace {

__device__ __forceinline__ uint32_t pack_bf16x2(float lo, float hi) {
  const __nv_bfloat162 pair = __floats2bfloat162_rn(lo, hi);  // .x = lo (low half)
  return *reinterpret_cast<const uint32_t*>(&pair);
}

// Four transposed 8×8 bf16 matrices from shared memory; lanes 8i .. 8i + 7 give matrix i's rows.
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&r)[4], const void* row) {
  const uint32_t address = static_cast<uint32_t>(__cvta_generic_to_shared(row));
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(address));
}

constexpr int32_t kMmaRows = 16;  // query heads of a group, padded: the MMA tile's M

// Shared-memory row pitch of the value tile, in elements: 8 more than head_dim, so the eight
// 16-byte rows an ldmatrix phase reads fall in different banks.
template <int32_t D>
constexpr int32_t kValuePitch = D + 8;

template <int32_t D>
constexpr size_t mma_shared_bytes() {
  return size_t{kAttentionSplitKeys} * kValuePitch<D> * sizeof(bf16);
}

template <int32_t D, int32_t G>
__global__ void __launch_bounds__(kThreads, 4) attention_mma_kernel(AttentionArgs<bf16> a) {
  static_assert(D % 32 == 0 && D / kWarps % 16 == 0, "head_dim 64 or 128");
  static_assert(G <= kMmaRows, "a group fits the MMA tile");
  constexpr int32_t kSteps = D / 16;              // k-steps of the scores
  constexpr int32_t kLoads = D / 32;              // 16-byte key loads per key tile
  constexpr int32_t kWarpDims = D / kWarps;       // output dims per warp
  constexpr int32_t kDimPairs = kWarpDims / 16;   // ldmatrix.x4 per k-step (two 8-dim tiles each)
  constexpr int32_t kKeyTiles = 32 / 8;           // 8-key tiles per warp
  extern __shared__ __align__(16) unsigned char mma_shared[];
  bf16* value_rows = reinterpret_cast<bf16*>(mma_shared);  // [split keys, kValuePitch<D>]
  __shared__ __align__(16) float scores[G * kAttentionSplitKeys];
  __shared__ int64_t slot_s[kAttentionSplitKeys];
  __shared__ float m_s[G];
  __shared__ float l_s[G];
  allow_successor();
  wait_for_predecessor();
  const AttentionShape& s = a.shape;
  const SplitBlock block = split_block(a);  // named copies: CUDA's C++17 lambdas capture them
  if (static_cast<int32_t>(blockIdx.x) >= block.splits) return;
  const int32_t local_token = block.local_token, token = block.token, kv_head = block.kv_head,
                group = block.group, keys = block.keys, splits = block.splits,
                total_splits = block.total_splits;
  const int32_t* table_row = block.table_row;
  const int32_t kv_size = s.kv_heads * D;
  const int32_t q_size = s.query_heads * D;
  const float scale = 1.0f / sqrtf(static_cast<float>(D));
  const int32_t warp = threadIdx.x / 32;
  const int32_t lane = threadIdx.x % 32;
  const int32_t g = lane / 4;  // MMA group: a row of A and C, a column (key or dim) of B
  const int32_t c = lane % 4;  // thread in the group
  const int64_t head_offset = int64_t{kv_head} * D;

  // Q's A fragments for every k-step (rows g and g + 8; zero past the group).
  uint32_t q_frag[kSteps][4];
  {
    const float* q = a.q + int64_t{token} * q_size + int64_t{kv_head} * group * D;
#pragma unroll
    for (int32_t k = 0; k < kSteps; ++k) {
      const int32_t dim = 32 * (k / 2) + 8 * c + 4 * (k % 2);
#pragma unroll
      for (int32_t half = 0; half < 2; ++half) {
        const int32_t row = g + 8 * half;
        float4 x = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        if (row < group) x = *reinterpret_cast<const float4*>(q + row * D + dim);
        q_frag[k][half] = pack_bf16x2(x.x, x.y);
        q_frag[k][2 + half] = pack_bf16x2(x.z, x.w);
      }
    }
  }
  const auto slot_of = [&](int32_t split) -> int64_t {
    const int32_t p = split * kAttentionSplitKeys + static_cast<int32_t>(threadIdx.x);
    if (p >= keys) return 0;
    return ops::slot_in_table(table_row, s.page_size, p);
  };
  int64_t next_slot = slot_of(blockIdx.x);
  for (int32_t split = blockIdx.x; split < splits; split += gridDim.x) {
    const int32_t first = split * kAttentionSplitKeys;
    const int32_t count = min(kAttentionSplitKeys, keys - first);
    const int32_t padded = (count + 15) / 16 * 16;  // keys the P·V k-steps cover
    __syncthreads();  // the previous split's slots, scores and value rows consumed
    slot_s[threadIdx.x] = next_slot;
    __syncthreads();
    // Value rows → shared memory, in flight while the keys are scored; the rows past the split's
    // keys up to the next k-step boundary are zeroed (their probabilities are zero, and 0·NaN of a
    // stale row would not be).
    constexpr int32_t kPieces = D / 8;
    for (int32_t idx = threadIdx.x; idx < count * kPieces; idx += kThreads) {
      const int32_t x = idx / kPieces;
      const int32_t j = idx - x * kPieces;
      copy_async_16(value_rows + x * kValuePitch<D> + 8 * j,
                    a.v_cache + slot_s[x] * kv_size + head_offset + 8 * j);
    }
    copy_async_commit();
    for (int32_t idx = count * kPieces + threadIdx.x; idx < padded * kPieces; idx += kThreads) {
      const int32_t x = idx / kPieces;
      const int32_t j = idx - x * kPieces;
      *reinterpret_cast<uint4*>(value_rows + x * kValuePitch<D> + 8 * j) = make_uint4(0, 0, 0, 0);
    }
    // Key rows: every load of the warp's 32 keys in flight at once.
    uint4 raw[kKeyTiles][kLoads];
#pragma unroll
    for (int32_t t = 0; t < kKeyTiles; ++t) {
      const int32_t x = 32 * warp + 8 * t + g;
#pragma unroll
      for (int32_t l = 0; l < kLoads; ++l) {
        raw[t][l] = x < count ? *reinterpret_cast<const uint4*>(a.k_cache + slot_s[x] * kv_size +
                                                                head_offset + 32 * l + 8 * c)
                              : make_uint4(0, 0, 0, 0);
      }
    }
#pragma unroll
    for (int32_t t = 0; t < kKeyTiles; ++t) {
      float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
      for (int32_t k = 0; k < kSteps; ++k) {
        const uint4& r = raw[t][k / 2];
        mma_bf16_16816(acc, q_frag[k], k % 2 == 0 ? r.x : r.z, k % 2 == 0 ? r.y : r.w);
      }
      // C: (row g, keys 2c, 2c + 1) and (row g + 8, the same keys).
      const int32_t x = 32 * warp + 8 * t + 2 * c;
#pragma unroll
      for (int32_t half = 0; half < 2; ++half) {
        const int32_t row = g + 8 * half;
        if (row < group && row < G) {
          if (x < count) scores[row * kAttentionSplitKeys + x] = acc[2 * half] * scale;
          if (x + 1 < count) scores[row * kAttentionSplitKeys + x + 1] = acc[2 * half + 1] * scale;
        }
      }
    }
    const int32_t next = split + static_cast<int32_t>(gridDim.x);
    next_slot = next < splits ? slot_of(next) : 0;
    __syncthreads();
    split_softmax_pieces(scores, group, count, padded, warp, lane, m_s, l_s);  // zero past keys
    copy_async_wait_all();
    __syncthreads();  // probabilities and every thread's value rows visible
    float out[kDimPairs][2][4] = {};
    for (int32_t k0 = 0; k0 < padded; k0 += 16) {
      uint32_t p_frag[4];
#pragma unroll
      for (int32_t half = 0; half < 2; ++half) {
        const int32_t row = g + 8 * half;
        float2 lo = make_float2(0.0f, 0.0f), hi = make_float2(0.0f, 0.0f);
        if (row < group && row < G) {
          lo = *reinterpret_cast<const float2*>(scores + row * kAttentionSplitKeys + k0 + 2 * c);
          hi = *reinterpret_cast<const float2*>(scores + row * kAttentionSplitKeys + k0 + 2 * c + 8);
        }
        p_frag[half] = pack_bf16x2(lo.x, lo.y);
        p_frag[2 + half] = pack_bf16x2(hi.x, hi.y);
      }
      // ldmatrix rows: lanes 8i .. 8i + 7 address matrix i = (keys k0 + 8·(i % 2) .., dims
      // +8·(i / 2)); r0, r1 are B for the first 8 dims, r2, r3 for the next 8.
      const int32_t key = k0 + 8 * ((lane / 8) % 2) + lane % 8;
#pragma unroll
      for (int32_t p = 0; p < kDimPairs; ++p) {
        const int32_t dim = warp * kWarpDims + 16 * p + 8 * (lane / 16);
        uint32_t b[4];
        ldmatrix_x4_trans(b, value_rows + key * kValuePitch<D> + dim);
        mma_bf16_16816(out[p][0], p_frag, b[0], b[1]);
        mma_bf16_16816(out[p][1], p_frag, b[2], b[3]);
      }
    }
    // C: (row g, dims 2c, 2c + 1) and (row g + 8, the same dims) of each 8-dim tile.
#pragma unroll
    for (int32_t half = 0; half < 2; ++half) {
      const int32_t row = g + 8 * half;
      if (row >= group || row >= G) continue;
      const int32_t head = kv_head * group + row;
      float* part = splits == 1 ? nullptr
                                : partial_at(a.workspace, local_token, head, split, s.query_heads,
                                             total_splits, D);
      if (part != nullptr && warp == 0 && c == 0) part[0] = m_s[row], part[1] = l_s[row];
#pragma unroll
      for (int32_t p = 0; p < kDimPairs; ++p) {
#pragma unroll
        for (int32_t t = 0; t < 2; ++t) {
          const int32_t dim = warp * kWarpDims + 16 * p + 8 * t + 2 * c;
          const float v0 = out[p][t][2 * half], v1 = out[p][t][2 * half + 1];
          if (part == nullptr) {
            bf16* o = a.out + int64_t{token} * q_size + int64_t{head} * D + dim;
            *reinterpret_cast<__nv_bfloat162*>(o) =
                __floats2bfloat162_rn(v0 / l_s[row], v1 / l_s[row]);
          } else {
            part[2 + dim] = v0;
            part[2 + dim + 1] = v1;
          }
        }
      }
    }
  }
}

}  // namespace
}  // namespace ls::kernels
