// core/ops/portable_exp.h: the exp that the sampling definition and the device sampler share.
// Its agreement with the device is tests/gpu/sampling_gpu_test.cpp's (every weight's bits); here,
// what it computes: special values, half-ulp accuracy and monotonicity where they are hardest.
#include "core/ops/portable_exp.h"
#include "tests/portable_exp_check.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>

namespace ls {
namespace {

using ops::portable_exp;
using portable_exp_check::Sweep;

constexpr float kInf = std::numeric_limits<float>::infinity();

TEST(PortableExp, SpecialValues) {
  EXPECT_EQ(portable_exp(0.0f), 1.0f);  // the sampling maximum's weight is exactly 1
  EXPECT_EQ(portable_exp(-0.0f), 1.0f);
  EXPECT_EQ(portable_exp(-kInf), 0.0f);
  EXPECT_EQ(portable_exp(kInf), kInf);
  EXPECT_TRUE(std::isnan(portable_exp(std::numeric_limits<float>::quiet_NaN())));
  EXPECT_EQ(portable_exp(-104.0f), 0.0f);  // below half the smallest subnormal
  EXPECT_EQ(portable_exp(-103.5f), std::numeric_limits<float>::denorm_min());
  EXPECT_EQ(portable_exp(89.0f), kInf);
  EXPECT_EQ(portable_exp(88.7f), static_cast<float>(std::exp(double{88.7f})));  // below overflow
  EXPECT_EQ(portable_exp(1.0f), static_cast<float>(std::exp(1.0)));
}

// Every 251st fp32 input of [−104, 89] (about 8.5 million): within half an ulp (and a hair: the
// result is rounded once from an fp64 value within ~10⁻¹⁴ of e^x, so a true value that close to a
// rounding boundary may go the other way).
TEST(PortableExp, WithinHalfAnUlpAcrossTheRange) {
  Sweep sweep;
  portable_exp_check::run(sweep, -104.0f, 89.0f, 251);
  EXPECT_GT(sweep.checked, 8'000'000);
  EXPECT_LE(sweep.worst_ulps, 0.501) << "at x = " << sweep.worst_at;
  EXPECT_EQ(sweep.not_monotone, 0);
}

// Every input around the places where a reduction-based exp goes wrong: where k (the power of 2)
// changes, where the input's own binade changes (its spacing doubles), and where the result's
// binade changes. A larger logit must never get a smaller weight.
TEST(PortableExp, MonotoneAndAccurateWhereTheReductionChanges) {
  constexpr int64_t kAround = 1 << 14;  // fp32 values on each side
  const auto around = [&](Sweep& sweep, float at) {
    const int64_t i = portable_exp_check::ordinal(at);
    portable_exp_check::run(sweep, portable_exp_check::from_ordinal(i - kAround),
                            portable_exp_check::from_ordinal(i + kAround));
  };
  Sweep sweep;
  for (int k = -150; k <= 127; ++k) {
    around(sweep, static_cast<float>((k + 0.5) * std::log(2.0)));  // k's rounding flips
    around(sweep, static_cast<float>(k * std::log(2.0)));           // the result's binade
  }
  for (int e = -40; e <= 6; ++e) {
    around(sweep, std::ldexp(1.0f, e));
    around(sweep, -std::ldexp(1.0f, e));
  }
  EXPECT_GT(sweep.checked, 18'000'000);
  EXPECT_LE(sweep.worst_ulps, 0.501) << "at x = " << sweep.worst_at;
  EXPECT_EQ(sweep.not_monotone, 0);
}

}  // namespace
}  // namespace ls
