// Linear layers through cuBLAS: bf16 operands, fp32 accumulation and fp32 output, row-major
// y[tokens, out] = x[tokens, in] · w[out, in]ᵀ + beta · y (beta = 1 fuses the residual add).
//
// Determinism: cuBLAS gives bit-identical results run to run for one shape on one GPU model and
// SM count when the handle has a fixed workspace (cublasSetWorkspace) and atomics are not allowed
// (the default); the algorithm is cuBLAS's heuristic choice for the shape, a pure function of it.
#pragma once

#include <cublas_v2.h>
#include <cuda_bf16.h>

#include <cstdint>

namespace ls::kernels {

cublasStatus_t gemm_bf16_rowmajor(cublasHandle_t handle, const __nv_bfloat16* x,
                                  const __nv_bfloat16* w, float* y, int32_t tokens, int32_t out,
                                  int32_t in, float beta);

}  // namespace ls::kernels
