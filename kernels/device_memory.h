// RAII owners of device memory, pinned host memory, streams, events, cuBLAS handles and CUDA
// graphs (STYLE.md §12): move-only, freed in the destructor. Host code only.
#pragma once

#include "kernels/cuda_check.h"

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <utility>
#include <vector>

namespace ls {

// Device bytes allocated, by kind, for the memory report.
struct MemoryLedger {
  int64_t weights = 0;
  int64_t kv = 0;
  int64_t workspace = 0;
};

template <typename T>
class DeviceArray {
 public:
  DeviceArray() = default;
  explicit DeviceArray(size_t count) : count_(count) {
    if (count > 0) LS_CUDA(cudaMalloc(reinterpret_cast<void**>(&ptr_), count * sizeof(T)));
  }
  DeviceArray(size_t count, int64_t& ledger) : DeviceArray(count) {
    ledger += static_cast<int64_t>(bytes());
  }
  ~DeviceArray() {
    if (ptr_ != nullptr) cudaFree(ptr_);
  }
  DeviceArray(DeviceArray&& other) noexcept
      : ptr_(std::exchange(other.ptr_, nullptr)), count_(std::exchange(other.count_, 0)) {}
  DeviceArray& operator=(DeviceArray&& other) noexcept {
    std::swap(ptr_, other.ptr_);
    std::swap(count_, other.count_);
    return *this;
  }
  DeviceArray(const DeviceArray&) = delete;
  DeviceArray& operator=(const DeviceArray&) = delete;

  T* get() const { return ptr_; }
  size_t count() const { return count_; }
  size_t bytes() const { return count_ * sizeof(T); }

 private:
  T* ptr_ = nullptr;
  size_t count_ = 0;
};

// A synchronous copy of a whole device array (tests and snapshots only).
template <typename T>
std::vector<T> download(const DeviceArray<T>& array) {
  std::vector<T> host(array.count());
  if (!host.empty()) {
    LS_CUDA(cudaMemcpy(host.data(), array.get(), array.bytes(), cudaMemcpyDeviceToHost));
  }
  return host;
}

template <typename T>
class PinnedArray {
 public:
  PinnedArray() = default;
  explicit PinnedArray(size_t count) : count_(count) {
    if (count > 0) LS_CUDA(cudaMallocHost(reinterpret_cast<void**>(&ptr_), count * sizeof(T)));
  }
  ~PinnedArray() {
    if (ptr_ != nullptr) cudaFreeHost(ptr_);
  }
  PinnedArray(PinnedArray&& other) noexcept
      : ptr_(std::exchange(other.ptr_, nullptr)), count_(std::exchange(other.count_, 0)) {}
  PinnedArray& operator=(PinnedArray&& other) noexcept {
    std::swap(ptr_, other.ptr_);
    std::swap(count_, other.count_);
    return *this;
  }
  PinnedArray(const PinnedArray&) = delete;
  PinnedArray& operator=(const PinnedArray&) = delete;

  T* get() const { return ptr_; }
  size_t count() const { return count_; }

 private:
  T* ptr_ = nullptr;
  size_t count_ = 0;
};

// A move-only owner of a handle with a destroy function.
template <typename H, cudaError_t (*Destroy)(H)>
class CudaHandle {
 public:
  CudaHandle() = default;
  explicit CudaHandle(H handle) : handle_(handle) {}
  ~CudaHandle() {
    if (handle_ != nullptr) Destroy(handle_);
  }
  CudaHandle(CudaHandle&& other) noexcept : handle_(std::exchange(other.handle_, nullptr)) {}
  CudaHandle& operator=(CudaHandle&& other) noexcept {
    std::swap(handle_, other.handle_);
    return *this;
  }
  CudaHandle(const CudaHandle&) = delete;
  CudaHandle& operator=(const CudaHandle&) = delete;
  H get() const { return handle_; }

 private:
  H handle_ = nullptr;
};

class CudaStream : public CudaHandle<cudaStream_t, cudaStreamDestroy> {
 public:
  using CudaHandle::CudaHandle;
  static CudaStream create() {
    cudaStream_t s = nullptr;
    LS_CUDA(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    return CudaStream(s);
  }
};

class CudaEvent : public CudaHandle<cudaEvent_t, cudaEventDestroy> {
 public:
  using CudaHandle::CudaHandle;
  static CudaEvent create(bool timing = false) {
    cudaEvent_t e = nullptr;
    LS_CUDA(cudaEventCreateWithFlags(&e, timing ? cudaEventDefault : cudaEventDisableTiming));
    return CudaEvent(e);
  }
};

class CudaGraph : public CudaHandle<cudaGraphExec_t, cudaGraphExecDestroy> {
 public:
  using CudaHandle::CudaHandle;
  // Captures what `enqueue` launches on `stream`, instantiates it and uploads it to the device on
  // `stream`: its first launch then does no upload of its own (for TP ranks sharing a GPU, a
  // launch that waited for the device while a peer's graph spun for this rank's would deadlock;
  // here, at capture, no collective is in flight — kernels/tp_collectives.cpp).
  template <typename F>
  static CudaGraph capture(cudaStream_t stream, F&& enqueue) {
    LS_CUDA(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
    try {
      enqueue();
    } catch (...) {
      cudaGraph_t broken = nullptr;
      cudaStreamEndCapture(stream, &broken);
      if (broken != nullptr) cudaGraphDestroy(broken);
      throw;
    }
    cudaGraph_t graph = nullptr;
    LS_CUDA(cudaStreamEndCapture(stream, &graph));
    cudaGraphExec_t exec = nullptr;
    const cudaError_t status = cudaGraphInstantiate(&exec, graph, 0);
    cudaGraphDestroy(graph);
    LS_CUDA(status);
    CudaGraph made(exec);
    LS_CUDA(cudaGraphUpload(exec, stream));
    return made;
  }
};

class CublasHandle {
 public:
  CublasHandle() = default;
  static CublasHandle create(cudaStream_t stream) {
    CublasHandle h;
    LS_CUBLAS(cublasCreate(&h.handle_));
    LS_CUBLAS(cublasSetStream(h.handle_, stream));
    LS_CUBLAS(cublasSetMathMode(h.handle_, CUBLAS_DEFAULT_MATH));
    LS_CUBLAS(cublasSetAtomicsMode(h.handle_, CUBLAS_ATOMICS_NOT_ALLOWED));
    return h;
  }
  ~CublasHandle() {
    if (handle_ != nullptr) cublasDestroy(handle_);
  }
  CublasHandle(CublasHandle&& other) noexcept : handle_(std::exchange(other.handle_, nullptr)) {}
  CublasHandle& operator=(CublasHandle&& other) noexcept {
    std::swap(handle_, other.handle_);
    return *this;
  }
  CublasHandle(const CublasHandle&) = delete;
  CublasHandle& operator=(const CublasHandle&) = delete;
  cublasHandle_t get() const { return handle_; }

 private:
  cublasHandle_t handle_ = nullptr;
};

}  // namespace ls
