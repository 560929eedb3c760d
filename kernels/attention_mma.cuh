// Paged attention on the tensor cores, for bf16 KV with head_dim 64 or 128 (the production
// models: llama-1b, llama-8b): the arithmetic of one (row, split) that both tensor-core kernels
// share, and the decode kernel. Included by attention.cu only; the prefill kernel that reuses
// this arithmetic is attention_tiles.cuh.
//
// A row is one (token, query head). Its output is fixed by this arithmetic alone, whichever
// kernel, block, warp or tile computes it:
//
//  * Scores S = Q·Kᵀ of a split with mma.m16n8k16 (bf16 Q and K, fp32 accumulate): k-steps in
//    ascending order over a permuted head_dim — the same permutation for Q and K, so each dot
//    product is unchanged — in which thread (g, c) of an 8-key tile takes the 16 bytes at dims
//    [32s + 8c, 32s + 8c + 8) of key g's row for k-steps 2s (words 0, 1) and 2s + 1 (words 2, 3):
//    one 16-byte load per two k-steps, from global memory (decode) or shared memory (prefill).
//  * The split's softmax in fp32 on the MMA's C layout (split_softmax): the scores are scaled,
//    masked past the row's keys, m is their maximum, the probabilities e = exp(s − m), and
//    l = Σ e summed by each thread over its 32 keys in a fixed order, then over its quad by two
//    xor shuffles (the same sum in all four threads of the quad).
//  * P·V with mma.m16n8k16 over all eight 16-key steps of the split in ascending order (P bf16,
//    V by ldmatrix.trans; keys past the split's loaded rows have probability 0 and zeroed rows).
//  * Splits merged in ascending order into a running (m, l, o) by merge_weights / merged, then
//    o / l: in registers when one block computes every split of the row, by the combine kernel
//    from the per-split partials otherwise — the same operations either way.
//
// Each MMA output element depends only on its own row of A and column of B, so neither the rows a
// tile holds nor the warp that takes them change a row's bits: a token of a prefill tile has the
// bits it has alone at decode, and a decode row the bits it has in any batch.
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

constexpr int32_t kMmaRows = 16;                            // rows of an m16 tile
constexpr int32_t kKeyTiles = kAttentionSplitKeys / 8;      // n8 tiles of a split's scores
constexpr int32_t kKeySteps = kAttentionSplitKeys / 16;     // k16 steps of P·V
constexpr int32_t kScorePitch = kAttentionSplitKeys + 8;    // floats: float2 rows in distinct banks

// Shared-memory row pitch of value rows, in elements: 8 more than head_dim, so the eight 16-byte
// rows an ldmatrix phase reads fall in different banks.
template <int32_t D>
constexpr int32_t kValuePitch = D + 8;

// A fragments of Q for k-steps 2s and 2s + 1 from the 16-byte pieces of rows g and g + 8 at dims
// 32s + 8c (the permuted order: see the top of the file).
__device__ __forceinline__ void query_fragments(const uint4& row_g, const uint4& row_g8,
                                                uint32_t (&even)[4], uint32_t (&odd)[4]) {
  even[0] = row_g.x, even[1] = row_g8.x, even[2] = row_g.y, even[3] = row_g8.y;
  odd[0] = row_g.z, odd[1] = row_g8.z, odd[2] = row_g.w, odd[3] = row_g8.w;
}

// k-steps 2s, 2s + 1 of an 8-key score tile, from key g's 16-byte piece at dims 32s + 8c.
__device__ __forceinline__ void score_step_pair(float (&acc)[4], const uint32_t (&even)[4],
                                                const uint32_t (&odd)[4], const uint4& key) {
  mma_bf16_16816(acc, even, key.x, key.y);
  mma_bf16_16816(acc, odd, key.z, key.w);
}

