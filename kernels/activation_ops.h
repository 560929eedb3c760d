// The per-layer activation digests of the CUDA backend (core/activations.h is the definition:
// the logits digest of core/ops/digest.h over each row's values as fp32, a bf16 value widened
// exactly). What --record-activations writes on CUDA without copying the tensors to the host.
// The CPU reference is core/activations.cpp activation_row_digest; tests/gpu/ compares them.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

namespace ls::kernels {

// out[r] = the digest of row (row_index ? row_index[r] : r) of x [*, width] T (float or bf16),
// for r in [0, rows). One block a row; the lanes' sums are integers mod 2^32, so the reduction's
// order changes no bit. rows in [0, 2^31), width >= 1.
template <typename T>
cudaError_t launch_activation_digests(const T* x, const int64_t* row_index, int32_t rows,
                                      int32_t width, uint64_t* out, cudaStream_t stream);

}  // namespace ls::kernels
