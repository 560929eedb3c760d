// What a dependent step between two pieces of decode work costs on the GPU, measured apart from
// any model (bench/gpu_boundary_bench.cpp): the question a persistent decode kernel has to answer
// before it is written. A probe is a chain of `phases` phases. In each, every block streams its
// share of that phase's weights (as a GEMV does: loads issued before the dependency is waited on,
// since nothing writes weights), then reads every block's output of the phase before (as a GEMV
// reads x), and writes one value of its own. The chain runs either as one kernel a phase (in
// plain stream order, or overlapping its predecessor: kernels/launch.h) or as one persistent
// kernel whose blocks wait for each other at a grid barrier between phases (either shape of
// kernels/grid_barrier.h). Every form computes the same outputs, bit for bit: the bench checks
// it, so a form that let a phase read before its predecessor's writes would show. Measured
// (bench/results/HISTORY.md, 2026-12-07): on an H100 cooperative groups' barrier costs more than
// the overlapped kernel boundary it would replace.
#pragma once

#include "kernels/grid_barrier.h"
#include "kernels/launch.h"

#include <cuda_runtime.h>

#include <cstdint>

namespace ls::kernels {

struct BoundaryProbe {
  const uint4* weights = nullptr;  // [phases][phase_words]
  float* outputs = nullptr;        // [phases + 1][blocks]; row 0 is the chain's input
  GridBarrier* barrier = nullptr;  // the persistent forms' (kernels/grid_barrier.h)
  CountingBarrier* counter = nullptr;  // zeroed for each grid size
  int32_t phases = 0;
  int64_t phase_words = 0;         // 16-byte words a phase streams (0: none)
  int32_t blocks = 0;              // the grid of every form (resident at once)
};

// Blocks of the probe's kernels the whole GPU holds at once (kernels/kernel_fit.h; the persistent
// form needs every block resident).
cudaError_t boundary_probe_resident_blocks(int32_t* blocks);

// Phase `phase` of the chain as its own kernel.
cudaError_t launch_boundary_phase(const BoundaryProbe& probe, int32_t phase, LaunchStream stream);

enum class ProbeBarrier { kGrid, kCounting };  // GridBarrier or CountingBarrier

// Every phase in one cooperative launch (refused when its blocks do not fit on the GPU at once),
// waiting at `barrier` between phases.
cudaError_t launch_boundary_persistent(const BoundaryProbe& probe, ProbeBarrier barrier,
                                       cudaStream_t stream);

}  // namespace ls::kernels
