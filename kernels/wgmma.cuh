// Hopper's warpgroup MMA (wgmma.mma_async, sm_90a), as the small-M GEMM uses it: D (64 × N fp32)
// += A (64 × 16 bf16) · B (16 × N bf16), A and B read from shared memory through matrix
// descriptors, both K-major (each of A's rows and each of B's N columns has its 16 k contiguous).
//
// Layouts relied on (PTX ISA, "Asynchronous Warpgroup Level Matrix Multiply-Accumulate"):
//   - the matrix descriptor (64 bits): start address >> 4 in bits 0-13, leading byte offset >> 4
//     in 16-29 (unused by a K-major operand with a 128-byte swizzle whose k fits the swizzle's
//     128 bytes: 1), stride byte offset >> 4 in 32-45 (1024: 8 rows of 128 bytes, the swizzle's
//     atom), base offset 0 in 49-51 (atoms 1024-aligned), swizzle mode in 62-63 (1: 128 bytes);
//   - the 128-byte swizzle: 16-byte piece q of row r lies at r·128 + ((q ^ (r % 8)) · 16) from a
//     1024-aligned base, which is the layout kernels/gemm_small_m.cu's stages already use; the
//     k16 step s of a 64-wide row starts 32·s bytes into the row (the swizzle is applied to the
//     address the step's start produces, so the start moves by 32 bytes and the XOR does the rest);
//   - D's fragments: warp w of the warpgroup holds rows 16w .. 16w + 15 and, for each n8 block j,
//     d[j][0], d[j][1] at (row 16w + lane/4, column 8j + 2·(lane%4) + {0, 1}) and d[j][2], d[j][3]
//     eight rows lower: for each n8 block the C fragment of mma.sync m16n8k16 (kernels/mma.cuh).
// An output element depends only on its A row, its B column and its D input, so a column's sums
// do not depend on the other columns.
//
// wgmma runs asynchronously: fence() before the first MMA that reads accumulators other code
// wrote, commit() closes a group, wait<n>() returns once at most n groups are pending, and
// hold(d) after the wait keeps the compiler from reading d before it.
#pragma once

#include <cstdint>

namespace ls::kernels::wgmma {

__device__ __forceinline__ uint64_t descriptor_sw128(uint32_t shared_address) {
  return uint64_t{(shared_address & 0x3FFFFu) >> 4} | (uint64_t{1} << 16) |
         (uint64_t{1024 >> 4} << 32) | (uint64_t{1} << 62);
}

__device__ __forceinline__ void fence() {
  asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
}
__device__ __forceinline__ void commit() {
  asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
}
template <int32_t kPending>
__device__ __forceinline__ void wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(kPending) : "memory");
}

template <int32_t NT>
__device__ __forceinline__ void hold(float (&d)[NT][4]) {
#pragma unroll
  for (int32_t j = 0; j < NT; ++j) {
#pragma unroll
    for (int32_t e = 0; e < 4; ++e) asm volatile("" : "+f"(d[j][e])::"memory");
  }
}

// Shared memory written by the generic proxy (st.shared, cp.async) made visible to wgmma's reads.
__device__ __forceinline__ void fence_shared_for_async() {
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}

