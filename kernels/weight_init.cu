#include "kernels/weight_init.h"

#include "core/ops/seeded_weights.h"

namespace ls::kernels {

namespace {

template <typename T>
__global__ void seeded_kernel(T* out, SeededBlock block, uint64_t seed, uint32_t tensor_index,
                              float center, float half_width) {
  const int64_t count = block.rows * block.cols;
  for (int64_t i = int64_t{blockIdx.x} * blockDim.x + threadIdx.x; i < count;
       i += int64_t{gridDim.x} * blockDim.x) {
    const int64_t r = i / block.cols;
    const int64_t element = block.first + r * block.stride + (i - r * block.cols);
    const float v = ops::seeded_value(seed, tensor_index, element, center, half_width);
    if constexpr (sizeof(T) == 2) {
      out[i] = __float2bfloat16_rn(v);
    } else {
      out[i] = v;
    }
  }
}

__global__ void copy_kernel(int4* dst, const int4* src, int64_t count) {
  for (int64_t i = int64_t{blockIdx.x} * blockDim.x + threadIdx.x; i < count;
       i += int64_t{gridDim.x} * blockDim.x) {
    dst[i] = src[i];
  }
}

__global__ void read_kernel(const int4* src, int64_t count, int4* sink) {
  int4 acc = make_int4(0, 0, 0, 0);
  for (int64_t i = int64_t{blockIdx.x} * blockDim.x + threadIdx.x; i < count;
       i += int64_t{gridDim.x} * blockDim.x) {
    const int4 v = __ldcs(src + i);
    acc.x ^= v.x, acc.y ^= v.y, acc.z ^= v.z, acc.w ^= v.w;
  }
  if ((acc.x | acc.y | acc.z | acc.w) == 0x7fffffff) sink[blockIdx.x] = acc;  // keeps the loads
}

constexpr int32_t kBlocks = kReadBlocks;  // enough to fill an H200; grid-stride beyond
constexpr int32_t kThreads = 256;

template <typename T>
cudaError_t launch_seeded(T* out, SeededBlock block, uint64_t seed, uint32_t tensor_index,
                          float center, float half_width, cudaStream_t stream) {
  if (block.rows < 0 || block.cols < 0 || block.first < 0 || block.stride < 0 || out == nullptr) {
    return cudaErrorInvalidValue;
  }
  if (block.rows == 0 || block.cols == 0) return cudaSuccess;
  seeded_kernel<<<kBlocks, kThreads, 0, stream>>>(out, block, seed, tensor_index, center,
                                                  half_width);
  return cudaGetLastError();
}

}  // namespace

cudaError_t launch_seeded_bf16(__nv_bfloat16* out, SeededBlock block, uint64_t seed,
                               uint32_t tensor_index, float center, float half_width,
                               cudaStream_t stream) {
  return launch_seeded(out, block, seed, tensor_index, center, half_width, stream);
}

cudaError_t launch_seeded_f32(float* out, SeededBlock block, uint64_t seed, uint32_t tensor_index,
                              float center, float half_width, cudaStream_t stream) {
  return launch_seeded(out, block, seed, tensor_index, center, half_width, stream);
}

cudaError_t launch_copy_bytes(void* dst, const void* src, int64_t bytes, cudaStream_t stream) {
  if (bytes < 0 || bytes % 16 != 0 || dst == nullptr || src == nullptr) return cudaErrorInvalidValue;
  if (bytes == 0) return cudaSuccess;
  copy_kernel<<<kBlocks, kThreads, 0, stream>>>(static_cast<int4*>(dst),
                                                static_cast<const int4*>(src), bytes / 16);
  return cudaGetLastError();
}

cudaError_t launch_read_bytes(const void* src, int64_t bytes, void* sink, cudaStream_t stream) {
  if (bytes < 0 || bytes % 16 != 0 || src == nullptr || sink == nullptr) return cudaErrorInvalidValue;
  if (bytes == 0) return cudaSuccess;
  read_kernel<<<kBlocks, kThreads, 0, stream>>>(static_cast<const int4*>(src), bytes / 16,
                                                static_cast<int4*>(sink));
  return cudaGetLastError();
}

}  // namespace ls::kernels
