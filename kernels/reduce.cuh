// Warp and block reductions with one fixed combination order (xor butterflies, then warp 0 over
// the warps' partials), so a reduction's result depends only on its inputs and the block size.
#pragma once

#include <cstdint>

namespace ls::kernels {

// The two combinations the kernels reduce with, and what an absent value is.
struct SumOp {
  static __device__ __forceinline__ float combine(float a, float b) { return a + b; }
  static constexpr float kIdentity = 0.0f;
};
struct MaxOp {
  static __device__ __forceinline__ float combine(float a, float b) { return fmaxf(a, b); }
  static constexpr float kIdentity = -__builtin_huge_valf();
};

template <typename Op>
__device__ __forceinline__ float warp_reduce(float x) {
  for (int offset = 16; offset > 0; offset >>= 1) {
    x = Op::combine(x, __shfl_xor_sync(0xffffffffu, x, offset));
  }
  return x;
}

// `scratch` holds 32 floats. Every thread of the block receives the result.
template <typename Op>
__device__ __forceinline__ float block_reduce(float x, float* scratch) {
  const int lane = threadIdx.x % 32;
  const int warp = threadIdx.x / 32;
  const int warps = (blockDim.x + 31) / 32;
  x = warp_reduce<Op>(x);
  __syncthreads();  // scratch may still be read by a previous reduction
  if (lane == 0) scratch[warp] = x;
  __syncthreads();
  return warp_reduce<Op>(lane < warps ? scratch[lane] : Op::kIdentity);
}

__device__ __forceinline__ float warp_sum(float x) { return warp_reduce<SumOp>(x); }
__device__ __forceinline__ float warp_max(float x) { return warp_reduce<MaxOp>(x); }
__device__ __forceinline__ float block_sum(float x, float* scratch) {
  return block_reduce<SumOp>(x, scratch);
}
__device__ __forceinline__ float block_max(float x, float* scratch) {
  return block_reduce<MaxOp>(x, scratch);
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