// The split's softmax of row g + 8h (h = 0, 1: columns 2h, 2h + 1 of the C layout of the split's
// 16 score tiles, s[t][2h + j]: key 8t + 2c + j): scores scaled, keys >= count masked
// (probability 0; count <= 0: m = −inf, l = 0), m and l the same in the quad's four threads.
// Every operation is spelled out (no contraction left to the compiler).
__device__ __forceinline__ void split_softmax(float (&s)[kKeyTiles][4], int32_t h, int32_t count,
                                              float scale, int32_t c, float& m, float& l) {
  float row_max = -INFINITY;
#pragma unroll
  for (int32_t t = 0; t < kKeyTiles; ++t) {
#pragma unroll
    for (int32_t j = 0; j < 2; ++j) {
      const float x = __fmul_rn(s[t][2 * h + j], scale);
      s[t][2 * h + j] = x;
      if (8 * t + 2 * c + j < count) row_max = fmaxf(row_max, x);
    }
  }
  row_max = fmaxf(row_max, __shfl_xor_sync(0xffffffffu, row_max, 1));
  row_max = fmaxf(row_max, __shfl_xor_sync(0xffffffffu, row_max, 2));
  float sum = 0.0f;
#pragma unroll
  for (int32_t t = 0; t < kKeyTiles; ++t) {
#pragma unroll
    for (int32_t j = 0; j < 2; ++j) {
      const bool live = 8 * t + 2 * c + j < count;
      const float e = live ? expf(__fsub_rn(s[t][2 * h + j], row_max)) : 0.0f;
      s[t][2 * h + j] = e;
      sum = __fadd_rn(sum, e);
    }
  }
  sum = __fadd_rn(sum, __shfl_xor_sync(0xffffffffu, sum, 1));
  sum = __fadd_rn(sum, __shfl_xor_sync(0xffffffffu, sum, 2));
  m = row_max;
  l = sum;
}

// P's A fragment for keys 16k .. 16k + 15 from the probabilities in C layout.
__device__ __forceinline__ void probability_fragment(uint32_t (&p)[4],
                                                     const float (&s)[kKeyTiles][4], int32_t k) {
  p[0] = pack_bf16x2(s[2 * k][0], s[2 * k][1]);
  p[1] = pack_bf16x2(s[2 * k][2], s[2 * k][3]);
  p[2] = pack_bf16x2(s[2 * k + 1][0], s[2 * k + 1][1]);
  p[3] = pack_bf16x2(s[2 * k + 1][2], s[2 * k + 1][3]);
}

// The same fragment from probabilities in shared memory (rows of kScorePitch floats).
__device__ __forceinline__ void probability_fragment(uint32_t (&p)[4], const float* rows,
                                                     int32_t k, int32_t g, int32_t c) {
#pragma unroll
  for (int32_t half = 0; half < 2; ++half) {
    const float* row = rows + (g + 8 * half) * kScorePitch + 16 * k + 2 * c;
    const float2 lo = *reinterpret_cast<const float2*>(row);
    const float2 hi = *reinterpret_cast<const float2*>(row + 8);
    p[half] = pack_bf16x2(lo.x, lo.y);
    p[2 + half] = pack_bf16x2(hi.x, hi.y);
  }
}

// Two 8-dim tiles of P·V (dims dim0 .. dim0 + 15) for one 16-key step: V's B fragments by
// ldmatrix.trans from the value rows, lanes 8i .. 8i + 7 addressing matrix i = (keys
// 16k + 8·(i % 2) .., dims dim0 + 8·(i / 2)).
template <int32_t D>
__device__ __forceinline__ void weigh_step(float (&lo)[4], float (&hi)[4], const uint32_t (&p)[4],
                                           const bf16* value_rows, int32_t k, int32_t dim0,
                                           int32_t lane) {
  const int32_t key = 16 * k + 8 * ((lane / 8) % 2) + lane % 8;
  uint32_t b[4];
  ldmatrix_x4_trans(b, value_rows + key * kValuePitch<D> + dim0 + 8 * (lane / 16));
  mma_bf16_16816(lo, p, b[0], b[1]);
  mma_bf16_16816(hi, p, b[2], b[3]);
}

// A row's output so far (over its splits merged in order) with a split's (m, l, o) merged in:
// w = merge_weights(m, split_m); l = merged(l, split_l, w); o = merged(o, split_o, w); m = w.m.
// The first split (m = −inf, l = o = 0) comes out exactly as computed. Spelled out, so the
// combine kernel and the blocks that merge in registers give the same bits.
struct MergeWeights {
  float m, old_weight, split_weight;
};
__device__ __forceinline__ MergeWeights merge_weights(float m, float split_m) {
  const float merged_m = fmaxf(m, split_m);
  return {merged_m, expf(__fsub_rn(m, merged_m)), expf(__fsub_rn(split_m, merged_m))};
}
__device__ __forceinline__ float merged(float x, float split_x, const MergeWeights& w) {
  return __fadd_rn(__fmul_rn(x, w.old_weight), __fmul_rn(split_x, w.split_weight));
}

// Dynamic shared memory of the decode kernel: one split's value rows (fp32 scores, slots, m and
// l are static): 34 KB + 9 KB for head_dim 128, so four blocks fit an SM.
template <int32_t D>
constexpr size_t decode_shared_bytes() {
  return size_t{kAttentionSplitKeys} * kValuePitch<D> * sizeof(bf16);
}

