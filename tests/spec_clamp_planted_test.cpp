// Planted-bug companions of tests/spec_clamp_test.cpp: built against lockstep_core_clamp_planted,
// where the step commits the verify's unclamped accepted length on the device (vcl, the next
// round's inputs) and only the step result is clamped. Every property must find a counterexample.
#include "tests/spec_clamp_properties.h"

#include <gtest/gtest.h>

namespace ls::spec_props {
namespace {

constexpr uint64_t kSeedsCount = 150;

template <typename Property>
void fails_for_some_seed(Property property) {
  int32_t failed = 0;
  std::string first;
  for (uint64_t seed = 1; seed <= kSeedsCount; ++seed) {
    const std::string failure = property(generate_clamp_workload(seed));
    if (failure.empty()) continue;
    if (failed++ == 0) first = failure;
  }
  EXPECT_GT(failed, 0) << "the property never failed against the planted bug";
  if (failed > 0) std::printf("%d of %d workloads caught it; the first:\n  %s\n", failed,
                              static_cast<int>(kSeedsCount), first.c_str());
}

TEST(SpecClampPlanted, VclWithinContextFailsWhenTheStepSiteSkipsTheClamp) {
  fails_for_some_seed(vcl_within_context);
}

TEST(SpecClampPlanted, KvSlotsWithinOwnPagesFailsWhenTheStepSiteSkipsTheClamp) {
  fails_for_some_seed(kv_slots_within_own_pages);
}

TEST(SpecClampPlanted, AcceptedEqualsVclGrowthFailsWhenTheStepSiteSkipsTheClamp) {
  fails_for_some_seed(accepted_lengths_equal_vcl_growth);
}

}  // namespace
}  // namespace ls::spec_props