// One function for each N: an asm statement names every accumulator register as an operand of
// its own, so the eight shapes cannot share one body (mma_k16 below picks one).
__device__ __forceinline__ void mma_m64n8k16(float (&d)[1][4], uint64_t a, uint64_t b) {
  asm volatile(
      "{\n.reg .pred accumulate;\nsetp.ne.b32 accumulate, %6, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n8k16.f32.bf16.bf16 "
      "{%0, %1, %2, %3}, %4, %5, accumulate, 1, 1, 0, 0;\n}\n"
      : "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3])
      : "l"(a), "l"(b), "r"(1)
      : "memory");
}
__device__ __forceinline__ void mma_m64n16k16(float (&d)[2][4], uint64_t a, uint64_t b) {
  asm volatile(
      "{\n.reg .pred accumulate;\nsetp.ne.b32 accumulate, %10, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n16k16.f32.bf16.bf16 "
      "{%0, %1, %2, %3, %4, %5, %6, %7}, %8, %9, accumulate, 1, 1, 0, 0;\n}\n"
      : "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]), "+f"(d[1][0]), "+f"(d[1][1]),
        "+f"(d[1][2]), "+f"(d[1][3])
      : "l"(a), "l"(b), "r"(1)
      : "memory");
}
__device__ __forceinline__ void mma_m64n24k16(float (&d)[3][4], uint64_t a, uint64_t b) {
  asm volatile(
      "{\n.reg .pred accumulate;\nsetp.ne.b32 accumulate, %14, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n24k16.f32.bf16.bf16 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11}, %12, %13, accumulate, 1, 1, 0, 0;\n}\n"
      : "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]), "+f"(d[1][0]), "+f"(d[1][1]),
        "+f"(d[1][2]), "+f"(d[1][3]), "+f"(d[2][0]), "+f"(d[2][1]), "+f"(d[2][2]), "+f"(d[2][3])
      : "l"(a), "l"(b), "r"(1)
      : "memory");
}
__device__ __forceinline__ void mma_m64n32k16(float (&d)[4][4], uint64_t a, uint64_t b) {
  asm volatile(
      "{\n.reg .pred accumulate;\nsetp.ne.b32 accumulate, %18, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, "
      "%12, %13, %14, %15}, %16, %17, accumulate, 1, 1, 0, 0;\n}\n"
      : "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]), "+f"(d[1][0]), "+f"(d[1][1]),
        "+f"(d[1][2]), "+f"(d[1][3]), "+f"(d[2][0]), "+f"(d[2][1]), "+f"(d[2][2]), "+f"(d[2][3]),
        "+f"(d[3][0]), "+f"(d[3][1]), "+f"(d[3][2]), "+f"(d[3][3])
      : "l"(a), "l"(b), "r"(1)
      : "memory");
}
__device__ __forceinline__ void mma_m64n40k16(float (&d)[5][4], uint64_t a, uint64_t b) {
  asm volatile(
      "{\n.reg .pred accumulate;\nsetp.ne.b32 accumulate, %22, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n40k16.f32.bf16.bf16 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, "
      "%12, %13, %14, %15, %16, %17, %18, %19}, %20, %21, accumulate, 1, 1, 0, 0;\n}\n"
      : "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]), "+f"(d[1][0]), "+f"(d[1][1]),
        "+f"(d[1][2]), "+f"(d[1][3]), "+f"(d[2][0]), "+f"(d[2][1]), "+f"(d[2][2]), "+f"(d[2][3]),
        "+f"(d[3][0]), "+f"(d[3][1]), "+f"(d[3][2]), "+f"(d[3][3]), "+f"(d[4][0]), "+f"(d[4][1]),
        "+f"(d[4][2]), "+f"(d[4][3])
      : "l"(a), "l"(b), "r"(1)
      : "memory");
}
__device__ __forceinline__ void mma_m64n48k16(float (&d)[6][4], uint64_t a, uint64_t b) {
  asm volatile(
      "{\n.reg .pred accumulate;\nsetp.ne.b32 accumulate, %26, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n48k16.f32.bf16.bf16 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, "
      "%12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23}, "
      "%24, %25, accumulate, 1, 1, 0, 0;\n}\n"
      : "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]), "+f"(d[1][0]), "+f"(d[1][1]),
        "+f"(d[1][2]), "+f"(d[1][3]), "+f"(d[2][0]), "+f"(d[2][1]), "+f"(d[2][2]), "+f"(d[2][3]),
        "+f"(d[3][0]), "+f"(d[3][1]), "+f"(d[3][2]), "+f"(d[3][3]), "+f"(d[4][0]), "+f"(d[4][1]),
        "+f"(d[4][2]), "+f"(d[4][3]), "+f"(d[5][0]), "+f"(d[5][1]), "+f"(d[5][2]), "+f"(d[5][3])
      : "l"(a), "l"(b), "r"(1)
      : "memory");
}
__device__ __forceinline__ void mma_m64n56k16(float (&d)[7][4], uint64_t a, uint64_t b) {
  asm volatile(
      "{\n.reg .pred accumulate;\nsetp.ne.b32 accumulate, %30, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n56k16.f32.bf16.bf16 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, "
      "%12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, "
      "%24, %25, %26, %27}, %28, %29, accumulate, 1, 1, 0, 0;\n}\n"
      : "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]), "+f"(d[1][0]), "+f"(d[1][1]),
        "+f"(d[1][2]), "+f"(d[1][3]), "+f"(d[2][0]), "+f"(d[2][1]), "+f"(d[2][2]), "+f"(d[2][3]),
        "+f"(d[3][0]), "+f"(d[3][1]), "+f"(d[3][2]), "+f"(d[3][3]), "+f"(d[4][0]), "+f"(d[4][1]),
        "+f"(d[4][2]), "+f"(d[4][3]), "+f"(d[5][0]), "+f"(d[5][1]), "+f"(d[5][2]), "+f"(d[5][3]),
        "+f"(d[6][0]), "+f"(d[6][1]), "+f"(d[6][2]), "+f"(d[6][3])
      : "l"(a), "l"(b), "r"(1)
      : "memory");
}
__device__ __forceinline__ void mma_m64n64k16(float (&d)[8][4], uint64_t a, uint64_t b) {
  asm volatile(
      "{\n.reg .pred accumulate;\nsetp.ne.b32 accumulate, %34, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, "
      "%12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, "
      "%24, %25, %26, %27, %28, %29, %30, %31}, %32, %33, accumulate, 1, 1, 0, 0;\n}\n"
      : "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]), "+f"(d[1][0]), "+f"(d[1][1]),
        "+f"(d[1][2]), "+f"(d[1][3]), "+f"(d[2][0]), "+f"(d[2][1]), "+f"(d[2][2]), "+f"(d[2][3]),
        "+f"(d[3][0]), "+f"(d[3][1]), "+f"(d[3][2]), "+f"(d[3][3]), "+f"(d[4][0]), "+f"(d[4][1]),
        "+f"(d[4][2]), "+f"(d[4][3]), "+f"(d[5][0]), "+f"(d[5][1]), "+f"(d[5][2]), "+f"(d[5][3]),
        "+f"(d[6][0]), "+f"(d[6][1]), "+f"(d[6][2]), "+f"(d[6][3]), "+f"(d[7][0]), "+f"(d[7][1]),
        "+f"(d[7][2]), "+f"(d[7][3])
      : "l"(a), "l"(b), "r"(1)
      : "memory");
}

// D (64 × 8·NT) += A · B.
template <int32_t NT>
__device__ __forceinline__ void mma_k16(float (&d)[NT][4], uint64_t a, uint64_t b) {
  static_assert(NT >= 1 && NT <= 8, "8 to 64 columns");
  if constexpr (NT == 1) mma_m64n8k16(d, a, b);
  if constexpr (NT == 2) mma_m64n16k16(d, a, b);
  if constexpr (NT == 3) mma_m64n24k16(d, a, b);
  if constexpr (NT == 4) mma_m64n32k16(d, a, b);
  if constexpr (NT == 5) mma_m64n40k16(d, a, b);
  if constexpr (NT == 6) mma_m64n48k16(d, a, b);
  if constexpr (NT == 7) mma_m64n56k16(d, a, b);
  if constexpr (NT == 8) mma_m64n64k16(d, a, b);
}

}  // namespace ls::kernels::wgmma
