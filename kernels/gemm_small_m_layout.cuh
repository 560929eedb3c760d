// The small-M GEMM's block layout and parameters, shared by its product kernel
// (kernels/gemm_small_m.cu) and its split reduction (kernels/gemm_small_m_reduce.cuh).
#pragma once

#include "core/ops/layer_math.h"

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

namespace ls::kernels::small_m {

using bf16 = __nv_bfloat16;

constexpr int32_t kTileRows = 128;  // output rows a block owns
constexpr int32_t kWarps = 8;
constexpr int32_t kThreads = 32 * kWarps;
constexpr int32_t kRowGroups = 4;                     // warps along the rows
constexpr int32_t kWarpRows = kTileRows / kRowGroups;  // 32: two m16 tiles

struct Params {
  const bf16* x;
  const bf16* w;
  float* y;
  int32_t tokens, out, in;
  float beta;
  int32_t chunks, chunks_per_split, splits;
  float4* partials;  // [tiles, splits, n-tiles, kThreads] when splits > 1
  // Not null: the SwiGLU epilogue. w is gate/up [out = 2·ffn, in], y unused (beta 0), and
  // act[t, j] = bf16(silu(g) · u) for g, u = rows j and ffn + j of the product (tile_row_weight).
  bf16* act;
};

// The weight row of row r (0..kTileRows − 1) of tile `tile`; -1 past the weights. Plain: row
// kTileRows·tile + r. With the SwiGLU epilogue a tile covers gate rows 64·tile .. + 63 and the same
// up rows, interleaved 8 by 8: rows 0-7 of each m16 tile are gate rows, rows 8-15 their up rows,
// so the thread holding a gate row's sum (c0, c1: row g) holds its up row's (c2, c3: row g + 8).
// The tile count, ⌈2·ffn / 128⌉ = ⌈ffn / 64⌉, and so the split, is the plain product's; and an
// MMA's element depends only on its own A row, B column and C, so every sum has the plain bits.
__device__ __forceinline__ int32_t tile_row_weight(const Params& p, int32_t tile, int32_t r) {
  if (p.act == nullptr) {
    const int32_t row = tile * kTileRows + r;
    return row < p.out ? row : -1;
  }
  const int32_t ffn = p.out / 2;
  const int32_t gate = tile * (kTileRows / 2) + (r / 16) * 8 + r % 8;
  if (gate >= ffn) return -1;
  return r % 16 < 8 ? gate : ffn + gate;
}

// Where element e of n-tile j of the thread's sum (after add_halves) belongs: a row of the tile
// (c0, c1 of row g; c2, c3 of row g + 8 of the warp's m-tile) and a token (8j + 2c, + 1). The
// separate reduction kernel finds the same places from the thread index alone.
__device__ __forceinline__ int32_t fragment_row(int32_t tid, int32_t e) {
  const int32_t warp = tid / 32, lane = tid % 32;
  return (warp % kRowGroups) * kWarpRows + (warp / kRowGroups) * 16 + lane / 4 + (e >= 2 ? 8 : 0);
}
__device__ __forceinline__ int32_t fragment_token(int32_t tid, int32_t j, int32_t e) {
  return 8 * j + 2 * (tid % 4) + (e & 1);
}

// One element of y: the sum, plus beta · y (the residual) when beta is not 0.
__device__ __forceinline__ void store_one(const Params& p, int32_t row, int32_t token, float sum) {
  if (row < p.out && token < p.tokens) {
    float* y = p.y + int64_t{token} * p.out + row;
    *y = p.beta == 0.0f ? sum : sum + p.beta * *y;
  }
}

// The four sums of n-tile j of thread tid (elements e = 0..3 of its fragment) of tile `tile`:
// into y, or through the SwiGLU epilogue (gate in e = 0, 1 and up in e = 2, 3 for the same two
// tokens) into act, as launch_swiglu writes it.
__device__ __forceinline__ void store_fragment(const Params& p, int32_t tile, int32_t tid,
                                               int32_t j, const float (&sum)[4]) {
  if (p.act == nullptr) {
#pragma unroll
    for (int32_t e = 0; e < 4; ++e) {
      store_one(p, tile * kTileRows + fragment_row(tid, e), fragment_token(tid, j, e), sum[e]);
    }
    return;
  }
  const int32_t ffn = p.out / 2;
  const int32_t gate = tile_row_weight(p, tile, fragment_row(tid, 0));
#pragma unroll
  for (int32_t e = 0; e < 2; ++e) {
    const int32_t token = fragment_token(tid, j, e);
    if (gate >= 0 && token < p.tokens) {
      p.act[int64_t{token} * ffn + gate] = __float2bfloat16_rn(ops::swiglu(sum[e], sum[e + 2]));
    }
  }
}

}  // namespace ls::kernels::small_m
