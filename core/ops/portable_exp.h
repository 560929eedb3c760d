// e^x with the same bits on the host and on the device. The libm functions do not agree (CUDA's
// expf and glibc's differ in the last bit for some inputs), so what must match bit for bit — the
// sampling weights of core/sampling.cpp and kernels/sampling_ops.cu — calls this instead: IEEE
// fp64 products and sums (host_device.h's, never contracted), bit operations and one rounding to
// fp32, which both compilers carry out identically.
//
// x = k·ln 2 + r with k = round(x·log2 e) and |r| ≤ ~0.347 (ln 2 split in two so that k·ln2_hi is
// exact); e^r by its Taylor series to r¹¹/11! (the first term left out is below 7·10⁻¹⁵, far under
// fp32's half ulp of 3·10⁻⁸); times 2^k, exact in fp64; then one rounding to fp32. Checked against
// every fp32 input in [−104, 89] (tests/portable_exp_test.cpp and its exhaustive sweep): within
// half an ulp of e^x, and monotone — a larger logit never gets a smaller weight.
#pragma once

#include "core/ops/host_device.h"

#include <cstdint>

#if !defined(__CUDA_ARCH__)
#include <cstring>
#endif

namespace ls::ops {

namespace portable_exp_detail {

LS_HOST_DEVICE LS_INLINE double double_of_bits(uint64_t bits) {
#if defined(__CUDA_ARCH__)
  return __longlong_as_double(static_cast<long long>(bits));
#else
  double d;
  std::memcpy(&d, &bits, sizeof d);
  return d;
#endif
}

// Σ r^n / n! for n ≤ 11, by Horner's rule.
LS_HOST_DEVICE LS_INLINE double exp_series(double r) {
  double p = 1.0 / 39916800;
  p = add_rn(mul_rn(p, r), 1.0 / 3628800);
  p = add_rn(mul_rn(p, r), 1.0 / 362880);
  p = add_rn(mul_rn(p, r), 1.0 / 40320);
  p = add_rn(mul_rn(p, r), 1.0 / 5040);
  p = add_rn(mul_rn(p, r), 1.0 / 720);
  p = add_rn(mul_rn(p, r), 1.0 / 120);
  p = add_rn(mul_rn(p, r), 1.0 / 24);
  p = add_rn(mul_rn(p, r), 1.0 / 6);
  p = add_rn(mul_rn(p, r), 0.5);
  p = add_rn(mul_rn(p, r), 1.0);
  return add_rn(mul_rn(p, r), 1.0);
}

}  // namespace portable_exp_detail

LS_HOST_DEVICE LS_INLINE float portable_exp(float x) {
  // Below −104, e^x < 2^−150, half the smallest subnormal: 0. Above 89 it overflows. NaN stays.
  if (!(x > -104.0f)) return x == x ? 0.0f : x;
  if (x > 89.0f) return __builtin_huge_valf();
  constexpr double kLog2E = 1.4426950408889634;
  constexpr double kLn2Hi = 0x1.62e42fefa3000p-1;  // ln 2's first 41 bits: k·kLn2Hi is exact
  constexpr double kLn2Lo = 0x1.3de6af278ece6p-42;  // ln 2 − kLn2Hi
  constexpr double kRound = 6755399441055744.0;     // 1.5·2^52: adding it rounds to an integer
  const double xd = x;
  const double k = sub_rn(add_rn(mul_rn(xd, kLog2E), kRound), kRound);  // in [−150, 128]
  const double r = sub_rn(sub_rn(xd, mul_rn(k, kLn2Hi)), mul_rn(k, kLn2Lo));
  const uint64_t biased = static_cast<uint64_t>(static_cast<int64_t>(k) + 1023);  // 2^k's exponent
  return static_cast<float>(mul_rn(portable_exp_detail::exp_series(r),
                                   portable_exp_detail::double_of_bits(biased << 52)));
}

}  // namespace ls::ops
