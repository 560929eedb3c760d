// Linear layers, row-major y[tokens, out] = x[tokens, in] · w[out, in]ᵀ + beta · y (beta = 1 fuses
// the residual add), fp32 accumulation and fp32 output:
//   - GemmPlans (gemm_plans.h): cuBLASLt, bf16 operands, the algorithm pinned per shape
//     (production, steps with many tokens);
//   - gemm_f32_rowmajor: cuBLAS, fp32 operands with CUBLAS_COMPUTE_32F_PEDANTIC (no TF32, no
//     reduced-precision paths): the fp32 mode, whose only difference from the CPU reference's
//     dot products is the order of the sums;
//   - launch_gemv_bf16: lockstep's own kernel for steps of at most kGemvTokensMax tokens (decode
//     at small batch), where a GEMM's tiles leave most of the GPU idle and the step is a stream
//     of the weights: one warp per output row, 16-byte streaming loads, a fixed summation order
//     that depends only on `in` (so a token's result does not depend on the other tokens);
//   - launch_gemm_small_m_bf16 (gemm_small_m.h): lockstep's tensor-core kernel for steps of up to
//     kSmallMGemmTokensMax tokens (CudaBackendOptions::small_m_gemm_tokens_max): the weights
//     streamed once whatever the token count, a summation order fixed by (out, in) alone.
//
// Determinism: cuBLAS gives bit-identical results run to run for one shape on one GPU model and
// SM count when the handle has a fixed workspace (cublasSetWorkspace) and atomics are not allowed
// (the default); the bf16 path goes further and pins the algorithm per shape (GemmPlans).
#pragma once

#include "kernels/launch.h"

#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

namespace ls::kernels {

cublasStatus_t gemm_f32_rowmajor(cublasHandle_t handle, const float* x, const float* w, float* y,
                                 int32_t tokens, int32_t out, int32_t in, float beta);

constexpr int32_t kGemvTokensMax = 8;

// Needs 1 <= tokens <= kGemvTokensMax, in % 8 == 0, and x, w 16-byte aligned.
cudaError_t launch_gemv_bf16(const __nv_bfloat16* x, const __nv_bfloat16* w, float* y,
                             int32_t tokens, int32_t out, int32_t in, float beta,
                             LaunchStream stream);

}  // namespace ls::kernels
