// cuBLAS and cuBLASLt, loaded when the CUDA backend first calls them rather than when a program
// starts. Linking libcublas and libcublasLt costs every process ~217 MB of resident memory at exec
// time (the loader's relocations of two very large libraries), before main runs: `lockstep --help`
// or `lockstep report` of a trace paid it too. So no lockstep target links them; this file defines
// the cuBLAS entry points the backend and its tests call, each forwarding to the same function of
// the library, dlopen'ed (RTLD_LOCAL) by its soname at the first call. The signatures are the
// headers' own: an extern "C" definition that differed from its declaration would not compile.
//
// A machine without the library gets ls::Error naming it and dlerror()'s reason
// (kernels/dynamic_library.h) — an operating error (a CUDA backend asked for where cuBLAS is
// missing), not an abort.
#include "kernels/dynamic_library.h"

#include <cublasLt.h>
#include <cublas_v2.h>
#include <fmt/format.h>

#include <string>

namespace ls::kernels {
namespace {

enum class Library { kCublas, kCublasLt };

void* open_cublas(Library library) {
  const std::string soname = library == Library::kCublas ? fmt::format("libcublas.so.{}", CUBLAS_VER_MAJOR)
                                                         : fmt::format("libcublasLt.so.{}", CUBLAS_VER_MAJOR);
  return open_library(soname, fmt::format("the CUDA backend needs {} (cuBLAS {})", soname,
                                          CUBLAS_VER_MAJOR));
}

// Each library is opened once (thread-safe static initialisation).
void* library_handle(Library library) {
  if (library == Library::kCublas) {
    static void* const handle = open_cublas(Library::kCublas);
    return handle;
  }
  static void* const handle = open_cublas(Library::kCublasLt);
  return handle;
}

void* resolve(Library library, const char* name) {
  return resolve_function(library_handle(library), name, fmt::format("cuBLAS {}", CUBLAS_VER_MAJOR));
}

}  // namespace
}  // namespace ls::kernels

