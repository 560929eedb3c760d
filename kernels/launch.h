// How a kernel is launched on a stream: in plain stream order, or overlapping its predecessor
// (Hopper's programmatic dependent launch). A decode step at small batch is ~150 short kernels,
// most of them a few microseconds of weight streaming; in plain order each starts only once the
// one before has drained and its launch has gone through, so the GPU idles at every boundary.
// Overlapped, a kernel is launched as soon as every block of its predecessor has started, runs
// its prologue (a GEMV issues its weight loads: they depend on nothing earlier), and waits
// (kernels/launch.cuh `wait_for_predecessor`) before it reads or writes anything another kernel
// touches. Results are the same bits: only when a kernel starts moves, not what it computes.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>

namespace ls::kernels {

// An sm_90 SM's shared memory (H100, H200): 228 KB, of which the SM keeps 1 KB for each resident
// block. How many blocks of `bytes` each (static + dynamic) share an SM, which kernels sized for
// two blocks an SM assert.
constexpr size_t kSmSharedBytes = 228 * 1024;
constexpr size_t kSmSharedReservedPerBlock = 1024;
constexpr size_t blocks_sharing_an_sm(size_t bytes) {
  return kSmSharedBytes / (bytes + kSmSharedReservedPerBlock);
}

struct LaunchStream {
  cudaStream_t stream = nullptr;
  bool overlap = false;  // programmatic dependent launch of every kernel launched on it

  LaunchStream(cudaStream_t s) : stream(s) {}  // NOLINT: a plain stream launches in plain order
  LaunchStream(cudaStream_t s, bool overlap_predecessor) : stream(s), overlap(overlap_predecessor) {}
  operator cudaStream_t() const { return stream; }  // NOLINT
};

}  // namespace ls::kernels
