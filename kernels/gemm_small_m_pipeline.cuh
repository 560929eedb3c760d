// The small-M GEMM's block pipeline (kernels/gemm_small_m.cu describes the design and launches
// it): a block's 128 rows of one tile streamed over its K range through cp.async stages into
// shared memory and multiplied there by wgmma, one warpgroup for each 64 of its rows.
#pragma once

#include "kernels/gemm_small_m_layout.h"
#include "kernels/gemm_small_m_norm.cuh"
#include "kernels/launch.cuh"
#include "kernels/wgmma.cuh"

#include <cstddef>
#include <cstdint>

namespace ls::kernels::small_m {

constexpr int32_t kChunk = 64;  // k a pipeline stage holds
constexpr int32_t kStages = 4;
constexpr int32_t kMmaInFlight = 1;  // stages whose MMAs may still run when the next are issued
constexpr int32_t kAhead = kStages - 1 - kMmaInFlight;  // stages loaded ahead of the MMAs
static_assert(kAhead >= 1, "a stage loads while another multiplies");
constexpr int32_t kRowBytes = kChunk * 2;              // one row of a stage
constexpr int32_t kPieces = kRowBytes / 16;            // its 16-byte pieces
constexpr int32_t kSteps = kChunk / 16;                  // wgmma k16 steps a chunk
constexpr uint32_t kStepBytes = 16 * sizeof(bf16);         // how far a k16 step is into a row
constexpr int32_t kWarpgroupThreads = kThreads / kWarpgroups;
static_assert(kRowBytes == 128, "a stage row is one 128-byte swizzle row");
static_assert(kWarpgroupRows == 64, "a warpgroup's rows are one wgmma's M");
// wgmma's swizzle atoms are 1024-aligned: the dynamic shared memory is aligned at run time, and a
// stage's parts (128 weight rows, then 8 token rows an n-tile) keep it.
constexpr size_t kSwizzleAtom = 1024;
static_assert(kTileRows * kRowBytes % kSwizzleAtom == 0 && 8 * kRowBytes == kSwizzleAtom,
              "stages, weight tiles and n-tiles start on swizzle atoms");

template <int32_t NT>
constexpr size_t kStageBytes = size_t{kTileRows + 8 * NT} * kRowBytes;
template <int32_t NT>
constexpr size_t kSharedBytes = kStages * kStageBytes<NT>;

__device__ __forceinline__ uint32_t swizzled(int32_t row, int32_t piece) {
  return static_cast<uint32_t>(row * kRowBytes + ((piece ^ (row & 7)) << 4));
}

__device__ __forceinline__ uint64_t evict_first_policy() {
  uint64_t policy = 0;
  asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;\n" : "=l"(policy));
  return policy;
}

// 16 bytes global → shared without registers; `valid` false writes 16 zero bytes and reads
// nothing (src-size 0), which pads rows past `out`, tokens past `tokens` and k past `in`.
__device__ __forceinline__ void copy_16(uint32_t shared, const void* global, bool valid) {
  asm volatile("cp.async.cg.shared.global.L2::128B [%0], [%1], 16, %2;\n" ::"r"(shared),
               "l"(global), "r"(valid ? 16 : 0)
               : "memory");
}
__device__ __forceinline__ void copy_16_streamed(uint32_t shared, const void* global, bool valid,
                                                 uint64_t policy) {
  asm volatile(
      "cp.async.cg.shared.global.L2::cache_hint.L2::256B [%0], [%1], 16, %2, %3;\n" ::"r"(shared),
      "l"(global), "r"(valid ? 16 : 0), "l"(policy)
      : "memory");
}
__device__ __forceinline__ void commit_copies() {
  asm volatile("cp.async.commit_group;\n" ::: "memory");
}
// Returns once at most `kPending` of the committed groups are still in flight.
template <int32_t kPending>
__device__ __forceinline__ void wait_copies() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(kPending) : "memory");
}

// Where stage `stage` (a chunk index within the block's K range) lives and what it covers.
template <int32_t NT>
struct Stage {
  uint32_t weights;  // shared address of [kTileRows][kRowBytes]
  uint32_t x;        // shared address of [8·NT][kRowBytes]
  int32_t k0;        // first k
};

