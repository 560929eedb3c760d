// Planted (core/seams.h cpu_layer_output): layer kPerturbedLayer's output on the CPU reference
// gains kPerturbation in element 0 of its first token. Linked as an object of the
// lockstep_planted_cpu CLI, so it takes the place of core/seam_layer_output.cpp.
#include "core/seams.h"
#include "tests/planted/perturb_layer_output.h"

namespace ls::seams {

void cpu_layer_output(int32_t layer, std::span<float> residual) {
  if (layer == planted::kPerturbedLayer && !residual.empty()) residual[0] += planted::kPerturbation;
}

}  // namespace ls::seams
