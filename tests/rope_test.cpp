// RoPE on the CPU reference (core/model/rope.cpp), against the rotate-half formula evaluated here
// in double: the full rotation, and the partial rotary Bamba uses (transformers' BambaConfig
// partial_rotary_factor), where the first rotary_dim dims of a head rotate as a full RoPE of
// head_dim rotary_dim would and the dims after them pass through bit for bit.
#include "core/model/rope.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

namespace ls {
namespace {

constexpr float kTheta = 10000.0f;
// fp32 angles and fp32 rotation against a double evaluation of the same formula: a few ulp of the
// angle times the position, far below the gap a wrong pairing or frequency would make.
constexpr double kTolerance = 2e-4;

std::vector<float> random_head(int32_t head_dim, uint32_t seed) {
  std::mt19937 engine(seed);
  std::vector<float> head(static_cast<size_t>(head_dim));
  // Our own conversion of the engine's bits: std distributions differ between libraries.
  for (float& x : head) x = static_cast<float>(engine()) / 4294967296.0f * 4.0f - 2.0f;
  return head;
}

// transformers' rotation of the first `rotary_dim` dims, in double: dim j (< rotary_dim / 2)
// pairs with j + rotary_dim / 2 at angle position · theta^(−2j / rotary_dim).
std::vector<double> rotated_in_double(const std::vector<float>& head, int32_t rotary_dim,
                                      int32_t position) {
  std::vector<double> out(head.begin(), head.end());
  const int32_t half = rotary_dim / 2;
  for (int32_t j = 0; j < half; ++j) {
    const double angle = position * std::pow(double{kTheta}, -2.0 * j / rotary_dim);
    const double x1 = head[static_cast<size_t>(j)], x2 = head[static_cast<size_t>(j + half)];
    out[static_cast<size_t>(j)] = x1 * std::cos(angle) - x2 * std::sin(angle);
    out[static_cast<size_t>(j + half)] = x2 * std::cos(angle) + x1 * std::sin(angle);
  }
  return out;
}

double norm(const std::vector<float>& v) {
  double sum = 0.0;
  for (const float x : v) sum += double{x} * x;
  return std::sqrt(sum);
}

TEST(Rope, TheFullRotationIsTheRotateHalfFormula) {
  const int32_t head_dim = 16, positions = 300;
  const RopeTable table = build_rope_table(RopeConfig{.theta = kTheta}, head_dim, positions);
  for (const int32_t position : {0, 1, 7, 111, 299}) {
    std::vector<float> head = random_head(head_dim, 11u + position);
    const std::vector<double> want = rotated_in_double(head, head_dim, position);
    apply_rope(table, position, head.data());
    ASSERT_GT(norm(head), 0.5);
    for (int32_t i = 0; i < head_dim; ++i) {
      EXPECT_NEAR(head[i], want[i], kTolerance) << "position " << position << " dim " << i;
    }
  }
}

// head_dim 16 rotating 8 (Bamba's partial_rotary_factor 0.5): dims 8..15 unchanged bit for bit;
// dims 0..7 equal, bit for bit, to a head of head_dim 8 under a full RoPE of dim 8, and to the
// formula with frequencies over 8 (not over 16) and dim j paired with j + 4.
TEST(Rope, PartialRotaryRotatesTheFirstDimsAsAFullRopeOfThatDimAndPassesTheRest) {
  const int32_t head_dim = 16, rotary_dim = 8, positions = 300;
  const RopeTable partial = build_rope_table(RopeConfig{.theta = kTheta}, rotary_dim, positions);
  ASSERT_EQ(partial.half_dim, rotary_dim / 2);
  for (const int32_t position : {1, 7, 111, 299}) {
    const std::vector<float> before = random_head(head_dim, 23u + position);
    std::vector<float> head = before;
    apply_rope(partial, position, head.data());

    std::vector<float> small(before.begin(), before.begin() + rotary_dim);
    apply_rope(partial, position, small.data());  // a full RoPE of head_dim rotary_dim
    const std::vector<double> want = rotated_in_double(before, rotary_dim, position);
    bool moved = false;
    for (int32_t i = 0; i < rotary_dim; ++i) {
      EXPECT_EQ(head[i], small[static_cast<size_t>(i)]) << "position " << position << " dim " << i;
      EXPECT_NEAR(head[i], want[static_cast<size_t>(i)], kTolerance)
          << "position " << position << " dim " << i;
      moved = moved || head[i] != before[static_cast<size_t>(i)];
    }
    EXPECT_TRUE(moved) << "position " << position << ": the rotary dims did not rotate";
    for (int32_t i = rotary_dim; i < head_dim; ++i) {
      EXPECT_EQ(head[i], before[static_cast<size_t>(i)]) << "pass-through dim " << i << " changed";
    }
  }
}

// The frequencies of a partial rotary are over rotary_dim: inv_freq_j = theta^(−2j / rotary_dim),
// as transformers' default rope init computes with dim = int(head_dim · partial_rotary_factor) —
// not the head_dim frequencies truncated.
TEST(Rope, PartialRotaryFrequenciesAreOverTheRotaryDim) {
  const std::vector<float> partial = rope_inverse_frequencies(RopeConfig{.theta = kTheta}, 8);
  const std::vector<float> full = rope_inverse_frequencies(RopeConfig{.theta = kTheta}, 16);
  ASSERT_EQ(partial.size(), size_t{4});
  for (int32_t j = 0; j < 4; ++j) {
    const double want = std::pow(double{kTheta}, -2.0 * j / 8);
    EXPECT_NEAR(partial[static_cast<size_t>(j)], want, 1e-6 * want) << "j " << j;
    if (j > 0) {
      EXPECT_NE(partial[static_cast<size_t>(j)], full[static_cast<size_t>(j)]) << "j " << j;
    }
  }
}

}  // namespace
}  // namespace ls
