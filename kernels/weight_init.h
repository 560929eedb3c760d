// Seeded random weights generated directly on the device as bf16 — for benchmarks of shapes whose
// fp32 host weights would not fit in host memory (llama-8b needs ~32 GB). Element i of tensor t is
// center + half_width·(2u − 1), u = uniform_from_bits(Philox4x32-10(seed, i, t)[0]) — the formula
// of ls::weights_from_seed, so the result equals its weights rounded to bf16.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

namespace ls::kernels {

// The elements of a seeded tensor that one launch writes, out[r · cols + c] = element
// first + r · stride + c for r < rows, c < cols: the whole tensor (rows · cols elements, stride
// = cols), a tensor-parallel rank's rows of it (first = its first row · cols) or its columns of
// every row (first = its first column, stride = the tensor's columns).
struct SeededBlock {
  int64_t rows = 0;
  int64_t cols = 0;
  int64_t first = 0;
  int64_t stride = 0;
};

cudaError_t launch_seeded_bf16(__nv_bfloat16* out, SeededBlock block, uint64_t seed,
                               uint32_t tensor_index, float center, float half_width,
                               cudaStream_t stream);
cudaError_t launch_seeded_f32(float* out, SeededBlock block, uint64_t seed, uint32_t tensor_index,
                              float center, float half_width, cudaStream_t stream);

// Streaming copy for the bandwidth probe: dst[i] = src[i], 16 bytes per thread per step.
cudaError_t launch_copy_bytes(void* dst, const void* src, int64_t bytes, cudaStream_t stream);

// Streaming read for the bandwidth probe (what a decode step does to its weights): XORs every
// 16-byte word of src; sink [kReadBlocks] 16-byte words is written only in a case that never
// happens, which keeps the loads.
constexpr int32_t kReadBlocks = 132 * 16;
cudaError_t launch_read_bytes(const void* src, int64_t bytes, void* sink, cudaStream_t stream);

}  // namespace ls::kernels
