// The context-clamp properties over generated speculative workloads (tests/spec_clamp_properties.h)
// hold on the production core; tests/spec_clamp_planted_test.cpp shows each one failing when the
// clamp is applied at only one of its two sites.
#include "proptest/rc_support.h"
#include "tests/spec_clamp_properties.h"

#include <gtest/gtest.h>

namespace ls::spec_props {
namespace {

constexpr int kCases = 150;

void holds(const std::string& id, const ClampProperty& property) {
  const std::optional<std::string> failure = counterexample(id, property, kCases);
  EXPECT_FALSE(failure.has_value()) << failure.value_or("");
}

TEST(SpecClampProperties, VclNeverExceedsTheContextLength) {
  holds("spec_clamp/vcl_within_context", vcl_within_context);
}

TEST(SpecClampProperties, NoKvSlotPastARequestsPagesIsWritten) {
  holds("spec_clamp/kv_slots_within_own_pages", kv_slots_within_own_pages);
}

TEST(SpecClampProperties, AcceptedLengthsEqualVclGrowth) {
  holds("spec_clamp/accepted_lengths_equal_vcl_growth", accepted_lengths_equal_vcl_growth);
}

// The generator's reach: prompts ending within W of L and wide verify rows, over the workloads of
// one fixed RapidCheck seed.
TEST(SpecClampProperties, WorkloadsReachTheContextLimitWithWideRows) {
  const rc::Gen<ClampWorkload> gen = gen_clamp_workload();
  int32_t near_limit = 0, wide = 0;
  for (uint64_t i = 0; i < kCases; ++i) {
    const ClampWorkload w = gen(rc::Random(rc_support::kCiSeed + i), rc_support::kGenSize).value();
    wide += w.verify_width >= 6 ? 1 : 0;
    for (int32_t length : w.prompt_lengths) near_limit += length + w.verify_width > w.context_length ? 1 : 0;
  }
  EXPECT_GT(near_limit, 50);
  EXPECT_GT(wide, 20);
}

}  // namespace
}  // namespace ls::spec_props
