// Conversions between fp32 arithmetic and the storage type of weights, KV and GEMM inputs
// (bf16 in production, float in the fp32 mode). Device code only.
#pragma once

#include <cuda_bf16.h>

namespace ls::kernels {

__device__ __forceinline__ float to_float(float x) { return x; }
__device__ __forceinline__ float to_float(__nv_bfloat16 x) { return __bfloat162float(x); }

template <typename T>
__device__ __forceinline__ T from_float(float x);
template <>
__device__ __forceinline__ float from_float<float>(float x) {
  return x;
}
template <>
__device__ __forceinline__ __nv_bfloat16 from_float<__nv_bfloat16>(float x) {
  return __float2bfloat16_rn(x);
}

}  // namespace ls::kernels
