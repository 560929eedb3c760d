// The per-element arithmetic of the layers, one definition for the CPU reference
// (core/cpu_model.cpp, core/model/rope.cpp), the CUDA kernels (kernels/layer_ops.cu) and the GPU
// tests' references. The kernels keep their own parallel reductions (a block sum is not the
// CPU's eight-lane dot), so the two backends agree to rounding of the sum of squares. RoPE is
// exact on both (every operation rounded on its own); SwiGLU's e^x is each side's expf, whose
// host and CUDA bits may differ.
#pragma once

#include "core/ops/host_device.h"
#include "core/ops/math.h"

#include <cstdint>

namespace ls::ops {

// RMSNorm: y_i = (x_i · scale) · w_i with scale = 1 / sqrt(Σ x² / n + eps).
LS_HOST_DEVICE LS_INLINE float rms_norm_scale(float sum_squares, int32_t n, float eps) {
  const float mean_square = sum_squares / static_cast<float>(n);
  return 1.0f / sqrt_f(mean_square + eps);
}

LS_HOST_DEVICE LS_INLINE float rms_norm_element(float x, float scale, float weight) {
  return x * scale * weight;
}

// RoPE in the rotate-half convention: element i pairs with i + head_dim/2.
struct RotatedPair {
  float first;
  float second;
};

// Each product and sum rounded on its own (host_device.h): nvcc left to itself fuses one product
// into the sum or difference, at whichever site it sees fit, so the RoPE kernel, the GEMV's and
// the small-M GEMM's epilogues and the CPU could each round the pair differently.
LS_HOST_DEVICE LS_INLINE RotatedPair rope_rotate(float x1, float x2, float c, float s) {
  return RotatedPair{sub_rn(mul_rn(x1, c), mul_rn(x2, s)), add_rn(mul_rn(x2, c), mul_rn(x1, s))};
}

// SwiGLU on one element: silu(gate) · up, silu(g) = g / (1 + e^(−g)).
// The sum and the product rounded on their own: nvcc fuses `1 +` into expf's last scaling multiply
// (an fma in swiglu_kernel's PTX) wherever it sees fit, as it did RoPE's products.
LS_HOST_DEVICE LS_INLINE float swiglu(float gate, float up) {
  return mul_rn(gate / add_rn(1.0f, exp_f(-gate)), up);
}

// The CPU reference's dot product: eight interleaved partial sums combined pairwise, one fixed
// order that depends only on n, so a token's result never depends on the batch.
LS_HOST_DEVICE LS_INLINE float dot_fixed_order(const float* a, const float* b, int32_t n) {
  float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  int32_t i = 0;
  for (; i + 8 <= n; i += 8) {
    for (int32_t k = 0; k < 8; ++k) acc[k] += a[i + k] * b[i + k];
  }
  for (int32_t k = 0; i < n; ++i, ++k) acc[k] += a[i] * b[i];
  return ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
}

// RMSNorm of one row as the CPU reference computes it (y may alias x).
LS_HOST_DEVICE LS_INLINE void rms_norm_row(const float* x, const float* weight, int32_t n, float eps,
                                           float* y) {
  const float scale = rms_norm_scale(dot_fixed_order(x, x, n), n, eps);
  for (int32_t i = 0; i < n; ++i) y[i] = rms_norm_element(x[i], scale, weight[i]);
}

}  // namespace ls::ops
