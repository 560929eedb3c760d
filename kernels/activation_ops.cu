#include "kernels/activation_ops.h"

#include "core/ops/digest.h"

namespace ls::kernels {

namespace {

constexpr int32_t kThreads = 256;

__device__ __forceinline__ uint32_t widened_bits(float x) { return __float_as_uint(x); }
__device__ __forceinline__ uint32_t widened_bits(__nv_bfloat16 x) {
  return static_cast<uint32_t>(__bfloat16_as_ushort(x)) << 16;
}

template <typename T>
__global__ void __launch_bounds__(kThreads)
activation_digests_kernel(const T* x, const int64_t* row_index, int32_t width, uint64_t* out) {
  const int64_t r = row_index ? row_index[blockIdx.x] : static_cast<int64_t>(blockIdx.x);
  const T* row = x + r * width;
  uint32_t a = 0, b = 0;
  for (int32_t i = static_cast<int32_t>(threadIdx.x); i < width; i += kThreads) {
    const uint32_t u = widened_bits(row[i]);
    a += digest::lane_a(u, static_cast<uint32_t>(i));
    b += digest::lane_b(u, static_cast<uint32_t>(i));
  }
  __shared__ uint32_t sums_a[kThreads];
  __shared__ uint32_t sums_b[kThreads];
  sums_a[threadIdx.x] = a;
  sums_b[threadIdx.x] = b;
  __syncthreads();
  for (int32_t half = kThreads / 2; half > 0; half /= 2) {
    if (static_cast<int32_t>(threadIdx.x) < half) {
      sums_a[threadIdx.x] += sums_a[threadIdx.x + half];
      sums_b[threadIdx.x] += sums_b[threadIdx.x + half];
    }
    __syncthreads();
  }
  if (threadIdx.x == 0) {
    out[blockIdx.x] = digest::finish(sums_a[0], sums_b[0], static_cast<uint32_t>(width));
  }
}

}  // namespace

template <typename T>
cudaError_t launch_activation_digests(const T* x, const int64_t* row_index, int32_t rows,
                                      int32_t width, uint64_t* out, cudaStream_t stream) {
  if (rows < 0 || width < 1 || x == nullptr || out == nullptr) return cudaErrorInvalidValue;
  if (rows == 0) return cudaSuccess;
  activation_digests_kernel<T><<<rows, kThreads, 0, stream>>>(x, row_index, width, out);
  return cudaGetLastError();
}

template cudaError_t launch_activation_digests<float>(const float*, const int64_t*, int32_t,
                                                      int32_t, uint64_t*, cudaStream_t);
template cudaError_t launch_activation_digests<__nv_bfloat16>(const __nv_bfloat16*, const int64_t*,
                                                              int32_t, int32_t, uint64_t*,
                                                              cudaStream_t);

}  // namespace ls::kernels
