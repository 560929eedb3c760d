// Planted (kernels/seams.h cuda_layer_output): layer kPerturbedLayer's output on the CUDA backend
// gains kPerturbation in element 0 of its first token (one thread, on the step's stream, so a
// captured graph replays it too). Linked as an object of the lockstep_planted_cuda CLI, so it
// takes the place of kernels/seam_layer_output.cpp.
#include "kernels/seams.h"
#include "tests/planted/perturb_layer_output.h"

#include <cstdio>
#include <cstdlib>

namespace ls::seams {

namespace {

__global__ void add_to_first_element(float* residual, float delta) { residual[0] += delta; }

}  // namespace

void cuda_layer_output(int32_t layer, float* residual, int32_t tokens, int32_t hidden,
                       cudaStream_t stream) {
  if (layer != planted::kPerturbedLayer || tokens < 1 || hidden < 1) return;
  add_to_first_element<<<1, 1, 0, stream>>>(residual, planted::kPerturbation);
  const cudaError_t status = cudaGetLastError();
  if (status != cudaSuccess) {
    std::fprintf(stderr, "planted cuda_layer_output: %s\n", cudaGetErrorString(status));
    std::abort();
  }
}

}  // namespace ls::seams
