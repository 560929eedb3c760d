// Barriers across the blocks of one grid, in global memory: how a persistent kernel's phases wait
// for each other instead of ending one kernel and starting the next (kernels/boundary_probe.h,
// their only user, measures what each costs). Every block of the grid must be resident at once:
// the probe launches its kernel cooperatively, which the driver refuses when the blocks do not
// fit.
// Two shapes:
//  * GridBarrier, cooperative groups' grid sync: full fences around an acquire-release arrival,
//    the last block to arrive resetting the count and advancing the generation the others poll.
//    It resets itself, so one barrier serves grids of any size.
//  * CountingBarrier, CUTLASS's generic barrier: the arrival a release add on a count that never
//    resets, the wait acquire loads until the count reaches the next multiple of the grid's blocks;
//    no fences. A grid size's waits need the count at a multiple of it: zeroed for each size.
// Either serves any number of waits and graph replays, one grid at a time (the kernels that share
// one follow each other in stream order).
#pragma once

#include <cstdint>

namespace ls::kernels {

struct GridBarrier {
  uint32_t arrived = 0;     // blocks at the current wait
  uint32_t generation = 0;  // waits completed (wraps)
};

struct CountingBarrier {
  unsigned long long arrived = 0;  // arrivals since zeroed (64 bits: never wraps)
};

#if defined(__CUDACC__)

__device__ __forceinline__ uint32_t grid_barrier_load_acquire(const uint32_t* at) {
  uint32_t v = 0;
  asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(at) : "memory");
  return v;
}

// The generation a block's next wait completes: read by thread 0 any time after its previous
// wait at `barrier` returned and before it arrives at the next (reading it early takes the load
// off the wait's path).
__device__ __forceinline__ uint32_t grid_barrier_generation(const GridBarrier* barrier) {
  return threadIdx.x == 0 ? grid_barrier_load_acquire(&barrier->generation) : 0;
}

// Returns once every one of the grid's `blocks` blocks has arrived; every write the block made
// before it is visible to every block after. `generation`: grid_barrier_generation's value
// (thread 0's; the other threads' is not read).
__device__ __forceinline__ void grid_barrier_wait(GridBarrier* barrier, int32_t blocks,
                                                  uint32_t generation) {
  __syncthreads();  // the block's writes precede thread 0's fence
  if (threadIdx.x == 0) {
    __threadfence();  // cumulative: the whole block's writes, as cooperative groups' grid sync
    uint32_t before = 0;
    asm volatile("atom.acq_rel.gpu.global.add.u32 %0, [%1], 1;"
                 : "=r"(before)
                 : "l"(&barrier->arrived)
                 : "memory");
    if (before + 1 == static_cast<uint32_t>(blocks)) {
      barrier->arrived = 0;  // ordered before the release: no block arrives again until it sees it
      asm volatile("st.release.gpu.global.u32 [%0], %1;" ::"l"(&barrier->generation),
                   "r"(generation + 1)
                   : "memory");
    } else {
      while (grid_barrier_load_acquire(&barrier->generation) == generation) {
      }
    }
    __threadfence();
  }
  __syncthreads();
}

// CountingBarrier's wait (the top): returns once every one of the grid's `blocks` blocks has
// arrived; every write the block made before it is visible to every block after.
__device__ __forceinline__ void counting_barrier_wait(CountingBarrier* barrier, int32_t blocks) {
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
