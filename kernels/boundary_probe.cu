// The boundary probe's kernels (kernels/boundary_probe.h): one phase of work as a GEMV does it,
// run as a kernel a phase or as one persistent kernel with a grid barrier between phases.
#include "kernels/boundary_probe.h"

#include "kernels/kernel_fit.h"
#include "kernels/launch.cuh"
#include "kernels/reduce.cuh"

#include <algorithm>

namespace ls::kernels {

namespace {

constexpr int32_t kThreads = 128;
constexpr int32_t kAhead = 8;  // words a thread loads before the wait (the GEMV's first round)

__device__ __forceinline__ uint32_t fold(const uint4& w) { return w.x ^ w.y ^ w.z ^ w.w; }

// A thread's words of a phase: word i0 + k · stride for k = 0, 1, ...
struct PhaseWords {
  const uint4* base;
  int64_t i0, stride, words;

  __device__ PhaseWords(const BoundaryProbe& p, int32_t phase)
      : base(p.weights + int64_t{phase} * p.phase_words),
        i0(int64_t{blockIdx.x} * kThreads + threadIdx.x),
        stride(int64_t{p.blocks} * kThreads),
        words(p.phase_words) {}

  // Loads words [first, first + kAhead) of the thread's (zero past the phase's end).
  __device__ void load(int64_t first, uint4 (&w)[kAhead]) const {
#pragma unroll
    for (int32_t u = 0; u < kAhead; ++u) {
      const int64_t i = i0 + (first + u) * stride;
      w[u] = i < words ? __ldcs(base + i) : make_uint4(0, 0, 0, 0);
    }
  }

  // Folds the round already loaded, then the thread's later rounds.
  __device__ uint32_t fold_all(const uint4 (&ahead)[kAhead]) const {
    uint32_t acc = 0;
#pragma unroll
    for (int32_t u = 0; u < kAhead; ++u) acc ^= fold(ahead[u]);
    for (int64_t first = kAhead; i0 + first * stride < words; first += kAhead) {
      uint4 w[kAhead];
      load(first, w);
#pragma unroll
      for (int32_t u = 0; u < kAhead; ++u) acc ^= fold(w[u]);
    }
    return acc;
  }
};

// The dependent half of a phase: every block's output of the phase before, summed in a fixed
// order, and the weights' fold give this block's output. `phase` enters the value so that rows
// differ: a phase that read a row before it was written would not compute the same bits.
__device__ void finish_phase(const BoundaryProbe& p, int32_t phase, uint32_t acc) {
  __shared__ float scratch[32];
  __shared__ uint32_t bits;
  if (threadIdx.x == 0) bits = 0;
  const float* in = p.outputs + int64_t{phase} * p.blocks;
  float x = 0.0f;
  for (int32_t j = static_cast<int32_t>(threadIdx.x); j < p.blocks; j += kThreads) x += in[j];
  const float total = block_sum(x, scratch);  // its barriers order `bits = 0` before the xors
  atomicXor(&bits, acc);
  __syncthreads();
  if (threadIdx.x == 0) {
    p.outputs[int64_t{phase + 1} * p.blocks + blockIdx.x] =
        0.5f * total / static_cast<float>(p.blocks) + static_cast<float>(blockIdx.x) +
        static_cast<float>(phase) + static_cast<float>(bits & 7u);
  }
}

__global__ void __launch_bounds__(kThreads) boundary_phase_kernel(const BoundaryProbe p,
                                                                  int32_t phase) {
  const PhaseWords words(p, phase);
  uint4 ahead[kAhead];
  words.load(0, ahead);
  allow_successor();
  wait_for_predecessor();
  finish_phase(p, phase, words.fold_all(ahead));
}

// Phase n + 1's first round is in flight while the block waits for phase n's last block.
template <ProbeBarrier kBarrier>
__global__ void __launch_bounds__(kThreads) boundary_persistent_kernel(const BoundaryProbe p) {
  uint4 ahead[kAhead];
  PhaseWords(p, 0).load(0, ahead);
  for (int32_t phase = 0; phase < p.phases; ++phase) {
    uint32_t generation = 0;
    if constexpr (kBarrier == ProbeBarrier::kGrid) generation = grid_barrier_generation(p.barrier);
    finish_phase(p, phase, PhaseWords(p, phase).fold_all(ahead));
    if (phase + 1 < p.phases) {
      PhaseWords(p, phase + 1).load(0, ahead);
      if constexpr (kBarrier == ProbeBarrier::kGrid) {
        grid_barrier_wait(p.barrier, p.blocks, generation);
      } else {
        counting_barrier_wait(p.counter, p.blocks);
      }
    }
  }
}

bool valid(const BoundaryProbe& p) {
  return p.phases >= 1 && p.blocks >= 1 && p.phase_words >= 0 && p.outputs != nullptr &&
         (p.phase_words == 0 || p.weights != nullptr);
}

}  // namespace

cudaError_t boundary_probe_resident_blocks(int32_t* blocks) {
  int32_t phase = 0, persistent = 0;
  cudaError_t status = resident_on_gpu<boundary_phase_kernel>(kThreads, 0, &phase);
  if (status == cudaSuccess) {
    status = resident_on_gpu<boundary_persistent_kernel<ProbeBarrier::kGrid>>(kThreads, 0,
                                                                              &persistent);
  }
  int32_t counting = 0;
  if (status == cudaSuccess) {
    status = resident_on_gpu<boundary_persistent_kernel<ProbeBarrier::kCounting>>(kThreads, 0,
                                                                                  &counting);
  }
  *blocks = std::min({phase, persistent, counting});
  return status;
}

cudaError_t launch_boundary_phase(const BoundaryProbe& probe, int32_t phase, LaunchStream stream) {
  if (!valid(probe) || phase < 0 || phase >= probe.phases) return cudaErrorInvalidValue;
  return launch_kernel(boundary_phase_kernel, probe.blocks, kThreads, 0, stream, probe, phase);
}

cudaError_t launch_boundary_persistent(const BoundaryProbe& probe, ProbeBarrier barrier,
                                       cudaStream_t stream) {
  const bool has_barrier =
      barrier == ProbeBarrier::kGrid ? probe.barrier != nullptr : probe.counter != nullptr;
  if (!valid(probe) || (probe.phases > 1 && !has_barrier)) return cudaErrorInvalidValue;
  cudaLaunchConfig_t config{};
  config.gridDim = probe.blocks;
  config.blockDim = kThreads;
  config.stream = stream;
  cudaLaunchAttribute cooperative{};
  cooperative.id = cudaLaunchAttributeCooperative;  // every block resident, or refused
  cooperative.val.cooperative = 1;
  config.attrs = &cooperative;
  config.numAttrs = 1;
  if (barrier == ProbeBarrier::kGrid) {
    return cudaLaunchKernelEx(&config, boundary_persistent_kernel<ProbeBarrier::kGrid>, probe);
  }
  return cudaLaunchKernelEx(&config, boundary_persistent_kernel<ProbeBarrier::kCounting>, probe);
}

}  // namespace ls::kernels
