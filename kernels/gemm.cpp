#include "kernels/gemm.h"

namespace ls::kernels {

cublasStatus_t gemm_f32_rowmajor(cublasHandle_t handle, const float* x, const float* w, float* y,
                                 int32_t tokens, int32_t out, int32_t in, float beta) {
  if (tokens < 0 || out < 1 || in < 1) return CUBLAS_STATUS_INVALID_VALUE;
  if (tokens == 0) return CUBLAS_STATUS_SUCCESS;
  const float alpha = 1.0f;
  return cublasGemmEx(handle, CUBLAS_OP_T, CUBLAS_OP_N, out, tokens, in, &alpha, w, CUDA_R_32F,
                      in, x, CUDA_R_32F, in, &beta, y, CUDA_R_32F, out,
                      CUBLAS_COMPUTE_32F_PEDANTIC, CUBLAS_GEMM_DEFAULT);
}

}  // namespace ls::kernels
