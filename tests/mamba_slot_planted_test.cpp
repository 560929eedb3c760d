// Planted-bug companion of MambaSlotProperty (tests/hybrid_test.cpp): built against
// lockstep_scheduler_mamba_planted, where neighbouring pool rows share a working slot
// (tests/planted/share_mamba_slot.cpp). The property must find a counterexample.
#include "tests/mamba_slot_properties.h"

#include <gtest/gtest.h>

#include <cstdio>

namespace ls::mamba_props {
namespace {

TEST(MambaSlotPlanted, NoTwoLiveRequestsShareAWorkingSlotFailsWhenRowsShareSlots) {
  const std::optional<std::string> failure = counterexample(150);
  ASSERT_TRUE(failure.has_value()) << "the property never failed against the planted bug";
  std::printf("caught; the shrunk counterexample:\n  %s\n", failure->c_str());
}

}  // namespace
}  // namespace ls::mamba_props
