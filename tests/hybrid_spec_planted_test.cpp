// Planted-bug companion of the hybrid speculative-decoding property (tests/hybrid_spec_properties.h),
// linked against lockstep_scheduler_on_verify_planted (tests/planted/late_verify_state.cpp: a
// verified row's working state and checkpoints one verify token late, after a rejected draft):
// the property must fail, and the hand-built row must show the wrong state.
#include "tests/hybrid_spec_properties.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdio>

namespace ls::hybrid_spec {
namespace {

using ::testing::HasSubstr;

TEST(HybridSpecPlanted, TokensOrLogitsDifferWhenTheStateIsOneVerifyTokenLate) {
  const std::optional<std::string> failure = counterexample(100);
  ASSERT_TRUE(failure.has_value()) << "the property never failed against the planted bug";
  std::printf("caught; the shrunk counterexample:\n  %s\n", failure->c_str());
  EXPECT_TRUE(failure->find("with the drafter gives [") != std::string::npos ||
              failure->find("logits digests") != std::string::npos)
      << *failure;
}

}  // namespace
}  // namespace ls::hybrid_spec
