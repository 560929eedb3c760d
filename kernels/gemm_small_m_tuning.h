// The small-M GEMM (kernels/gemm_small_m.h) with the K split of the caller's choosing instead of
// the production rule's: what `lockstep_gpu_bench --small-m-sweep` measures to choose that rule.
// A split's results depend on (out, in, splits) only — never on the token count — so each is
// batch-invariant; two split counts sum in different orders.
#pragma once

#include "kernels/launch.h"

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

namespace ls::kernels {

// The K ranges `in` is cut into when about `wanted` are asked for (whole 64-wide chunks, none
// empty).
int32_t gemm_small_m_splits_with(int32_t out, int32_t in, int32_t wanted);

size_t gemm_small_m_workspace_bytes_with(int32_t out, int32_t in, int32_t tokens_max,
                                         int32_t wanted);

// launch_gemm_small_m_bf16's contract, with the split given.
cudaError_t launch_gemm_small_m_bf16_with(const __nv_bfloat16* x, const __nv_bfloat16* w,
                                          float* y, int32_t tokens, int32_t out, int32_t in,
                                          float beta, void* workspace, size_t workspace_bytes,
                                          int32_t wanted_splits, LaunchStream stream);

}  // namespace ls::kernels
