// The tensor-core instruction lockstep's attention kernels share (the small-M GEMM runs on wgmma,
// kernels/wgmma.cuh): one mma.sync m16n8k16 with bf16 operands and fp32 accumulation. PTX ISA
// "Matrix Fragments for mma.m16n8k16": A is 16×16 row-major (four 32-bit registers of bf16 pairs),
// B 16×8 column-major (two), C/D 16×8 fp32 (four: rows lane/4 and lane/4 + 8, columns
// 2·(lane%4) + {0, 1}).
#pragma once

#include <cuda_bf16.h>

#include <cstdint>

namespace ls::kernels {

// D = A·B + D for one m16n8k16 tile.
__device__ __forceinline__ void mma_bf16_16816(float (&d)[4], const uint32_t (&a)[4], uint32_t b0,
                                               uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, "
      "{%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

}  // namespace ls::kernels
