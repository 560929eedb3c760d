// The device side of kernels/launch.h, and the launch helper. Every kernel that a LaunchStream
// with `overlap` may launch calls `allow_successor()` and `wait_for_predecessor()` before it
// reads or writes memory another kernel of the step writes or reads (weights excepted: nothing
// writes them); when launched in plain order both are no-ops. Because each such kernel completes
// only after its wait returns, the order is transitive: kernel n + 1 waiting on n also follows
// n − 1.
#pragma once

#include "kernels/launch.h"

#include <cuda_runtime.h>

#include <utility>

namespace ls::kernels {

// The successor may be launched once every block of this grid has called this (or exited). Its
// blocks then hold SM slots while they wait, but only once the last of this grid's blocks has
// started, so they never keep one of this grid's blocks from running: kernels call it first.
__device__ __forceinline__ void allow_successor() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

// Returns once the predecessor grid has completed and its memory operations are visible.
__device__ __forceinline__ void wait_for_predecessor() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

// kernel<<<grid, block, shared, stream>>>(args...), overlapping the predecessor when the stream
// says so; returns the launch status.
template <typename... Params, typename... Args>
cudaError_t launch_kernel(void (*kernel)(Params...), dim3 grid, dim3 block, size_t shared,
                          LaunchStream stream, Args&&... args) {
  cudaLaunchConfig_t config{};
  config.gridDim = grid;
  config.blockDim = block;
  config.dynamicSmemBytes = shared;
  config.stream = stream.stream;
  cudaLaunchAttribute attribute{};
  attribute.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attribute.val.programmaticStreamSerializationAllowed = 1;
  config.attrs = stream.overlap ? &attribute : nullptr;
  config.numAttrs = stream.overlap ? 1 : 0;
  return cudaLaunchKernelEx(&config, kernel, std::forward<Args>(args)...);
}

}  // namespace ls::kernels
