// core/ops/order_sums.h against the definition written the plain way: every prefix in one pass,
// the first one reaching x found by a scan. Random non-increasing weights (ties, zeros, wide and
// narrow spreads) over up to ten blocks, x at, beside, between and beyond the prefixes, a skipped
// position or none. The host's block-by-block search (order_prefix_reaching, the CPU definition's)
// and the device's binary search over the precomputed P_c (order_prefix_searched, what
// kernels/sampling_ops.cu runs) must both give the plain answer: its index and its bits.
#include "core/ops/order_sums.h"
#include "proptest/rc_support.h"

#include <fmt/format.h>
#include <gtest/gtest.h>
#include <rapidcheck.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <limits>
#include <string>
#include <vector>

namespace ls {
namespace {

// Every prefix of the definition, plainly: a block's running part from 0, added to the sum of
// the blocks before it; the skipped position weighs 0.
std::vector<float> plain_prefixes(const std::vector<float>& w, int32_t skip) {
  std::vector<float> prefixes;
  float blocks_before = 0.0f, part = 0.0f;
  for (size_t j = 0; j < w.size(); ++j) {
    if (j % ops::kOrderSumBlock == 0 && j > 0) blocks_before += part, part = 0.0f;
    part += static_cast<int32_t>(j) == skip ? 0.0f : w[j];
    prefixes.push_back(blocks_before + part);
  }
  return prefixes;
}

struct Case {
  std::vector<float> weights;  // non-increasing
  float x = 0.0f;
  bool strictly = false;
  int32_t skip = ops::kNoSkip;
};

std::string describe(const Case& c) {
  return fmt::format("n {}, x {} ({:#x}), strictly {}, skip {}", c.weights.size(), c.x,
                     std::bit_cast<uint32_t>(c.x), c.strictly, c.skip);
}

std::string check(const Case& c) {
  const int32_t n = static_cast<int32_t>(c.weights.size());
  const std::vector<float> prefixes = plain_prefixes(c.weights, c.skip);
  int32_t want = 0;
  while (want < n && !(c.strictly ? prefixes[want] > c.x : prefixes[want] >= c.x)) ++want;
  const float want_value = prefixes[std::min(want, n - 1)];
  const auto w = [&c](int32_t j) { return c.weights[static_cast<size_t>(j)]; };
  const auto block = [&w](int32_t b) {
    const int32_t first = b * ops::kOrderSumBlock;
    return ops::order_part(w, first, first + ops::kOrderSumBlock - 1, ops::kNoSkip);
  };
  const auto same = [&](const ops::OrderPrefix& got, const char* which) -> std::string {
    const bool same_bits =
        std::bit_cast<uint32_t>(got.value) == std::bit_cast<uint32_t>(want_value);
    if (got.index == want && same_bits) return "";
    return fmt::format("{}: {} gives index {} value {}, the plain definition index {} value {}",
                       describe(c), which, got.index, got.value, want, want_value);
  };
  std::string failure =
      same(ops::order_prefix_reaching(w, block, n, c.x, c.strictly, c.skip), "the block walk");
  if (!failure.empty() || c.skip != ops::kNoSkip) return failure;
  // P_c chained from the B_c left to right, as sampling_block_sums_kernel computes them.
  std::vector<float> blocks_before{0.0f};
  for (int32_t b = 0; b < ops::order_sum_blocks(n); ++b) {
    blocks_before.push_back(blocks_before.back() + block(b));
  }
  const auto prefix = [&](int32_t b) { return blocks_before[static_cast<size_t>(b)]; };
  return same(ops::order_prefix_searched(w, prefix, n, c.x, c.strictly), "the binary search");
}

rc::Gen<Case> gen_case() {
  return rc::gen::exec([] {
    Case c;
    const int32_t n = *rc::gen::inRange(1, 10 * ops::kOrderSumBlock + 7);
    // Weights from 1 down: each step keeps the weight (a tie), shrinks it by a random factor, or
    // (rarely) drops to 0 for the rest; the spread decides how fast they fall.
    const float spread = *rc::gen::element(0.999f, 0.99f, 0.9f, 0.5f);
    float weight = 1.0f;
    for (int32_t j = 0; j < n; ++j) {
      c.weights.push_back(weight);
      const int32_t step = *rc::gen::inRange(0, 100);
      if (step < 20) continue;  // a tie
      if (step == 99) weight = 0.0f;
      const float fraction = static_cast<float>(*rc::gen::inRange(0, 1000)) / 1000.0f;
      weight *= spread + (1.0f - spread) * fraction;
    }
    c.strictly = *rc::gen::arbitrary<bool>();
    if (*rc::gen::inRange(0, 3) == 0) c.skip = *rc::gen::inRange(0, n);
    const std::vector<float> prefixes = plain_prefixes(c.weights, c.skip);
    const float at = prefixes[static_cast<size_t>(*rc::gen::inRange(0, n))];
    switch (*rc::gen::inRange(0, 6)) {
      case 0: c.x = at; break;  // a prefix exactly: >= and > differ
      case 1: c.x = std::nextafter(at, 0.0f); break;
      case 2: c.x = std::nextafter(at, std::numeric_limits<float>::infinity()); break;
      case 3:  // a fraction of the whole sum, as top-p and the CDF walk ask
        c.x = prefixes.back() * static_cast<float>(*rc::gen::inRange(0, 1001)) / 1000.0f;
        break;
      case 4: c.x = 0.0f; break;
      default: c.x = std::numeric_limits<float>::infinity(); break;  // the whole sum
    }
    return c;
  });
}

TEST(OrderSums, BlockWalkAndBinarySearchMatchThePlainDefinition) {
  const rc::Gen<Case> gen = gen_case();
  const auto failure = rc_support::run_property("order sums", 400, [&] { return check(*gen); });
  EXPECT_FALSE(failure.has_value()) << *failure;
}

TEST(OrderSums, MinPCountIsTheLinearCount) {
  const std::vector<float> w = {1.0f, 0.5f, 0.5f, 0.25f, 0.25f, 0.0f, 0.0f};
  const auto at = [&w](int32_t j) { return w[static_cast<size_t>(j)]; };
  for (int32_t n = 1; n <= static_cast<int32_t>(w.size()); ++n) {
    for (const float threshold : {0.0f, 0.1f, 0.25f, 0.3f, 0.5f, 0.75f, 1.0f, 2.0f}) {
      int32_t linear = 1;
      while (linear < n && w[static_cast<size_t>(linear)] >= threshold) ++linear;
      EXPECT_EQ(ops::order_count_at_least(at, n, threshold), linear)
          << "n " << n << " threshold " << threshold;
    }
  }
}

}  // namespace
}  // namespace ls
