// The planted single-layer perturbation of issue 15's localisation tests: the layer and the
// change, one definition for the CPU seam (perturb_layer_output.cpp) and the CUDA one
// (perturb_layer_output_cuda.cu), and for the tests that expect `--localise` to name them.
#pragma once

#include <cstdint>

namespace ls::planted {

// The layer whose output (the residual after its MLP, "mlp_out") is perturbed: tiny's last
// layer, so every tensor of layer 0 must still agree.
inline constexpr int32_t kPerturbedLayer = 1;
// Added to element 0 of the layer's first token row: far beyond bf16's rounding and the
// cross-backend tolerance, so the CUDA-against-CPU localisation finds it too.
inline constexpr float kPerturbation = 64.0f;

}  // namespace ls::planted
