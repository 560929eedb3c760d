// The memory ceilings a GPU benchmark counts its figures against, measured in the same run
// (GPU.md): a plain streaming read — the ceiling of a decode step, which only reads — and a
// device-to-device copy (a read and a write), each through its own kernel. Shared by every GPU
// benchmark so all count against the same kernels.
#pragma once

#include "kernels/cuda_check.h"
#include "kernels/weight_init.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <vector>

namespace ls::bench {

inline double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0.0 : v[v.size() / 2];
}

struct Bandwidth {
  double copy = 0;  // bytes/s, read + write counted
  double read = 0;  // bytes/s
};

// The bytes the ceilings are measured over: far past the L2, so they come from the DRAM.
constexpr int64_t kBandwidthBytes = int64_t{2} << 30;

// The median time of `repeats` launches on `stream` (CUDA events around each), after 3 untimed;
// launch(i) gets the launch's index, warm-ups included.
template <typename Launch>
double median_seconds(cudaStream_t stream, int32_t repeats, Launch launch) {
  cudaEvent_t start = nullptr, stop = nullptr;
  LS_CUDA(cudaEventCreate(&start));
  LS_CUDA(cudaEventCreate(&stop));
  std::vector<double> seconds;
  for (int32_t i = 0; i < repeats + 3; ++i) {
    LS_CUDA(cudaEventRecord(start, stream));
    launch(i);
    LS_CUDA(cudaEventRecord(stop, stream));
    LS_CUDA(cudaEventSynchronize(stop));
    float ms = 0;
    LS_CUDA(cudaEventElapsedTime(&ms, start, stop));
    if (i >= 3) seconds.push_back(ms * 1e-3);
  }
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  return median(seconds);
}

// Device-to-device copy and a plain streaming read of `bytes`, each through its own kernel.
inline Bandwidth measure_bandwidth(int64_t bytes, int32_t repeats) {
  void* a = nullptr;
  void* b = nullptr;
  LS_CUDA(cudaMalloc(&a, static_cast<size_t>(bytes)));
  LS_CUDA(cudaMalloc(&b, static_cast<size_t>(bytes)));
  LS_CUDA(cudaMemset(a, 1, static_cast<size_t>(bytes)));
  LS_CUDA(cudaMemset(b, 2, static_cast<size_t>(bytes)));
  Bandwidth out;
  out.copy = 2.0 * static_cast<double>(bytes) / median_seconds(nullptr, repeats, [&](int32_t i) {
               LS_CUDA(kernels::launch_copy_bytes(i % 2 ? a : b, i % 2 ? b : a, bytes, nullptr));
             });
  // The sink is never written (see launch_read_bytes); b is big enough for it anyway.
  out.read = static_cast<double>(bytes) / median_seconds(nullptr, repeats, [&](int32_t i) {
               LS_CUDA(kernels::launch_read_bytes(i % 2 ? a : b, bytes, i % 2 ? b : a, nullptr));
             });
  cudaFree(a);
  cudaFree(b);
  return out;
}

// What a kernel-alone benchmark counts against (lockstep_gpu_attention_bench,
// lockstep_gpu_mamba_bench): both ceilings measured over kBandwidthBytes, printed on one line.
inline Bandwidth measure_and_print_bandwidth(int32_t repeats) {
  const Bandwidth b = measure_bandwidth(kBandwidthBytes, repeats);
  std::printf("  streaming read %.2f TB/s (decode's ceiling); device-to-device copy %.2f TB/s "
              "(a read and a write); both measured in this run\n",
              b.read * 1e-12, b.copy * 1e-12);
  return b;
}

}  // namespace ls::bench
