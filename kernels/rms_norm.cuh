// The vectorised RMSNorm's sum of squares and element rounding, one definition for the norm
// kernel (kernels/layer_ops.cu) and the decode GEMV that folds the norm into its prologue
// (kernels/gemv.cu): both must round every normalised element alike, so both sum in this order.
// Device code only.
#pragma once

#include "core/ops/layer_math.h"

#include <cuda_bf16.h>

#include <cstdint>

namespace ls::kernels {

// The order: kNormThreads threads, thread v summing the squares of its float4s v, v + kNormThreads,
// ... (at most kNormVecMax of them) in ascending order, element by element; then block_sum over
// those threads (a butterfly inside each warp of 32, then one over the warps' partials).
constexpr int32_t kNormThreads = 256;
constexpr int32_t kNormVecMax = 8;
constexpr int32_t kNormWarps = kNormThreads / 32;

// Rows this order covers: n % 4 == 0 and every float4 held by one of the threads.
__host__ __device__ constexpr bool norm_vectorised(int32_t n) {
  return n >= 4 && n % 4 == 0 && n <= 4 * kNormThreads * kNormVecMax;
}

__device__ __forceinline__ float add_squares(float sum, const float4& v) {
  sum += v.x * v.x;
  sum += v.y * v.y;
  sum += v.z * v.z;
  sum += v.w * v.w;
  return sum;
}

// Thread v's part of the order (before the butterflies) over its float4s already in registers:
// held[k] is float4 v + k · kNormThreads of the row, for those below vecs = n / 4.
__device__ __forceinline__ float norm_thread_squares(const float4 (&held)[kNormVecMax], int32_t v,
                                                    int32_t vecs) {
  float sum = 0.0f;
#pragma unroll
  for (int32_t k = 0; k < kNormVecMax; ++k) {
    if (v + k * kNormThreads < vecs) sum = add_squares(sum, held[k]);
  }
  return sum;
}

// The same, loading thread v's float4s of row xr.
__device__ __forceinline__ float norm_thread_squares(const float4* xr, int32_t v, int32_t vecs) {
  float4 held[kNormVecMax];
#pragma unroll
  for (int32_t k = 0; k < kNormVecMax; ++k) {
    const int32_t i = v + k * kNormThreads;
    if (i < vecs) held[k] = xr[i];
  }
  return norm_thread_squares(held, v, vecs);
}

// Four normalised elements, rounded to the storage type (bf16: round to nearest even).
__device__ __forceinline__ void store4(__nv_bfloat16* p, float a, float b, float c, float d) {
  __nv_bfloat162 lo = __floats2bfloat162_rn(a, b);
  __nv_bfloat162 hi = __floats2bfloat162_rn(c, d);
  uint2 packed;
  packed.x = *reinterpret_cast<uint32_t*>(&lo);
  packed.y = *reinterpret_cast<uint32_t*>(&hi);
  *reinterpret_cast<uint2*>(p) = packed;
}
__device__ __forceinline__ void store4(float* p, float a, float b, float c, float d) {
  *reinterpret_cast<float4*>(p) = make_float4(a, b, c, d);
}

// Four elements v normalised by `scale` and weighted by g (ops::rms_norm_element), stored at p.
template <typename T>
__device__ __forceinline__ void store_normalised4(T* p, const float4& v, float scale,
                                                  const float4& g) {
  store4(p, ops::rms_norm_element(v.x, scale, g.x), ops::rms_norm_element(v.y, scale, g.y),
         ops::rms_norm_element(v.z, scale, g.z), ops::rms_norm_element(v.w, scale, g.w));
}

}  // namespace ls::kernels
