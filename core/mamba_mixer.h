// The Mamba2 mixer of one token as the CPU reference computes it, between the in_proj and the
// out_proj GEMMs: the causal depthwise conv over its window, SiLU, the step size, the selective
// state update per head, the D skip and the gated RMSNorm. CpuModel runs it for every token of a
// Mamba layer in buffer order; the GPU tests run it as the oracle of kernels/mamba_ops.h.
#pragma once

#include "core/config.h"
#include "core/model/weights.h"

#include <vector>

namespace ls {

// One token's intermediates, sized once from the mixer's shape.
struct MambaScratch {
  std::vector<float> conv_out;  // [conv_dim] the conv's SiLU output: x, then B, then C
  std::vector<float> dt;        // [heads] the step sizes
};

MambaScratch make_mamba_scratch(const MambaConfig& m);

// `proj` [in_proj_size]: the token's in_proj output (gate, xBC, dt side by side). `state`: the
// request's state in this layer, the conv window [conv_dim, conv_kernel] (oldest first) then the
// SSM state [heads, head_dim, state_size], updated in place. `y` [inner]: RMSNorm(y · silu(gate))
// with `w.mamba_norm` and `rms_eps`, the out_proj's input. Reads only the mixer fields of `w`
// (conv_weight, conv_bias, dt_bias, a_log, d_skip, mamba_norm).
void mamba_mixer_token(const MambaConfig& m, const LayerWeights& w, float rms_eps,
                       const float* proj, float* state, MambaScratch& scratch, float* y);

}  // namespace ls
