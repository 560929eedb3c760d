// The device side of kernels/launch.h, and the launch helper. Every kernel that a LaunchStream
// with `overlap` may launch calls `allow_successor()` and `wait_for_predecessor()` before it
// reads or writes memory another kernel of the step writes or reads (weights excepted: nothing
// writes them); when launched in plain order both are no-ops. Because each such kernel completes
// only after its wait returns, the order is transitive: kernel n + 1 waiting on n also follows
// n − 1.
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

// This block's share of each series of `ahead` asked of the L2 (cp.async.bulk.prefetch: no
// register or shared memory held, nothing waited for): the grid's blocks take the pieces of
// l2_ahead_piece over a series' chunks laid end to end, a thread at most 4 KB an ask, no ask
// across a chunk's end. Every block of the grid must call it (a block with no work of its own
// too), or its piece is not asked.
__device__ __forceinline__ void ask_l2_ahead(const L2Ahead& ahead) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  constexpr uint64_t kAsk = 4096;
  const uint64_t blocks = uint64_t{gridDim.x} * gridDim.y * gridDim.z;
  const uint64_t block = blockIdx.x + uint64_t{gridDim.x} * (blockIdx.y + uint64_t{gridDim.y} *
                                                             blockIdx.z);
#pragma unroll 1
  for (int32_t i = 0; i < L2Ahead::kSeries; ++i) {
    const L2Series& s = ahead.series[i];
    if (s.bytes == 0 || s.count == 0) continue;
    const L2AheadPiece piece = l2_ahead_piece(s.total(), blocks, block);
    const char* base = static_cast<const char*>(s.begin);
    for (uint64_t at = piece.first + threadIdx.x * kAsk; at < piece.end;
         at += blockDim.x * kAsk) {
      const uint64_t end = min(at + kAsk, piece.end);
      for (uint64_t from = at; from < end;) {
        const uint64_t chunk = from / s.bytes, within = from % s.bytes;
        const uint64_t n = min(end - from, s.bytes - within);
        asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(__cvta_generic_to_global(
                         base + chunk * s.stride + within)),
                     "r"(static_cast<uint32_t>(n))
                     : "memory");
        from += n;
      }
    }
  }
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
