// One channel's causal conv of the Mamba2 mixer, as a register window: the step both conv kernels
// take per token — the sequential one (mamba_ops.cu) and the chunked launch's, parallel over
// tokens (mamba_scan.cu) — so their outputs and their stored windows are the same bits.
// Included by mamba_ops.cu and mamba_scan.cu.
#pragma once

#include "core/ops/mamba_math.h"
#include "kernels/mamba_ops.h"

namespace ls::kernels {
namespace {

// Channel c's window in `slot` of the pool: conv_kernel floats, oldest input first.
__device__ __forceinline__ float* conv_window_of(const MambaStateView& state, int32_t slot,
                                                 int32_t c, int32_t k) {
  return state.conv + slot * state.slot_stride_floats + int64_t{c} * k;
}

// The window drops its oldest input and takes `input`; the output is the window dotted with the
// taps oldest first, plus the bias (when has_bias), through SiLU.
__device__ __forceinline__ float conv_step(float (&window)[kMambaConvKernelMax],
                                           const float (&taps)[kMambaConvKernelMax], int32_t k,
                                           float input, bool has_bias, float bias) {
  float sum = 0.0f;
#pragma unroll
  for (int32_t i = 0; i < kMambaConvKernelMax; ++i) {
    if (i + 1 < k) window[i] = window[i + 1];
    if (i + 1 == k) window[i] = input;
    if (i < k) sum = ops::mamba_conv_accumulate(sum, window[i], taps[i]);
  }
  if (has_bias) sum += bias;
  return ops::silu(sum);
}

__device__ __forceinline__ void store_window(float* dst,
                                             const float (&window)[kMambaConvKernelMax],
                                             int32_t k) {
#pragma unroll
  for (int32_t i = 0; i < kMambaConvKernelMax; ++i) {
    if (i < k) dst[i] = window[i];
  }
}

// A verified row's token j (MambaRows::verify_base): the window after it goes to its verify slot.
__device__ __forceinline__ void store_verify_window(const MambaStateView& state,
                                                    int32_t verify_base, int32_t j, int32_t c,
                                                    const float (&window)[kMambaConvKernelMax],
                                                    int32_t k) {
  store_window(conv_window_of(state, verify_base + j, c, k), window, k);
}

}  // namespace
}  // namespace ls::kernels
