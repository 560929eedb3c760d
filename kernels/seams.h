// Link seams of the CUDA backend for planted-bug tests (core/seams.h has the pattern): each
// function alone in its translation unit, kernels/seam_*.cpp, which the production library builds;
// a test-only executable links a file of tests/planted/ as an object of its own in its place.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace ls::seams {

// Every layer's output on the CUDA backend (the fp32 residual stream after its MLP,
// [tokens, hidden] on `stream`), launched after the layer's kernels: production launches nothing.
// Planted (tests/planted/perturb_layer_output_cuda.cu, the `lockstep_planted_cuda` CLI): one
// element of one layer changed, which `lockstep replay --localise` must name (issue 15).
void cuda_layer_output(int32_t layer, float* residual, int32_t tokens, int32_t hidden,
                       cudaStream_t stream);

}  // namespace ls::seams
