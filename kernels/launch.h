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
#include <cstdint>

namespace ls::kernels {

// An sm_90 SM's shared memory (H100, H200): 228 KB, of which the SM keeps 1 KB for each resident
// block. How many blocks of `bytes` each (static + dynamic) share an SM, which kernels sized for
// two blocks an SM assert.
constexpr size_t kSmSharedBytes = 228 * 1024;
constexpr size_t kSmSharedReservedPerBlock = 1024;
constexpr size_t blocks_sharing_an_sm(size_t bytes) {
  return kSmSharedBytes / (bytes + kSmSharedReservedPerBlock);
}

// Bytes a kernel asks the L2 for on a later kernel's behalf, once its own reads are out
// (kernels/launch.cuh `ask_l2_ahead`): only bytes nothing in the step writes (weights). At one
// token, attention's dependent loads leave the DRAM idle for microseconds, in which the o
// projection's weights (and the first rows of each gate/up GEMV block's share) can be on their
// way. Never changes a result: only where bytes sit.
//   A series: `count` chunks of `bytes`, chunk c at begin + c·stride (a multiple of 16 at least
// `bytes` apart; `begin` and `bytes` multiples of 16 too).
struct L2Series {
  const void* begin = nullptr;
  size_t bytes = 0;
  size_t stride = 0;
  uint32_t count = 1;
  __host__ __device__ constexpr uint64_t total() const { return uint64_t{bytes} * count; }
};
struct L2Ahead {
  static constexpr int32_t kSeries = 3;
  L2Series series[kSeries]{};

  constexpr L2Ahead() = default;
  constexpr L2Ahead(const void* begin, size_t bytes) : series{{begin, bytes, bytes, 1}} {}
  // Whether every series is aligned and its chunks apart (launch refuses the rest).
  bool valid() const {
    for (const L2Series& s : series) {
      if (s.bytes % 16 != 0 || reinterpret_cast<uintptr_t>(s.begin) % 16 != 0 ||
          s.stride % 16 != 0 || (s.count > 1 && s.stride < s.bytes)) {
        return false;
      }
    }
    return true;
  }
};

// Block `block` of `blocks`' piece [first, end) of an L2Ahead's `bytes`: equal pieces rounded up
// to 16 bytes (so every piece starts aligned), the last ones cut at `bytes` or empty; together
// they cover [0, bytes) once.
struct L2AheadPiece {
  uint64_t first = 0;
  uint64_t end = 0;
};
__host__ __device__ constexpr L2AheadPiece l2_ahead_piece(uint64_t bytes, uint64_t blocks,
                                                          uint64_t block) {
  const uint64_t share = ((bytes + blocks - 1) / blocks + 15) / 16 * 16;
  const uint64_t first = block * share < bytes ? block * share : bytes;
  const uint64_t end = (block + 1) * share < bytes ? (block + 1) * share : bytes;
  return {first, end};
}

struct LaunchStream {
  cudaStream_t stream = nullptr;
  bool overlap = false;  // programmatic dependent launch of every kernel launched on it

  LaunchStream(cudaStream_t s) : stream(s) {}  // NOLINT: a plain stream launches in plain order
  LaunchStream(cudaStream_t s, bool overlap_predecessor) : stream(s), overlap(overlap_predecessor) {}
  operator cudaStream_t() const { return stream; }  // NOLINT
};

}  // namespace ls::kernels
