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
//    tile filled by cp.async, read as B fragments with ldmatrix.trans. Warp w owns dims
//    [w·d/4, (w + 1)·d/4) over all the split's keys, so no cross-warp sum.
//  * At head_dim 64, reads run a split ahead: once a split's keys are scored, the next split's
//    keys are loaded into the registers they leave and its values into a second value tile, so
//    the DRAM works through this split's softmax and P·V. Not at 128: two tiles there leave room
//    for 3 blocks an SM instead of 4, and the H200 run of 2026-12-05 measured llama-8b's batch 64
//    at 118.5 µs against 91.0 (llama-1b's 53.7 against 55.5).
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

// Row pitch of the scores in shared memory, in floats: 8 more than a split's keys, so that the
// MMA's C fragments (rows g, keys 2c, 2c + 1) stored, and the P fragments loaded, fall in
// different banks for the four rows of a group of 4 (with a pitch of 128 every row hit the same).
constexpr int32_t kScorePitch = kAttentionSplitKeys + 8;

// Elements of one split's value tile in shared memory.
template <int32_t D>
constexpr int32_t kValueTile = kAttentionSplitKeys * kValuePitch<D>;

// Whether a split's reads start while the previous split's softmax and P·V run (see the top).
template <int32_t D>
constexpr bool kReadsAhead = D == 64;

// Value tiles: the split being summed, and the next one in flight where reads run ahead.
template <int32_t D>
constexpr int32_t kValueTiles = kReadsAhead<D> ? 2 : 1;

template <int32_t D>
constexpr size_t mma_shared_bytes() {
  return size_t{kValueTiles<D>} * kValueTile<D> * sizeof(bf16);
}

