// A barrier across the blocks of one grid, in global memory: how a persistent kernel's phases wait
// for each other instead of ending one kernel and starting the next (kernels/boundary_probe.h
// measures what each costs). Every block of the grid must be resident at once: a kernel that
// waits at one is launched with no more blocks than the GPU holds, and calls allow_successor()
// (kernels/launch.cuh) so that its successor's blocks take SM slots only once all of its own have
// started.
//
// The barrier counts arrivals and never resets: a block's arrival returns the count before it, and
// its wait ends when the count reaches the next multiple of the grid's blocks. So a barrier, zeroed
// once when allocated, serves any number of waits and graph replays, as long as every grid that
// waits at it has the same number of blocks and one grid at a time waits at it. The arrival is a
// release (of the block's writes, ordered before it by the block's own barrier) and the wait an
// acquire: no full fences, the shape of CUTLASS's generic barrier.
#pragma once

#include <cstdint>

namespace ls::kernels {

struct GridBarrier {
  unsigned long long arrived = 0;  // arrivals since allocation (64 bits: never wraps)
};

#if defined(__CUDACC__)

// Returns once every one of the grid's `blocks` blocks has arrived; every write the block made
// before it is visible to every block after.
__device__ __forceinline__ void grid_barrier_wait(GridBarrier* barrier, int32_t blocks) {
  __syncthreads();  // the block's writes precede thread 0's release
  if (threadIdx.x == 0) {
    unsigned long long before = 0;
    asm volatile("atom.release.gpu.global.add.u64 %0, [%1], 1;"
                 : "=l"(before)
                 : "l"(&barrier->arrived)
                 : "memory");
    const auto grid = static_cast<unsigned long long>(blocks);
    const unsigned long long target = (before / grid + 1) * grid;
    unsigned long long now = 0;
    do {
      asm volatile("ld.acquire.gpu.global.u64 %0, [%1];"
                   : "=l"(now)
                   : "l"(&barrier->arrived)
                   : "memory");
    } while (now < target);
  }
  __syncthreads();
}

#endif

}  // namespace ls::kernels
