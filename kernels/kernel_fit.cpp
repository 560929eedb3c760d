#include "kernels/kernel_fit.h"

namespace ls::kernels {
namespace {

constexpr uint64_t pack(size_t shared, int32_t blocks) {
  return uint64_t{shared} << 32 | static_cast<uint32_t>(blocks);
}

}  // namespace

KernelFit::Device* KernelFit::current_device(cudaError_t* status) {
  int device = 0;
  *status = cudaGetDevice(&device);
  if (*status != cudaSuccess) return nullptr;
  if (device < 0 || device >= kDevicesMax) {
    *status = cudaErrorInvalidDevice;
    return nullptr;
  }
  return &devices_[static_cast<size_t>(device)];
}

cudaError_t KernelFit::grant_locked(Device& device, const void* kernel, size_t shared) {
  if (shared <= device.granted.load(std::memory_order_relaxed)) return cudaSuccess;
  const cudaError_t status = cudaFuncSetAttribute(
      kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(shared));
  if (status == cudaSuccess) device.granted.store(shared, std::memory_order_release);
  return status;
}

cudaError_t KernelFit::grant(const void* kernel, size_t shared) {
  cudaError_t status = cudaSuccess;
  Device* device = current_device(&status);
  if (device == nullptr) return status;
  if (shared <= device->granted.load(std::memory_order_acquire)) return cudaSuccess;
  const std::lock_guard<std::mutex> lock(asking_);
  return grant_locked(*device, kernel, shared);
}

cudaError_t KernelFit::resident_on_gpu(const void* kernel, int32_t threads, size_t shared,
                                       int32_t* blocks) {
  cudaError_t status = cudaSuccess;
  Device* device = current_device(&status);
  if (device == nullptr) return status;
  // An answer is stored only after its size was granted, and grants only grow: a hit may launch.
  const auto known = [&]() -> bool {
    for (const std::atomic<uint64_t>& answer : device->answers) {
      const uint64_t a = answer.load(std::memory_order_acquire);
      if (a != 0 && a >> 32 == shared) {
        *blocks = static_cast<int32_t>(a & 0xffffffffu);
        return true;
      }
    }
    return false;
  };
  if (known()) return cudaSuccess;
  const std::lock_guard<std::mutex> lock(asking_);
  if (known()) return cudaSuccess;
  if (status = grant_locked(*device, kernel, shared); status != cudaSuccess) return status;
  int device_index = 0, sms = 0, per_sm = 0;
  if (status = cudaGetDevice(&device_index); status != cudaSuccess) return status;
  status = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device_index);
  if (status != cudaSuccess) return status;
  status = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, threads, shared);
  if (status != cudaSuccess) return status;
  if (per_sm < 1) return cudaErrorInvalidConfiguration;  // the block does not fit an SM
  *blocks = sms * per_sm;
  for (std::atomic<uint64_t>& answer : device->answers) {
    if (answer.load(std::memory_order_relaxed) == 0) {
      answer.store(pack(shared, *blocks), std::memory_order_release);
      break;
    }
  }
  return cudaSuccess;
}

}  // namespace ls::kernels