// One forwarding definition: the library's function, resolved at its first call.
#define LS_CUBLAS_FORWARD(library, result, name, params, args)                                          \
  extern "C" result name params {                                                                       \
    using Function = result(*) params;                                                                  \
    static const auto real = reinterpret_cast<Function>(                                                \
        ::ls::kernels::resolve(::ls::kernels::Library::library, #name));                                \
    return real args;                                                                                   \
  }

LS_CUBLAS_FORWARD(kCublas, cublasStatus_t, cublasCreate_v2, (cublasHandle_t * handle), (handle))
LS_CUBLAS_FORWARD(kCublas, cublasStatus_t, cublasDestroy_v2, (cublasHandle_t handle), (handle))
LS_CUBLAS_FORWARD(kCublas, cublasStatus_t, cublasSetStream_v2, (cublasHandle_t handle, cudaStream_t stream),
                  (handle, stream))
LS_CUBLAS_FORWARD(kCublas, cublasStatus_t, cublasSetWorkspace_v2,
                  (cublasHandle_t handle, void* workspace, size_t bytes), (handle, workspace, bytes))
LS_CUBLAS_FORWARD(kCublas, cublasStatus_t, cublasGetProperty, (libraryPropertyType type, int* value),
                  (type, value))
LS_CUBLAS_FORWARD(kCublas, cublasStatus_t, cublasSetMathMode, (cublasHandle_t handle, cublasMath_t mode),
                  (handle, mode))
LS_CUBLAS_FORWARD(kCublas, cublasStatus_t, cublasSetAtomicsMode,
                  (cublasHandle_t handle, cublasAtomicsMode_t mode), (handle, mode))
LS_CUBLAS_FORWARD(kCublas, const char*, cublasGetStatusName, (cublasStatus_t status), (status))
LS_CUBLAS_FORWARD(kCublas, const char*, cublasGetStatusString, (cublasStatus_t status), (status))
LS_CUBLAS_FORWARD(kCublas, cublasStatus_t, cublasGemmEx,
                  (cublasHandle_t handle, cublasOperation_t transa, cublasOperation_t transb, int m, int n,
                   int k, const void* alpha, const void* a, cudaDataType a_type, int lda, const void* b,
                   cudaDataType b_type, int ldb, const void* beta, void* c, cudaDataType c_type, int ldc,
                   cublasComputeType_t compute_type, cublasGemmAlgo_t algo),
                  (handle, transa, transb, m, n, k, alpha, a, a_type, lda, b, b_type, ldb, beta, c, c_type,
                   ldc, compute_type, algo))

LS_CUBLAS_FORWARD(kCublasLt, cublasStatus_t, cublasLtCreate, (cublasLtHandle_t * handle), (handle))
LS_CUBLAS_FORWARD(kCublasLt, cublasStatus_t, cublasLtDestroy, (cublasLtHandle_t handle), (handle))
LS_CUBLAS_FORWARD(kCublasLt, cublasStatus_t, cublasLtMatmul,
                  (cublasLtHandle_t handle, cublasLtMatmulDesc_t desc, const void* alpha, const void* a,
                   cublasLtMatrixLayout_t a_layout, const void* b, cublasLtMatrixLayout_t b_layout,
                   const void* beta, const void* c, cublasLtMatrixLayout_t c_layout, void* d,
                   cublasLtMatrixLayout_t d_layout, const cublasLtMatmulAlgo_t* algo, void* workspace,
                   size_t workspace_bytes, cudaStream_t stream),
                  (handle, desc, alpha, a, a_layout, b, b_layout, beta, c, c_layout, d, d_layout, algo,
                   workspace, workspace_bytes, stream))
LS_CUBLAS_FORWARD(kCublasLt, cublasStatus_t, cublasLtMatmulAlgoGetHeuristic,
                  (cublasLtHandle_t handle, cublasLtMatmulDesc_t desc, cublasLtMatrixLayout_t a_layout,
                   cublasLtMatrixLayout_t b_layout, cublasLtMatrixLayout_t c_layout,
                   cublasLtMatrixLayout_t d_layout, cublasLtMatmulPreference_t preference,
                   int requested_count, cublasLtMatmulHeuristicResult_t results[], int* returned_count),
                  (handle, desc, a_layout, b_layout, c_layout, d_layout, preference, requested_count, results,
                   returned_count))
LS_CUBLAS_FORWARD(kCublasLt, cublasStatus_t, cublasLtMatmulDescSetAttribute,
                  (cublasLtMatmulDesc_t desc, cublasLtMatmulDescAttributes_t attribute, const void* buffer,
                   size_t bytes),
                  (desc, attribute, buffer, bytes))
LS_CUBLAS_FORWARD(kCublasLt, cublasStatus_t, cublasLtMatmulPreferenceSetAttribute,
                  (cublasLtMatmulPreference_t preference, cublasLtMatmulPreferenceAttributes_t attribute,
                   const void* buffer, size_t bytes),
                  (preference, attribute, buffer, bytes))
// The headers' inline cublasLt*Init wrappers call these.
LS_CUBLAS_FORWARD(kCublasLt, cublasStatus_t, cublasLtMatrixLayoutInit_internal,
                  (cublasLtMatrixLayout_t layout, size_t size, cudaDataType type, uint64_t rows, uint64_t cols,
                   int64_t ld),
                  (layout, size, type, rows, cols, ld))
LS_CUBLAS_FORWARD(kCublasLt, cublasStatus_t, cublasLtMatmulDescInit_internal,
                  (cublasLtMatmulDesc_t desc, size_t size, cublasComputeType_t compute_type,
                   cudaDataType_t scale_type),
                  (desc, size, compute_type, scale_type))
LS_CUBLAS_FORWARD(kCublasLt, cublasStatus_t, cublasLtMatmulPreferenceInit_internal,
                  (cublasLtMatmulPreference_t preference, size_t size), (preference, size))
