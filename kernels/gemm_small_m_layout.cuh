// The small-M GEMM's block layout and parameters, shared by its product kernel
// (kernels/gemm_small_m.cu) and its split reduction (kernels/gemm_small_m_reduce.cuh).
#pragma once

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
};

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

}  // namespace ls::kernels::small_m
