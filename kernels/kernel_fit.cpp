#include "kernels/kernel_fit.h"

namespace ls::kernels {
namespace {

// What an answer is kept under (its upper 48 bits) and the answer (its lower 16).
constexpr uint64_t key(size_t shared, int32_t threads) {
  return uint64_t{shared} << 32 | uint64_t{static_cast<uint16_t>(threads)} << 16;
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

cudaError_t KernelFit::grant_locked(Device& device, const void* kernel, size_t shared,
                                    bool carveout_max) {
  if (shared <= device.granted.load(std::memory_order_relaxed)) return cudaSuccess;
  cudaError_t status = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                            static_cast<int>(shared));
  if (status == cudaSuccess && carveout_max) {
    status = cudaFuncSetAttribute(kernel, cudaFuncAttributePreferredSharedMemoryCarveout,
                                  cudaSharedmemCarveoutMaxShared);
  }
  if (status == cudaSuccess) device.granted.store(shared, std::memory_order_release);
  return status;
}

cudaError_t KernelFit::grant(const void* kernel, size_t shared, bool carveout_max) {
  cudaError_t status = cudaSuccess;
  Device* device = current_device(&status);
  if (device == nullptr) return status;
  if (shared <= device->granted.load(std::memory_order_acquire)) return cudaSuccess;
  const std::lock_guard<std::mutex> lock(asking_);
  return grant_locked(*device, kernel, shared, carveout_max);
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
      if (a != 0 && (a & ~uint64_t{0xffff}) == key(shared, threads)) {
        *blocks = static_cast<int32_t>(a & 0xffff);
        return true;
      }
    }
    return false;
  };
  if (known()) return cudaSuccess;
  const std::lock_guard<std::mutex> lock(asking_);
  if (known()) return cudaSuccess;
  if (status = grant_locked(*device, kernel, shared, false); status != cudaSuccess) return status;
  const int device_index = static_cast<int>(device - devices_.data());
  int sms = 0, per_sm = 0;
  status = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device_index);
  if (status != cudaSuccess) return status;
  status = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, threads, shared);
  if (status != cudaSuccess) return status;
  if (per_sm < 1) return cudaErrorInvalidConfiguration;  // the block does not fit an SM
  *blocks = sms * per_sm;
  if (*blocks > 0xffff || threads > 0xffff) return cudaSuccess;  // no GPU yet: asked each time
  for (std::atomic<uint64_t>& answer : device->answers) {
    if (answer.load(std::memory_order_relaxed) == 0) {
      answer.store(key(shared, threads) | static_cast<uint16_t>(*blocks),
                   std::memory_order_release);
      break;
    }
  }
  return cudaSuccess;
}

}  // namespace ls::kernels
