// The per-element arithmetic of the Mamba2 mixer, one definition for the CPU reference
// (core/mamba_mixer.cpp) and the CUDA kernels (kernels/mamba_ops.cu). The kernels keep their own
// parallel reductions (the sum over the state dimension and the gated norm's sum of squares are
// lane-strided then butterflied, not the CPU's ascending loops), so the two backends agree to the
// rounding of those sums and of the libm functions, and exactly in everything written here.
#pragma once

#include "core/ops/host_device.h"
#include "core/ops/math.h"

namespace ls::ops {

// silu(x) = x / (1 + e^(−x)).
LS_HOST_DEVICE LS_INLINE float silu(float x) { return x / (1.0f + exp_f(-x)); }

// torch.nn.functional.softplus with its defaults (beta 1, threshold 20).
LS_HOST_DEVICE LS_INLINE float softplus(float x) { return x > 20.0f ? x : log1p_f(exp_f(x)); }

// The step size of one head: clamp(softplus(dt + dt_bias), time_step_limit), clamped as
// std::clamp does (a NaN passes through).
LS_HOST_DEVICE LS_INLINE float mamba_step_size(float dt, float dt_bias, float dt_min,
                                               float dt_max) {
  const float value = softplus(dt + dt_bias);
  return value < dt_min ? dt_min : (dt_max < value ? dt_max : value);
}

// The state's decay over one step: exp(dt · A) with A = −exp(A_log).
LS_HOST_DEVICE LS_INLINE float mamba_decay(float step, float a_log) {
  const float a = -exp_f(a_log);
  return exp_f(step * a);
}

// The products and sums below are rounded one by one on the device too (no fused multiply-add),
// so given the same inputs both backends compute the same bits.

// One tap of the causal conv: sum + x · tap.
LS_HOST_DEVICE LS_INLINE float mamba_conv_accumulate(float sum, float x, float tap) {
  return add_rn(sum, mul_rn(x, tap));
}

// One element of the state update: h · decay + (dt · B_n) · x.
LS_HOST_DEVICE LS_INLINE float mamba_state_update(float h, float decay, float step, float b,
                                                  float x) {
  return add_rn(mul_rn(h, decay), mul_rn(mul_rn(step, b), x));
}

// A head element's output: C · h plus the D skip, C · h + x · D.
LS_HOST_DEVICE LS_INLINE float mamba_output(float c_dot_h, float x, float d_skip) {
  return add_rn(c_dot_h, mul_rn(x, d_skip));
}

}  // namespace ls::ops
