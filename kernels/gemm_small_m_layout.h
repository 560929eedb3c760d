// The small-M GEMM's block layout, parameters and index maps, shared by its product kernel
// (kernels/gemm_small_m.cu), its split reduction (kernels/gemm_small_m_reduce.cuh) and the host
// (tests/gpu/gemm_small_m_gpu_test.cpp checks the maps there). The device-side stores are in
// kernels/gemm_small_m_store.cuh.
#pragma once

#include "kernels/decode_gemv.h"
#include "kernels/gemm_small_m.h"

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

namespace ls::kernels::small_m {

using bf16 = __nv_bfloat16;

constexpr int32_t kTileRows = 128;  // output rows a block owns
constexpr int32_t kWarps = 8;
constexpr int32_t kThreads = 32 * kWarps;
constexpr int32_t kWarpgroups = kWarps / 4;                 // wgmma's groups of four warps
constexpr int32_t kWarpgroupRows = kTileRows / kWarpgroups;  // 64: one wgmma's M

// What a product's epilogue does with its sums (kernels/gemm_small_m.h).
enum class Epilogue : int32_t { kPlain, kSwiglu, kRopeKv };

struct Params {
  const bf16* x;
  const bf16* w;
  float* y;
  int32_t tokens, out, in;
  float beta;
  int32_t chunks, chunks_per_split, splits;
  float4* partials;  // [tiles, splits, n-tiles, kThreads] when splits > 1
  // One n-tile, splits > 1: a tile's split blocks form a thread block cluster and add their
  // partials in its shared memory (kernels/gemm_small_m_reduce.cuh reduce_in_cluster) instead of
  // the workspace and the reduction kernel.
  bool cluster_reduction;
  Epilogue epilogue;
  // kSwiglu: w is gate/up [out = 2·ffn, in], and act[t, j] = bf16(silu(g) · u) for g, u = rows j
  // and ffn + j of the product.
  bf16* act;
  // kRopeKv: w is q/k/v [out = (query_heads + 2·kv_heads)·head_dim, in], written as
  // launch_rope_qkv writes it with rotary_dim = head_dim (Q rotated to q_out, K rotated and V as
  // it is to the caches at each token's slot).
  RopeKvTarget rope;
  // norm.residual not null: one token, x = rms_norm(residual) computed in the kernel
  // (kernels/gemm_small_m_norm.cuh); p.x unused.
  SmallMNorm norm;
};

// The width of a row pair's group: rows a + i and a + i + half (a = 2·half·group, i < half) pair.
// SwiGLU: one group, gate row j with up row ffn + j; RoPE: each head, element i with i + head_dim/2.
__host__ __device__ __forceinline__ int32_t pair_half(const Params& p) {
  return p.epilogue == Epilogue::kSwiglu ? p.out / 2 : p.rope.head_dim / 2;
}

// Pair `pair` of the paired epilogues: its first row (the second is half further).
__host__ __device__ __forceinline__ int32_t pair_first_row(const Params& p, int32_t pair) {
  const int32_t half = pair_half(p);
  return (pair / half) * 2 * half + pair % half;
}

// The weight row of row r (0..kTileRows − 1) of tile `tile`; -1 past the weights. Plain: row
// kTileRows·tile + r. With a paired epilogue a tile covers pairs 64·tile .. + 63, interleaved 8 by
// 8: rows 0-7 of each m16 tile are the pairs' first rows, rows 8-15 their second rows, so the
// thread holding a first row's sum (c0, c1: row g) holds its partner's (c2, c3: row g + 8). The
// tile count, ⌈out / 128⌉ = ⌈(out / 2) / 64⌉, and so the split, is the plain product's; and an
// MMA's element depends only on its own A row, B column and C, so every sum has the plain bits.
__host__ __device__ __forceinline__ int32_t tile_row_weight(const Params& p, int32_t tile,
                                                            int32_t r) {
  if (p.epilogue == Epilogue::kPlain) {
    const int32_t row = tile * kTileRows + r;
    return row < p.out ? row : -1;
  }
  const int32_t pair = tile * (kTileRows / 2) + (r / 16) * 8 + r % 8;
  if (pair >= p.out / 2) return -1;
  return pair_first_row(p, pair) + (r % 16 < 8 ? 0 : pair_half(p));
}

// Where element e of n-tile j of the thread's sum belongs: a row of the tile (warpgroup w / 4 owns
// rows 64·(w / 4) .., its warp w % 4 their m16 tile w % 4; c0, c1 of row g, c2, c3 of row g + 8:
// kernels/wgmma.cuh) and a token (8j + 2c, + 1). The separate reduction kernel finds the same
// places from the thread index alone.
__host__ __device__ __forceinline__ int32_t fragment_row(int32_t tid, int32_t e) {
  const int32_t warp = tid / 32, lane = tid % 32;
  return (warp / 4) * kWarpgroupRows + (warp % 4) * 16 + lane / 4 + (e >= 2 ? 8 : 0);
}
__host__ __device__ __forceinline__ int32_t fragment_token(int32_t tid, int32_t j, int32_t e) {
  return 8 * j + 2 * (tid % 4) + (e & 1);
}

}  // namespace ls::kernels::small_m
