// Asynchronous copies global → shared (sm_80+ cp.async) without holding the bytes in registers:
// the decode attention's value and key rows (kernels/attention.cu) and the decode GEMV's norm
// weight (kernels/gemv.cu). Device code only.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace ls::kernels {

// Copies 16 bytes (.cg: the bytes bypass L1, they are read once).
__device__ __forceinline__ void copy_async_16(void* shared, const void* global) {
  const uint32_t address = static_cast<uint32_t>(__cvta_generic_to_shared(shared));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(address), "l"(global));
}
__device__ __forceinline__ void copy_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
__device__ __forceinline__ void copy_async_wait_all() { asm volatile("cp.async.wait_all;\n" ::); }
// Waits for all but the newest committed group (a two-stage ring: the older stage has landed).
__device__ __forceinline__ void copy_async_wait_older() {
  asm volatile("cp.async.wait_group 1;\n" ::);
}

}  // namespace ls::kernels