template <int32_t NT>
__device__ __forceinline__ Stage<NT> stage_at(uint32_t shared, int32_t first_chunk, int32_t s) {
  const uint32_t base = shared + static_cast<uint32_t>((s % kStages) * kStageBytes<NT>);
  return {base, base + static_cast<uint32_t>(kTileRows * kRowBytes), (first_chunk + s) * kChunk};
}

// The weight rows a thread copies at every stage: rows tid / 8 + 32i of the tile (piece tid % 8),
// their rows of w (tile_row_weight; -1 past `out`). Worked out once a block, not at every stage:
// a paired epilogue's map divides by a runtime width, which at every stage cost the SwiGLU
// product at 64 tokens 45% (H200 run of 010ffeb: llama-8b gate/up 3.76 ms a step against 2.59).
constexpr int32_t kRowsPerThread = kTileRows * kPieces / kThreads;
struct WeightRows {
  int32_t row[kRowsPerThread];
};

__device__ __forceinline__ WeightRows weight_rows_of(const Params& p, int32_t tile) {
  WeightRows rows;
#pragma unroll
  for (int32_t i = 0; i < kRowsPerThread; ++i) {
    const int32_t r = static_cast<int32_t>(threadIdx.x) / kPieces + i * (kThreads / kPieces);
    rows.row[i] = tile_row_weight(p, tile, r);
  }
  return rows;
}

// The block's weight rows of one stage: 1024 pieces, 4 a thread.
template <int32_t NT>
__device__ __forceinline__ void load_weights(const Params& p, const WeightRows& rows,
                                             Stage<NT> st, uint64_t policy) {
  const int32_t piece = static_cast<int32_t>(threadIdx.x) % kPieces;
  const int32_t k = st.k0 + 8 * piece;
#pragma unroll
  for (int32_t i = 0; i < kRowsPerThread; ++i) {
    const int32_t r = static_cast<int32_t>(threadIdx.x) / kPieces + i * (kThreads / kPieces);
    const bool valid = rows.row[i] >= 0 && k < p.in;
    const bf16* src = valid ? p.w + int64_t{rows.row[i]} * p.in + k : p.w;
    copy_16_streamed(st.weights + swizzled(r, piece), src, valid, policy);
  }
}

// The same k chunk of every token row of the n-tiles (zeros past `tokens`).
template <int32_t NT>
__device__ __forceinline__ void load_x(const Params& p, Stage<NT> st) {
  for (int32_t idx = static_cast<int32_t>(threadIdx.x); idx < 8 * NT * kPieces; idx += kThreads) {
    const int32_t t = idx / kPieces, piece = idx % kPieces;
    const int32_t k = st.k0 + 8 * piece;
    const bool valid = t < p.tokens && k < p.in;
    const bf16* src = valid ? p.x + int64_t{t} * p.in + k : p.x;
    copy_16(st.x + swizzled(t, piece), src, valid);
  }
}

// One stage's MMAs of a warpgroup: its 64 rows × NT n-tiles, the chunk's k16 steps in k order,
// issued as one wgmma group; the caller waits for them.
template <int32_t NT>
__device__ __forceinline__ void multiply(Stage<NT> st, int32_t warpgroup, float (&acc)[NT][4]) {
  const uint32_t weights =
      st.weights + static_cast<uint32_t>(warpgroup * kWarpgroupRows * kRowBytes);
  wgmma::fence();
#pragma unroll
  for (int32_t step = 0; step < kSteps; ++step) {
    const uint32_t k_bytes = kStepBytes * static_cast<uint32_t>(step);
    wgmma::mma_k16<NT>(acc, wgmma::descriptor_sw128(weights + k_bytes),
                       wgmma::descriptor_sw128(st.x + k_bytes));
  }
  wgmma::commit();
}