// Decode and short launches. grid: (split lanes, kv heads, tokens), like the CUDA-core kernel: a
// block takes one token's group of query heads (rows g < group of one m16 tile; the rest are
// computed and dropped) and the splits lane, lane + lanes, ... Per split, the value rows are
// copied to shared memory by cp.async while each warp loads its 32 keys' rows straight into
// registers (every load in flight at once) and scores them; the scores go through shared memory
// to warp 0, which runs split_softmax for the tile's 16 rows; every warp then takes D / 4 dims of
// P·V. With one lane, or a token of one split, the block merges the splits in registers and
// writes the output; otherwise it writes each split's partial (m, l, o) and the combine kernel
// merges them.
template <int32_t D>
__global__ void __launch_bounds__(kThreads, 4) attention_decode_kernel(AttentionArgs<bf16> a) {
  static_assert(D == 64 || D == 128, "head_dim 64 or 128");
  constexpr int32_t kSteps = D / 16;              // k-steps of the scores
  constexpr int32_t kLoads = D / 32;              // 16-byte key loads per key
  constexpr int32_t kWarpDims = D / kWarps;       // output dims per warp
  constexpr int32_t kDimPairs = kWarpDims / 16;   // ldmatrix.x4 per k-step (two 8-dim tiles each)
  constexpr int32_t kWarpKeyTiles = 32 / 8;       // 8-key tiles per warp
  constexpr int32_t kPieces = D / 8;              // 16-byte pieces of a row
  extern __shared__ __align__(16) unsigned char decode_shared[];
  bf16* value_rows = reinterpret_cast<bf16*>(decode_shared);  // [split keys, kValuePitch<D>]
  __shared__ __align__(16) float scores[kMmaRows * kScorePitch];
  __shared__ int64_t slot_s[kAttentionSplitKeys];
  __shared__ float m_s[kMmaRows];
  __shared__ float l_s[kMmaRows];
  allow_successor();
  wait_for_predecessor();
  const AttentionShape& s = a.shape;
  const SplitBlock block = split_block(a);  // named copies: CUDA's C++17 lambdas capture them
  if (static_cast<int32_t>(blockIdx.x) >= block.splits) return;
  const int32_t local_token = block.local_token, token = block.token, kv_head = block.kv_head,
                group = block.group, keys = block.keys, splits = block.splits,
                total_splits = block.total_splits;
  const int32_t* table_row = block.table_row;
  const bool merge_here = gridDim.x == 1 || splits == 1;  // every split of the token in this block
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
  float run_m[2] = {-INFINITY, -INFINITY}, run_l[2] = {0.0f, 0.0f};
  float run[kDimPairs][2][4] = {};
  int64_t next_slot = slot_of(blockIdx.x);
  for (int32_t split = blockIdx.x; split < splits; split += gridDim.x) {
    const int32_t first = split * kAttentionSplitKeys;
    const int32_t count = min(kAttentionSplitKeys, keys - first);
    __syncthreads();  // the previous split's slots, scores and value rows consumed
    slot_s[threadIdx.x] = next_slot;
    __syncthreads();
    // Value rows → shared memory, in flight while the keys are scored; the rows past the split's
    // keys are zeroed (their probabilities are zero, and 0·NaN of a stale row would not be).
    for (int32_t idx = threadIdx.x; idx < count * kPieces; idx += kThreads) {
      const int32_t x = idx / kPieces;
      const int32_t j = idx - x * kPieces;
      copy_async_16(value_rows + x * kValuePitch<D> + 8 * j,
                    a.v_cache + slot_s[x] * kv_size + head_offset + 8 * j);
    }
    copy_async_commit();
    for (int32_t idx = count * kPieces + threadIdx.x; idx < kAttentionSplitKeys * kPieces;
         idx += kThreads) {
      const int32_t x = idx / kPieces;
      const int32_t j = idx - x * kPieces;
      *reinterpret_cast<uint4*>(value_rows + x * kValuePitch<D> + 8 * j) = make_uint4(0, 0, 0, 0);
    }
    // Key rows: every load of the warp's 32 keys in flight at once (zero past the split's keys).
    uint4 raw[kWarpKeyTiles][kLoads];
#pragma unroll
    for (int32_t t = 0; t < kWarpKeyTiles; ++t) {
      const int32_t x = 32 * warp + 8 * t + g;
#pragma unroll
      for (int32_t l = 0; l < kLoads; ++l) {
        raw[t][l] = x < count ? *reinterpret_cast<const uint4*>(a.k_cache + slot_s[x] * kv_size +
                                                                head_offset + 32 * l + 8 * c)
                              : make_uint4(0, 0, 0, 0);
      }
    }
#pragma unroll
    for (int32_t t = 0; t < kWarpKeyTiles; ++t) {
      float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
      for (int32_t l = 0; l < kLoads; ++l) {
        score_step_pair(acc, q_frag[2 * l], q_frag[2 * l + 1], raw[t][l]);
      }
      const int32_t x = 32 * warp + 8 * t + 2 * c;  // C: rows g, g + 8; keys x, x + 1
      *reinterpret_cast<float2*>(scores + g * kScorePitch + x) = make_float2(acc[0], acc[1]);
      *reinterpret_cast<float2*>(scores + (g + 8) * kScorePitch + x) = make_float2(acc[2], acc[3]);
    }
    const int32_t next = split + static_cast<int32_t>(gridDim.x);
    next_slot = next < splits ? slot_of(next) : 0;
    __syncthreads();  // every warp's scores
    if (warp == 0) {
#pragma unroll
      for (int32_t half = 0; half < 2; ++half) {  // rows g + 8·half, one at a time (registers)
        if (8 * half >= group) break;
        float* rows = scores + (g + 8 * half) * kScorePitch + 2 * c;
        float sc[kKeyTiles][4];  // columns 2·half, 2·half + 1 used
#pragma unroll
        for (int32_t t = 0; t < kKeyTiles; ++t) {
          const float2 v = *reinterpret_cast<const float2*>(rows + 8 * t);
          sc[t][2 * half] = v.x, sc[t][2 * half + 1] = v.y;
        }
        float m, l;
        split_softmax(sc, half, g + 8 * half < group ? count : 0, scale, c, m, l);
#pragma unroll
        for (int32_t t = 0; t < kKeyTiles; ++t) {
          *reinterpret_cast<float2*>(rows + 8 * t) =
              make_float2(sc[t][2 * half], sc[t][2 * half + 1]);
        }
        if (c == 0) m_s[g + 8 * half] = m, l_s[g + 8 * half] = l;
      }
    }
    copy_async_wait_all();
    __syncthreads();  // probabilities, m, l and every thread's value rows visible
    float out[kDimPairs][2][4] = {};
#pragma unroll
    for (int32_t k = 0; k < kKeySteps; ++k) {
      uint32_t p_frag[4];
      probability_fragment(p_frag, scores, k, g, c);
#pragma unroll
      for (int32_t p = 0; p < kDimPairs; ++p) {
        weigh_step<D>(out[p][0], out[p][1], p_frag, value_rows, k, warp * kWarpDims + 16 * p, lane);
      }
    }
    // C: (row g, dims 2c, 2c + 1) and (row g + 8, the same dims) of each 8-dim tile.
#pragma unroll
    for (int32_t half = 0; half < 2; ++half) {
      const int32_t row = g + 8 * half;
      if (row >= group) continue;
      const int32_t head = kv_head * group + row;
      if (merge_here) {
        const MergeWeights w = merge_weights(run_m[half], m_s[row]);
        run_l[half] = merged(run_l[half], l_s[row], w);
        run_m[half] = w.m;
#pragma unroll
        for (int32_t p = 0; p < kDimPairs; ++p) {
#pragma unroll
          for (int32_t t = 0; t < 2; ++t) {
#pragma unroll
            for (int32_t j = 0; j < 2; ++j) {
              run[p][t][2 * half + j] = merged(run[p][t][2 * half + j], out[p][t][2 * half + j], w);
            }
          }
        }
        continue;
      }
      float* part =
          partial_at(a.workspace, local_token, head, split, s.query_heads, total_splits, D);
      if (warp == 0 && c == 0) part[0] = m_s[row], part[1] = l_s[row];
#pragma unroll
      for (int32_t p = 0; p < kDimPairs; ++p) {
#pragma unroll
        for (int32_t t = 0; t < 2; ++t) {
          const int32_t dim = warp * kWarpDims + 16 * p + 8 * t + 2 * c;
          *reinterpret_cast<float2*>(part + 2 + dim) =
              make_float2(out[p][t][2 * half], out[p][t][2 * half + 1]);
        }
      }
    }
  }
  if (!merge_here) return;
#pragma unroll
  for (int32_t half = 0; half < 2; ++half) {
    const int32_t row = g + 8 * half;
    if (row >= group) continue;
    bf16* o = a.out + int64_t{token} * q_size + int64_t{kv_head * group + row} * D;
#pragma unroll
    for (int32_t p = 0; p < kDimPairs; ++p) {
#pragma unroll
      for (int32_t t = 0; t < 2; ++t) {
        const int32_t dim = warp * kWarpDims + 16 * p + 8 * t + 2 * c;
        *reinterpret_cast<__nv_bfloat162*>(o + dim) =
            __floats2bfloat162_rn(__fdiv_rn(run[p][t][2 * half], run_l[half]),
                                  __fdiv_rn(run[p][t][2 * half + 1], run_l[half]));
      }
    }
  }
}

}  // namespace
}  // namespace ls::kernels
