// The arithmetic both backends must compute identically is written once, in the headers of
// core/ops/, and compiled by the host compiler for the CPU reference and by nvcc for the kernels.
// C++17 (nvcc's dialect here), no std:: containers, nothing that allocates.
#pragma once

#if defined(__CUDACC__)
#define LS_HOST_DEVICE __host__ __device__
#define LS_INLINE __forceinline__
#else
#define LS_HOST_DEVICE
#define LS_INLINE inline
#endif

namespace ls::ops {

// IEEE round-to-nearest products and sums (fp32 and fp64) that the device compiler may not
// contract into a fused multiply-add (host code is built with -ffp-contract=off, the top
// CMakeLists.txt). Where the definition fixes the rounding of every operation, these spell it out.
#if defined(__CUDA_ARCH__)
LS_HOST_DEVICE LS_INLINE float mul_rn(float a, float b) { return __fmul_rn(a, b); }
LS_HOST_DEVICE LS_INLINE float add_rn(float a, float b) { return __fadd_rn(a, b); }
LS_HOST_DEVICE LS_INLINE float sub_rn(float a, float b) { return __fsub_rn(a, b); }
LS_HOST_DEVICE LS_INLINE double mul_rn(double a, double b) { return __dmul_rn(a, b); }
LS_HOST_DEVICE LS_INLINE double add_rn(double a, double b) { return __dadd_rn(a, b); }
LS_HOST_DEVICE LS_INLINE double sub_rn(double a, double b) { return __dsub_rn(a, b); }
#else
LS_HOST_DEVICE LS_INLINE float mul_rn(float a, float b) { return a * b; }
LS_HOST_DEVICE LS_INLINE float add_rn(float a, float b) { return a + b; }
LS_HOST_DEVICE LS_INLINE float sub_rn(float a, float b) { return a - b; }
LS_HOST_DEVICE LS_INLINE double mul_rn(double a, double b) { return a * b; }
LS_HOST_DEVICE LS_INLINE double add_rn(double a, double b) { return a + b; }
LS_HOST_DEVICE LS_INLINE double sub_rn(double a, double b) { return a - b; }
#endif

}  // namespace ls::ops