// The folded norm's x (one token): token 0 of each stage's x rows is the stage's chunk of the
// region, copied in before the stage's barrier; tokens 1-7, zeroed once for every buffer, stay
// zero. Without the fold, load_x's cp.async writes the same zeros past `tokens`.
__device__ __forceinline__ void zero_folded_rows(uint32_t shared) {
  for (int32_t idx = static_cast<int32_t>(threadIdx.x); idx < kStages * 7 * kPieces;
       idx += kThreads) {
    const int32_t s = idx / (7 * kPieces), row = 1 + (idx / kPieces) % 7, piece = idx % kPieces;
    const uint32_t at = stage_at<1>(shared, 0, s).x + swizzled(row, piece);
    *static_cast<uint4*>(__cvta_shared_to_generic(at)) = make_uint4(0, 0, 0, 0);
  }
}
__device__ __forceinline__ void copy_folded_chunk(uint32_t region, Stage<1> st, int32_t s) {
  const int32_t piece = static_cast<int32_t>(threadIdx.x);
  if (piece >= kPieces) return;
  const uint32_t from = region + static_cast<uint32_t>(s * kRowBytes + 16 * piece);
  *static_cast<uint4*>(__cvta_shared_to_generic(st.x + swizzled(0, piece))) =
      *static_cast<const uint4*>(__cvta_shared_to_generic(from));
}

// The block's K range through the pipeline: kStages buffers, kMmaInFlight stages' MMAs still
// running while the next stage's are issued, and the loads kAhead = kStages − 1 − kMmaInFlight
// stages ahead (a buffer is refilled once every warpgroup's MMAs of it are done: each waited for
// them before the barrier that precedes the refill). The first stages' weight loads go out before
// the wait for the predecessor kernel (kernels/launch.h: nothing writes weights); x, which the
// predecessor writes, after it. Group s of the cp.async groups completes stage s (the prologue's
// weight loads ride in group 0), so stage s is ready once at most kAhead − 1 groups are pending;
// each thread's landed copies are made visible to the tensor cores (the async proxy) before the
// barrier.
template <int32_t NT>
__device__ __forceinline__ void stream_range(const Params& p, uint32_t shared, int32_t tile,
                                             int32_t first_chunk, int32_t stages,
                                             float (&acc)[NT][4]) {
  const uint64_t policy = evict_first_policy();
  const int32_t warpgroup = static_cast<int32_t>(threadIdx.x) / kWarpgroupThreads;
  const WeightRows rows = weight_rows_of(p, tile);
#pragma unroll
  for (int32_t s = 0; s < kAhead; ++s) {
    if (s < stages) load_weights<NT>(p, rows, stage_at<NT>(shared, first_chunk, s), policy);
  }
  wait_for_predecessor();
  uint32_t region = 0;  // the folded norm's x row, 0 when the stages load x
  if constexpr (NT == 1) {
    if (p.norm.residual != nullptr) {
      __shared__ float scratch[32];
      const float scale = folded_norm_scale(p, scratch);
      region = shared + static_cast<uint32_t>(kSharedBytes<1>);
      fold_norm_into(p, scale, first_chunk * kChunk, stages * kChunk,
                     reinterpret_cast<bf16*>(__cvta_shared_to_generic(region)));
      zero_folded_rows(shared);
      __syncthreads();  // the region visible to every warp
    }
  }
#pragma unroll
  for (int32_t s = 0; s < kAhead; ++s) {
    if (s < stages && region == 0) load_x<NT>(p, stage_at<NT>(shared, first_chunk, s));
    commit_copies();
  }
  for (int32_t s = 0; s < stages; ++s) {
    const Stage<NT> st = stage_at<NT>(shared, first_chunk, s);
    wait_copies<kAhead - 1>();
    if constexpr (NT == 1) {
      if (region != 0) copy_folded_chunk(region, st, s);
    }
    wgmma::fence_shared_for_async();
    __syncthreads();  // stage s landed for every thread; stage s − 1 − kMmaInFlight's buffer free
    const int32_t next = s + kAhead;
    if (next < stages) {
      const Stage<NT> later = stage_at<NT>(shared, first_chunk, next);
      load_weights<NT>(p, rows, later, policy);
      if (region == 0) load_x<NT>(p, later);
    }
    commit_copies();
    multiply<NT>(st, warpgroup, acc);
    wgmma::wait<kMmaInFlight>();
  }
  wgmma::wait<0>();
  wgmma::hold<NT>(acc);
}

}  // namespace ls::kernels::small_m
