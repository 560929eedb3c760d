// The device side of kernels/launch.h, and the launch helper. Every kernel that a LaunchStream
// with `overlap` may launch calls `allow_successor()` and `wait_for_predecessor()` before it
// reads or writes memory another kernel of the step writes or reads (weights excepted: nothing
// writes them); when launched in plain order both are no-ops. Because each such kernel completes
// only after its wait returns, the order is transitive: kernel n + 1 waiting on n also follows
// n − 1.
//
// The step's inputs are the other exception: the positions, slots, pool rows and block table are
// written by the state ops (kernels/state_ops.h) and copies, launched in plain order before a
// step's first overlapped kernel and never calling allow_successor, so every overlapped kernel of
// the step starts after they completed and may read those before its wait (decode attention
// does: its chain of index reads then runs under its predecessor's tail).
#pragma once

#include "kernels/launch.h"

#include <cuda_runtime.h>

#include <cstdint>
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
// says so, its blocks in thread block clusters of `cluster_x` along x when that is above 1 (the
// grid's x a multiple of it); returns the launch status.
template <typename... Params, typename... Args>
cudaError_t launch_kernel_in_clusters(void (*kernel)(Params...), dim3 grid, dim3 block,
                                      size_t shared, LaunchStream stream, uint32_t cluster_x,
                                      Args&&... args) {
  cudaLaunchConfig_t config{};
  config.gridDim = grid;
  config.blockDim = block;
  config.dynamicSmemBytes = shared;
  config.stream = stream.stream;
  cudaLaunchAttribute attributes[2]{};
  uint32_t count = 0;
  if (stream.overlap) {
    attributes[count].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attributes[count].val.programmaticStreamSerializationAllowed = 1;
    ++count;
  }
  if (cluster_x > 1) {
    attributes[count].id = cudaLaunchAttributeClusterDimension;
    attributes[count].val.clusterDim.x = cluster_x;
    attributes[count].val.clusterDim.y = 1;
    attributes[count].val.clusterDim.z = 1;
    ++count;
  }
  config.attrs = count > 0 ? attributes : nullptr;
  config.numAttrs = count;
  return cudaLaunchKernelEx(&config, kernel, std::forward<Args>(args)...);
}

template <typename... Params, typename... Args>
cudaError_t launch_kernel(void (*kernel)(Params...), dim3 grid, dim3 block, size_t shared,
                          LaunchStream stream, Args&&... args) {
  return launch_kernel_in_clusters(kernel, grid, block, shared, stream, 1,
                                   std::forward<Args>(args)...);
}

}  // namespace ls::kernels
