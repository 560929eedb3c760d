// core/ops/portable_exp.h against e^x in fp64 over runs of consecutive fp32 inputs: the worst
// error in fp32 ulps and how often a larger input got a smaller result. Shared by the unit test
// (strided and windowed runs) and lockstep_portable_exp_sweep (every input in [−104, 89]).
#pragma once

#include "core/ops/portable_exp.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>

namespace ls::portable_exp_check {

struct Sweep {
  double worst_ulps = 0.0;  // |result − e^x| in ulps of e^x's fp32 binade
  float worst_at = 0.0f;
  int64_t not_monotone = 0;  // inputs whose result is below the previous input's
  int64_t checked = 0;
};

// The error of `got` against `want` (e^x in fp64: glibc's exp is within 2^-52 of it, a few 10⁻⁹
// of an fp32 ulp) in fp32 ulps at want's magnitude; subnormals share the smallest ulp.
inline double ulp_error(float got, double want) {
  if (want == 0.0) return got == 0.0f ? 0.0 : INFINITY;
  int exponent = 0;
  std::frexp(want, &exponent);  // want = m·2^exponent, m in [0.5, 1)
  const double ulp = std::ldexp(1.0, std::max(exponent - 24, -149));
  return std::fabs(static_cast<double>(got) - want) / ulp;
}

// fp32 values in order as integers: consecutive floats, consecutive ordinals (−0 and +0 both 0).
inline int64_t ordinal(float x) {
  const uint32_t bits = std::bit_cast<uint32_t>(x);
  const int64_t magnitude = bits & 0x7FFFFFFFu;
  return bits >> 31 ? -magnitude : magnitude;
}
inline float from_ordinal(int64_t i) {
  const uint32_t magnitude = static_cast<uint32_t>(i < 0 ? -i : i);
  return std::bit_cast<float>(i < 0 ? magnitude | 0x80000000u : magnitude);
}

// Every `stride`-th fp32 input from `lowest` to `highest` (stride 1: every one).
inline void run(Sweep& sweep, float lowest, float highest, int64_t stride = 1) {
  float previous_x = lowest, previous = ops::portable_exp(lowest);
  for (int64_t i = ordinal(lowest); i <= ordinal(highest); i += stride) {
    const float x = from_ordinal(i);
    const float y = ops::portable_exp(x);
    const double want = std::exp(static_cast<double>(x));
    if (want <= 3.4028234663852886e38) {  // fp32's largest; above it both are +inf or y is wrong
      const double error = ulp_error(y, want);
      if (error > sweep.worst_ulps) sweep.worst_ulps = error, sweep.worst_at = x;
    } else if (!std::isinf(y)) {
      sweep.worst_ulps = INFINITY, sweep.worst_at = x;
    }
    if (x > previous_x && y < previous) ++sweep.not_monotone;
    previous_x = x, previous = y;
    ++sweep.checked;
  }
}

}  // namespace ls::portable_exp_check
