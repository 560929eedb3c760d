// The small-M GEMM's folded RMSNorm, for a product of one token (kernels/gemm_small_m.h
// launch_gemm_small_m_norm_bf16): the block computes the token's inverse RMS itself from the fp32
// residual in the vectorised norm kernel's order (kernels/rms_norm.cuh: thread v's float4s, then
// block_sum over the 256 threads, as rms_norm_vec_kernel), normalises its own K range into shared
// memory rounded as that kernel stores it, and the MMAs read x from there: one launch instead of
// the norm kernel and the product, the same bits.
//
// Why one token only. The region holds one row of the block's K range (at most 16 KB beside the
// pipeline's ~70 KB, so two blocks still share an SM); each stage copies its chunk of the row into
// its x rows' token 0, whose tokens 1-7 stay zero as the unfolded kernel's cp.async writes zeros
// past `tokens`.
#pragma once

#include "kernels/gemm_small_m_layout.h"
#include "kernels/reduce.cuh"
#include "kernels/rms_norm.cuh"

#include <cstdint>

namespace ls::kernels::small_m {

// The widest row the vectorised norm covers (8192) and the region it needs: its bf16 elements.
constexpr int32_t kFoldedKMax = 4 * kNormThreads * kNormVecMax;
constexpr size_t kFoldedRegionBytes = size_t{kFoldedKMax} * 2;
static_assert(kThreads == kNormThreads, "the block plays the norm kernel's threads");

// The token's scale (ops::rms_norm_scale of its sum of squares), as rms_norm_vec_kernel computes
// it; every thread gets it.
__device__ __forceinline__ float folded_norm_scale(const Params& p, float* scratch) {
  const int32_t tid = static_cast<int32_t>(threadIdx.x);
  const float4* xr = reinterpret_cast<const float4*>(p.norm.residual);
  const float sum = norm_thread_squares(xr, tid, p.in / 4);
  return ops::rms_norm_scale(block_sum(sum, scratch), p.in, p.norm.eps);
}

// Elements k0 .. k0 + count − 1 of the normalised token (count a multiple of 64; zeros past `in`)
// into region[0 .. count).
__device__ __forceinline__ void fold_norm_into(const Params& p, float scale, int32_t k0,
                                               int32_t count, bf16* region) {
  const float4* xr = reinterpret_cast<const float4*>(p.norm.residual);
  const float4* g = reinterpret_cast<const float4*>(p.norm.weight);
  for (int32_t i = static_cast<int32_t>(threadIdx.x); i < count / 4; i += kThreads) {
    const int32_t k = k0 + 4 * i;  // in % 4 == 0: a float4 is inside `in` or past it
    if (k < p.in) {
      store_normalised4(region + 4 * i, xr[k / 4], scale, __ldg(g + k / 4));
    } else {
      store4(region + 4 * i, 0.0f, 0.0f, 0.0f, 0.0f);
    }
  }
}

}  // namespace ls::kernels::small_m
