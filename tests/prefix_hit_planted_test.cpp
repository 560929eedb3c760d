// Planted-bug companion of PrefixHitProperty (tests/hybrid_test.cpp): built against
// lockstep_scheduler_checkpoint_planted, where each recurrent-state checkpoint is booked one page
// late (tests/planted/late_checkpoint.cpp), so a hit resumes from a state a page short. The
// property must find a counterexample.
#include "tests/prefix_hit_properties.h"

#include <gtest/gtest.h>

#include <cstdio>

namespace ls::prefix_props {
namespace {

TEST(PrefixHitPlanted, TokensSameWithAndWithoutHitsFailsWhenCheckpointsAreLate) {
  const std::optional<std::string> failure = counterexample(60);
  ASSERT_TRUE(failure.has_value()) << "the property never failed against the planted bug";
  std::printf("caught; the shrunk counterexample:\n  %s\n", failure->c_str());
}

}  // namespace
}  // namespace ls::prefix_props