// kLeaveOut: 0, or one of AttentionLeaveOut's split-kernel bits (the benchmark's profile).
template <int32_t D, int32_t G, uint32_t kLeaveOut = 0>
__global__ void __launch_bounds__(kThreads, 4) attention_mma_kernel(AttentionArgs<bf16> a) {
  static_assert(D % 32 == 0 && D / kWarps % 16 == 0, "head_dim 64 or 128");
  static_assert(G <= kMmaRows, "a group fits the MMA tile");
  constexpr int32_t kSteps = D / 16;              // k-steps of the scores
  constexpr int32_t kLoads = D / 32;              // 16-byte key loads per key tile
  constexpr int32_t kWarpDims = D / kWarps;       // output dims per warp
  constexpr int32_t kDimPairs = kWarpDims / 16;   // ldmatrix.x4 per k-step (two 8-dim tiles each)
  constexpr int32_t kKeyTiles = 32 / 8;           // 8-key tiles per warp
  extern __shared__ __align__(16) unsigned char mma_shared[];
  bf16* value_rows = reinterpret_cast<bf16*>(mma_shared);  // [tiles][split keys, kValuePitch<D>]
  __shared__ __align__(16) float scores[G * kScorePitch];
  __shared__ int64_t slot_s[kValueTiles<D>][kAttentionSplitKeys];
  __shared__ float m_s[G];
  __shared__ float l_s[G];
  allow_successor();
  // Before the wait: the block's token, keys and the slots of its first splits (split_block,
  // slot_of). Only the step's inputs feed them, which are final before the predecessor started
  // (kernels/launch.cuh), so this chain of dependent reads runs under the predecessor's tail.
  const AttentionShape& s = a.shape;
  const SplitBlock block = split_block(a);  // named copies: CUDA's C++17 lambdas capture them
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

  const auto slot_of = [&](int32_t split) -> int64_t {
    const int32_t p = split * kAttentionSplitKeys + static_cast<int32_t>(threadIdx.x);
    if (p >= keys) return 0;
    return ops::slot_in_table(table_row, s.page_size, p);
  };
  const int32_t stride = static_cast<int32_t>(gridDim.x);
  int32_t split = blockIdx.x;
  int64_t next_slot = slot_of(split);  // 0 past the keys (a block past the splits returns below)
  const int64_t ahead_slot = kReadsAhead<D> ? slot_of(split + stride) : 0;
  wait_for_predecessor();
  if constexpr (kLeaveOut == kAttentionSplitBody) return;
  if (split >= splits) return;

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
  // Starts a split's reads, its slots in `slots`: the value rows into `values` by cp.async (one
  // commit group), the rows past its keys up to the next k-step boundary zeroed (their
  // probabilities are zero, and 0·NaN of a stale row would not be); the key rows into `raw`, every
  // load of the warp's 32 keys in flight at once. With the K/V reads left out (the profile's form)
  // no row is read: keys and values are zeros up to `padded`, so the output stays finite.
  constexpr int32_t kPieces = D / 8;  // 16-byte pieces of a row
  constexpr bool kReadsRows = kLeaveOut != kAttentionKvReads;
  // With the arithmetic left out (the profile's form) the key rows still land in registers: their
  // words are folded into `sink`, which a condition the compiler cannot decide keeps alive.
  constexpr bool kComputes = kLeaveOut != kAttentionArithmetic;
  uint32_t sink = 0;
  uint4 raw[kKeyTiles][kLoads];
  const auto start_reads = [&](int32_t split, const int64_t* slots, bf16* values) {
    const int32_t count = min(kAttentionSplitKeys, keys - split * kAttentionSplitKeys);
    const int32_t padded = (count + 15) / 16 * 16;
    const int32_t read = kReadsRows ? count : 0;  // rows read; the rest up to `padded` are zeroed
    for (int32_t idx = threadIdx.x; idx < read * kPieces; idx += kThreads) {
      const int32_t x = idx / kPieces;
      const int32_t j = idx - x * kPieces;
      copy_async_16(values + x * kValuePitch<D> + 8 * j,
                    a.v_cache + slots[x] * kv_size + head_offset + 8 * j);
    }
    copy_async_commit();
    for (int32_t idx = read * kPieces + threadIdx.x; idx < padded * kPieces; idx += kThreads) {
      const int32_t x = idx / kPieces;
      const int32_t j = idx - x * kPieces;
      *reinterpret_cast<uint4*>(values + x * kValuePitch<D> + 8 * j) = make_uint4(0, 0, 0, 0);
    }
#pragma unroll
    for (int32_t t = 0; t < kKeyTiles; ++t) {
      const int32_t x = 32 * warp + 8 * t + g;
#pragma unroll
      for (int32_t l = 0; l < kLoads; ++l) {
        raw[t][l] = x < read ? *reinterpret_cast<const uint4*>(a.k_cache + slots[x] * kv_size +
                                                               head_offset + 32 * l + 8 * c)
                             : make_uint4(0, 0, 0, 0);
      }
    }
  };
  // Where reads run ahead, while a split's softmax and P·V run the next split's keys are in flight
  // into `raw` and its values into the other value tile, and the slots of the split after it are
  // found (slot_s[b]: the slots of the splits taken with value tile b; the first two splits' were
  // found before the wait). Otherwise a split's reads start at its beginning, its slots found
  // while the previous split's softmax and P·V ran (the first split's before the wait).
  if constexpr (kReadsAhead<D>) {
    slot_s[0][threadIdx.x] = next_slot;
    __syncthreads();
    start_reads(split, slot_s[0], value_rows);
    if (split + stride < splits) slot_s[1][threadIdx.x] = ahead_slot;
  }
  for (int32_t tile = 0; split < splits; split += stride, tile = (tile + 1) % kValueTiles<D>) {
    const int32_t next = split + stride;
    const int32_t first = split * kAttentionSplitKeys;
    const int32_t count = min(kAttentionSplitKeys, keys - first);
    const int32_t padded = (count + 15) / 16 * 16;  // keys the P·V k-steps cover
    // The previous split's probabilities, m and l read and its value tile free; where reads run
    // ahead, this split's slots visible.
    __syncthreads();
    if constexpr (!kReadsAhead<D>) {
      slot_s[0][threadIdx.x] = next_slot;
      __syncthreads();
      start_reads(split, slot_s[0], value_rows);
    }
#pragma unroll
    for (int32_t t = 0; t < kKeyTiles; ++t) {
      if constexpr (!kComputes) {
#pragma unroll
        for (int32_t l = 0; l < kLoads; ++l) {
          sink ^= raw[t][l].x ^ raw[t][l].y ^ raw[t][l].z ^ raw[t][l].w;
        }
        continue;  // no scores
      }
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
        if constexpr (kReadsAhead<D>) {  // a pair a store (at head_dim 128 it costs a spill)
          // Key x + 1 may be past the split's keys (its score is then 0, from zero rows): the
          // softmax zeroes it before P·V reads it.
          if (row < group && row < G && x < count) {
            *reinterpret_cast<float2*>(scores + row * kScorePitch + x) =
                make_float2(acc[2 * half] * scale, acc[2 * half + 1] * scale);
          }
        } else if (row < group && row < G) {
          if (x < count) scores[row * kScorePitch + x] = acc[2 * half] * scale;
          if (x + 1 < count) scores[row * kScorePitch + x + 1] = acc[2 * half + 1] * scale;
        }
      }
    }
    if constexpr (kReadsAhead<D>) {
      const int32_t other = tile ^ 1;
      if (next < splits) start_reads(next, slot_s[other], value_rows + other * kValueTile<D>);
    } else {
      next_slot = next < splits ? slot_of(next) : 0;  // a table read under the softmax and P·V
    }
    __syncthreads();
    if constexpr (kComputes) {
      split_softmax_pieces(scores, kScorePitch, group, count, padded, warp, lane, m_s,
                           l_s);  // zeroes past the keys
    }
    if (kReadsAhead<D> && next < splits) {
      copy_async_wait_older();  // this split's value rows, the next split's still in flight
    } else {
      copy_async_wait_all();
    }
    __syncthreads();  // probabilities and every thread's value rows visible
    if constexpr (kComputes) {
      const bf16* values = value_rows + tile * kValueTile<D>;
      float out[kDimPairs][2][4] = {};
      for (int32_t k0 = 0; k0 < padded; k0 += 16) {
        uint32_t p_frag[4];
#pragma unroll
        for (int32_t half = 0; half < 2; ++half) {
          const int32_t row = g + 8 * half;
          float2 lo = make_float2(0.0f, 0.0f), hi = make_float2(0.0f, 0.0f);
          if (row < group && row < G) {
            lo = *reinterpret_cast<const float2*>(scores + row * kScorePitch + k0 + 2 * c);
            hi = *reinterpret_cast<const float2*>(scores + row * kScorePitch + k0 + 2 * c + 8);
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
          ldmatrix_x4_trans(b, values + key * kValuePitch<D> + dim);
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
            } else {  // a partial is 8-byte aligned (head_dim + 2 floats) and dim even
              *reinterpret_cast<float2*>(part + 2 + dim) = make_float2(v0, v1);
            }
          }
        }
      }
    }  // kComputes
    // The slots of the split after next, where this split's were (every thread read those when it
    // started this split's reads, before this split's first barrier).
    if constexpr (kReadsAhead<D>) {
      if (next + stride < splits) slot_s[tile][threadIdx.x] = slot_of(next + stride);
    }
  }
  if constexpr (!kComputes) {
    if (sink == static_cast<uint32_t>(keys) * 0x9e3779b9u + 0x7f4a7c15u) a.workspace[0] = 0.0f;
  }
}

}  // namespace
}  // namespace ls::kernels
