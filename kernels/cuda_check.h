// Checks for every CUDA and cuBLAS call (STYLE.md §11): a failure throws ls::Error naming the
// expression, the status and file:line. Host code only.
#pragma once

#include "core/check.h"

#include <cublas_v2.h>
#include <cuda_runtime.h>

namespace ls {

inline void check_cuda(cudaError_t status, const char* expression, const char* file, int line) {
  if (status != cudaSuccess) [[unlikely]] {
    throw Error(fmt::format("CUDA call failed: {} returned {} ({}) at {}:{}", expression,
                            cudaGetErrorName(status), cudaGetErrorString(status), file, line));
  }
}

inline void check_cublas(cublasStatus_t status, const char* expression, const char* file,
                         int line) {
  if (status != CUBLAS_STATUS_SUCCESS) [[unlikely]] {
    throw Error(fmt::format("cuBLAS call failed: {} returned {} ({}) at {}:{}", expression,
                            cublasGetStatusName(status), cublasGetStatusString(status), file,
                            line));
  }
}

}  // namespace ls

#define LS_CUDA(expr) ::ls::check_cuda((expr), #expr, __FILE__, __LINE__)
#define LS_CUBLAS(expr) ::ls::check_cublas((expr), #expr, __FILE__, __LINE__)
