// The context-clamp properties over generated speculative workloads (tests/spec_clamp_properties.h)
// hold on the production core; tests/spec_clamp_planted_test.cpp shows each one failing when the
// clamp is applied at only one of its two sites.
#include "tests/spec_clamp_properties.h"

#include <gtest/gtest.h>

namespace ls::spec_props {
namespace {

constexpr uint64_t kSeedsCount = 150;

template <typename Property>
void holds_for_every_seed(Property property) {
  for (uint64_t seed = 1; seed <= kSeedsCount; ++seed) {
    const std::string failure = property(generate_clamp_workload(seed));
    ASSERT_TRUE(failure.empty()) << failure;
  }
}

TEST(SpecClampProperties, VclNeverExceedsTheContextLength) { holds_for_every_seed(vcl_within_context); }

TEST(SpecClampProperties, NoKvSlotPastARequestsPagesIsWritten) {
  holds_for_every_seed(kv_slots_within_own_pages);
}

TEST(SpecClampProperties, AcceptedLengthsEqualVclGrowth) {
  holds_for_every_seed(accepted_lengths_equal_vcl_growth);
}

TEST(SpecClampProperties, WorkloadsReachTheContextLimitWithWideRows) {
  int32_t near_limit = 0, wide = 0;
  for (uint64_t seed = 1; seed <= kSeedsCount; ++seed) {
    const ClampWorkload w = generate_clamp_workload(seed);
    wide += w.verify_width >= 6 ? 1 : 0;
    for (int32_t length : w.prompt_lengths) near_limit += length + w.verify_width > w.context_length ? 1 : 0;
  }
  EXPECT_GT(near_limit, 50);
  EXPECT_GT(wide, 20);
}

}  // namespace
}  // namespace ls::spec_props
