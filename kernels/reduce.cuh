// Warp and block reductions with one fixed combination order (xor butterflies, then warp 0 over
// the warps' partials), so a reduction's result depends only on its inputs and the block size.
#pragma once

#include <cstdint>

namespace ls::kernels {

__device__ __forceinline__ float warp_sum(float x) {
  for (int offset = 16; offset > 0; offset >>= 1) x += __shfl_xor_sync(0xffffffffu, x, offset);
  return x;
}

__device__ __forceinline__ float warp_max(float x) {
  for (int offset = 16; offset > 0; offset >>= 1) x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, offset));
  return x;
}

// `scratch` holds 32 floats. Every thread of the block receives the sum.
__device__ __forceinline__ float block_sum(float x, float* scratch) {
  const int lane = threadIdx.x % 32;
  const int warp = threadIdx.x / 32;
  const int warps = (blockDim.x + 31) / 32;
  x = warp_sum(x);
  __syncthreads();  // scratch may still be read by a previous reduction
  if (lane == 0) scratch[warp] = x;
  __syncthreads();
  float total = lane < warps ? scratch[lane] : 0.0f;
  total = warp_sum(total);
  return total;
}

__device__ __forceinline__ float block_max(float x, float* scratch) {
  const int lane = threadIdx.x % 32;
  const int warp = threadIdx.x / 32;
  const int warps = (blockDim.x + 31) / 32;
  x = warp_max(x);
  __syncthreads();
  if (lane == 0) scratch[warp] = x;
  __syncthreads();
  float total = lane < warps ? scratch[lane] : -INFINITY;
  return warp_max(total);
}

// (value, index) argmax with the lowest index winning ties.
struct ArgMax {
  float value;
  int32_t index;
};

__device__ __forceinline__ ArgMax better(ArgMax a, ArgMax b) {
  if (b.value > a.value || (b.value == a.value && b.index < a.index)) return b;
  return a;
}

__device__ __forceinline__ ArgMax warp_argmax(ArgMax a) {
  for (int offset = 16; offset > 0; offset >>= 1) {
    ArgMax other{__shfl_xor_sync(0xffffffffu, a.value, offset),
                 __shfl_xor_sync(0xffffffffu, a.index, offset)};
    a = better(a, other);
  }
  return a;
}

// `values` and `indices` hold 32 entries each. Every thread receives the result.
__device__ __forceinline__ ArgMax block_argmax(ArgMax a, float* values, int32_t* indices) {
  const int lane = threadIdx.x % 32;
  const int warp = threadIdx.x / 32;
  const int warps = (blockDim.x + 31) / 32;
  a = warp_argmax(a);
  __syncthreads();
  if (lane == 0) values[warp] = a.value, indices[warp] = a.index;
  __syncthreads();
  ArgMax total{-INFINITY, 0x7fffffff};
  if (lane < warps) total = ArgMax{values[lane], indices[lane]};
  return warp_argmax(total);
}

}  // namespace ls::kernels
