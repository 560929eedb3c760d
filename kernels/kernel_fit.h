// How a kernel fits the GPU: the dynamic shared memory it is granted (over 48 KB a launch must
// have asked for it) and how many of its blocks the GPU holds at once (the decode attention and
// the folded-norm GEMV size their grids by it). The driver is asked once per kernel, device,
// shared-memory size and block size; a launch that finds its answer reads atomics and takes no
// lock (no mutex on a launch path, issue 14).
#pragma once

#include <cuda_runtime.h>

#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <mutex>

namespace ls::kernels {

constexpr int32_t kDevicesMax = 64;  // devices a process launches on (grants are per device)

// One kernel's grants and answers. An attribute belongs to the current device's context
// (tensor-parallel ranks on other GPUs set their own), and a grant is only ever raised: a smaller
// size asked later (another model's head_dim in the same process) must not take away what a
// launch already relies on. An answer is kept for a (shared memory, block size) pair.
class KernelFit {
 public:
  // Grants `shared` bytes of dynamic shared memory on the current device, then sets `*blocks` to
  // the blocks of `threads` threads the whole GPU holds at once (blocks an SM × SMs).
  // cudaErrorInvalidConfiguration when one block does not fit an SM.
  cudaError_t resident_on_gpu(const void* kernel, int32_t threads, size_t shared, int32_t* blocks);

  // Grants `shared` bytes on the current device, nothing more (a kernel whose grid does not
  // depend on occupancy). `carveout_max`: with the grant, the SM's unified memory split at its
  // most shared memory (so that several large blocks share an SM; the L1 keeps the rest).
  cudaError_t grant(const void* kernel, size_t shared, bool carveout_max = false);

 private:
  static constexpr size_t kSizesMax = 8;  // pairs remembered per device; more are asked each time
  struct Device {
    std::atomic<size_t> granted{0};
    // shared << 32 | threads << 16 | blocks (each below 2^16 on any GPU); 0: none yet
    std::array<std::atomic<uint64_t>, kSizesMax> answers{};
  };
  Device* current_device(cudaError_t* status);
  cudaError_t grant_locked(Device& device, const void* kernel, size_t shared, bool carveout_max);

  std::array<Device, kDevicesMax> devices_{};
  std::mutex asking_;  // held while the driver is asked: on a miss, never on a hit
};

// The KernelFit of `kKernel` (one per kernel instance).
template <auto kKernel>
KernelFit& kernel_fit() {
  static KernelFit fit;
  return fit;
}

template <auto kKernel>
cudaError_t resident_on_gpu(int32_t threads, size_t shared, int32_t* blocks) {
  return kernel_fit<kKernel>().resident_on_gpu(reinterpret_cast<const void*>(kKernel), threads,
                                               shared, blocks);
}

template <auto kKernel>
cudaError_t grant_shared(size_t shared, bool carveout_max = false) {
  return kernel_fit<kKernel>().grant(reinterpret_cast<const void*>(kKernel), shared,
                                     carveout_max);
}

}  // namespace ls::kernels
