// Planted-bug companions of tests/spec_clamp_test.cpp: built against lockstep_core_clamp_planted,
// where the step commits the verify's unclamped accepted length on the device (vcl, the next
// round's inputs) and only the step result is clamped (tests/planted/clamp_one_site.cpp). Every
// property must find a counterexample.
#include "tests/spec_clamp_properties.h"

#include <gtest/gtest.h>

#include <cstdio>

namespace ls::spec_props {
namespace {

constexpr int kCases = 150;

void fails(const std::string& id, const ClampProperty& property) {
  const std::optional<std::string> failure = counterexample(id, property, kCases);
  ASSERT_TRUE(failure.has_value()) << "the property never failed against the planted bug";
  std::printf("caught; the shrunk counterexample:\n  %s\n", failure->c_str());
}

TEST(SpecClampPlanted, VclWithinContextFailsWhenTheStepSiteSkipsTheClamp) {
  fails("spec_clamp/vcl_within_context", vcl_within_context);
}

TEST(SpecClampPlanted, KvSlotsWithinOwnPagesFailsWhenTheStepSiteSkipsTheClamp) {
  fails("spec_clamp/kv_slots_within_own_pages", kv_slots_within_own_pages);
}

TEST(SpecClampPlanted, AcceptedEqualsVclGrowthFailsWhenTheStepSiteSkipsTheClamp) {
  fails("spec_clamp/accepted_lengths_equal_vcl_growth", accepted_lengths_equal_vcl_growth);
}

}  // namespace
}  // namespace ls::spec_props
