// Planted-bug companions of the hybrid properties (tests/hybrid_properties.h), one executable per
// planted library (tests/CMakeLists.txt), each selected by LOCKSTEP_PLANTED:
//   zeroing  lockstep_scheduler_on_zeroing_planted (tests/planted/skip_mamba_zeroing.cpp: a first
//            chunk never zeroes its working slot): the tokens property must fail;
//   padding  lockstep_scheduler_on_padding_planted (tests/planted/pad_mamba_slot_zero.cpp: padded
//            tokens carry slot 0): the slots property must fail at mamba-padding;
//   sharing  lockstep_scheduler_mamba_planted (tests/planted/share_mamba_slot.cpp: neighbouring
//            pool rows share a working slot): the slots property must fail on tiny-hybrid.
#include "tests/hybrid_properties.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdio>

namespace ls::hybrid_props {
namespace {

using ::testing::HasSubstr;

std::string caught(Property property) {
  const std::optional<std::string> failure = counterexample(property, 100);
  if (!failure) return "";
  std::printf("caught; the shrunk counterexample:\n  %s\n", failure->c_str());
  return *failure;
}

#if LOCKSTEP_PLANTED_ZEROING
TEST(HybridPlanted, TokensDifferAcrossChunkingsWhenFirstChunksKeepAStaleState) {
  EXPECT_THAT(caught(Property::kTokens), HasSubstr("gives ["));
}
#elif LOCKSTEP_PLANTED_PADDING
TEST(HybridPlanted, SlotsFailAtPaddingWhenPaddedTokensCarrySlotZero) {
  EXPECT_THAT(caught(Property::kSlots), HasSubstr("mamba-padding: padded token"));
}
#elif LOCKSTEP_PLANTED_SHARING
TEST(HybridPlanted, SlotsFailOnTinyHybridWhenRowsShareAWorkingSlot) {
  // The executor's validator refuses two rows of one op writing one slot; across steps the
  // slot-owner checker sees the hand-over.
  const std::string failure = caught(Property::kSlots);
  EXPECT_FALSE(failure.empty()) << "the property never failed against the planted bug";
  EXPECT_TRUE(failure.find("mamba-slot-owner") != std::string::npos ||
              failure.find("mamba_working") != std::string::npos)
      << failure;
}
#else
#error "LOCKSTEP_PLANTED must select zeroing, padding or sharing"
#endif

}  // namespace
}  // namespace ls::hybrid_props
