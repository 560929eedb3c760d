// A shared library the CUDA backend loads at its first call instead of linking (cuBLAS, NCCL:
// kernels/cublas_loader.cpp, kernels/nccl_loader.cpp). Opened by soname with RTLD_NOW |
// RTLD_LOCAL and never closed, so its functions stay callable until the process ends, as when it
// was linked. A failure is an ls::Error naming the library and dlerror()'s reason.
#pragma once

#include <string>

namespace ls::kernels {

// `needed_by`: who needs it, for the message ("the CUDA backend needs libcublas.so.13 (cuBLAS 13)").
void* open_library(const std::string& soname, const std::string& needed_by);

// The address of `name` in `handle`; `library` names it in the message ("cuBLAS 13").
void* resolve_function(void* handle, const char* name, const std::string& library);

}  // namespace ls::kernels
