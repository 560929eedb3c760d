#include "kernels/shared_device_ops.h"

namespace ls::kernels {

namespace {

constexpr int32_t kThreads = 256;
constexpr int32_t kBlocksMax = 1024;

int32_t blocks_for(size_t count) {
  const size_t blocks = (count + kThreads - 1) / kThreads;
  return static_cast<int32_t>(blocks < kBlocksMax ? (blocks > 0 ? blocks : 1) : kBlocksMax);
}

// The slab part of parity `parity`, rank `rank`.
__device__ float* part(const SharedDeviceSlab& g, unsigned long long parity, int32_t rank) {
  return g.slab + (parity * static_cast<size_t>(g.ranks) + static_cast<size_t>(rank)) * g.count_max;
}

// The calls counter as the other ranks' kernels write it: read through L2, never a stale L1 line.
__device__ unsigned long long load_calls(const SharedDeviceSlab& g, int32_t rank) {
  return *reinterpret_cast<volatile unsigned long long*>(g.calls + rank);
}

__global__ void deposit_kernel(SharedDeviceSlab g, int32_t rank, const float* send, size_t count) {
  float* dst = part(g, load_calls(g, rank) & 1ull, rank);
  for (size_t i = size_t{blockIdx.x} * blockDim.x + threadIdx.x; i < count;
       i += size_t{gridDim.x} * blockDim.x) {
    __stcg(dst + i, send[i]);
  }
}

__global__ void barrier_kernel(SharedDeviceSlab g, int32_t rank) {
  __threadfence();  // this rank's deposit is visible before its arrival is
  const unsigned long long mine = load_calls(g, rank) + 1;
  atomicExch(g.calls + rank, mine);
  for (int32_t q = 0; q < g.ranks; ++q) {
    while (load_calls(g, q) < mine) __nanosleep(200);
  }
  __threadfence();
}

__global__ void sum_kernel(SharedDeviceSlab g, int32_t rank, float* out, size_t count) {
  const unsigned long long parity = (load_calls(g, rank) - 1) & 1ull;
  for (size_t i = size_t{blockIdx.x} * blockDim.x + threadIdx.x; i < count;
       i += size_t{gridDim.x} * blockDim.x) {
    float sum = __ldcg(part(g, parity, 0) + i);
    for (int32_t q = 1; q < g.ranks; ++q) sum = __fadd_rn(sum, __ldcg(part(g, parity, q) + i));
    out[i] = sum;
  }
}

__global__ void gather_kernel(SharedDeviceSlab g, int32_t rank, float* out, size_t count) {
  const unsigned long long parity = (load_calls(g, rank) - 1) & 1ull;
  const size_t total = count * static_cast<size_t>(g.ranks);
  for (size_t i = size_t{blockIdx.x} * blockDim.x + threadIdx.x; i < total;
       i += size_t{gridDim.x} * blockDim.x) {
    const size_t q = i / count;
    out[i] = __ldcg(part(g, parity, static_cast<int32_t>(q)) + (i - q * count));
  }
}

bool valid(const SharedDeviceSlab& g, int32_t rank, size_t count) {
  return g.slab != nullptr && g.calls != nullptr && g.ranks >= 1 && rank >= 0 && rank < g.ranks &&
         count <= g.count_max;
}

}  // namespace

cudaError_t launch_shared_deposit(SharedDeviceSlab group, int32_t rank, const float* send,
                                  size_t count, cudaStream_t stream) {
  if (!valid(group, rank, count) || (count > 0 && send == nullptr)) return cudaErrorInvalidValue;
  if (count == 0) return cudaSuccess;
  deposit_kernel<<<blocks_for(count), kThreads, 0, stream>>>(group, rank, send, count);
  return cudaGetLastError();
}

cudaError_t launch_shared_barrier(SharedDeviceSlab group, int32_t rank, cudaStream_t stream) {
  if (!valid(group, rank, 0)) return cudaErrorInvalidValue;
  barrier_kernel<<<1, 1, 0, stream>>>(group, rank);
  return cudaGetLastError();
}

cudaError_t launch_shared_sum(SharedDeviceSlab group, int32_t rank, float* out, size_t count,
                              cudaStream_t stream) {
  if (!valid(group, rank, count) || (count > 0 && out == nullptr)) return cudaErrorInvalidValue;
  if (count == 0) return cudaSuccess;
  sum_kernel<<<blocks_for(count), kThreads, 0, stream>>>(group, rank, out, count);
  return cudaGetLastError();
}

cudaError_t launch_shared_gather(SharedDeviceSlab group, int32_t rank, float* out, size_t count,
                                 cudaStream_t stream) {
  if (!valid(group, rank, count) || (count > 0 && out == nullptr)) return cudaErrorInvalidValue;
  if (count == 0) return cudaSuccess;
  gather_kernel<<<blocks_for(count * static_cast<size_t>(group.ranks)), kThreads, 0, stream>>>(
      group, rank, out, count);
  return cudaGetLastError();
}

}  // namespace ls::kernels
