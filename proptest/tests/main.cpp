// The CI entry point: fixed seeds unless the caller sets RC_PARAMS (e.g. a printed reproduce line).
#include "proptest/rc_support.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <string>

int main(int argc, char** argv) {
  // Each property then runs with this seed ^ a hash of its name (proptest/runner.cpp).
  setenv("RC_PARAMS", ("seed=" + std::to_string(ls::rc_support::kCiSeed)).c_str(), /*overwrite=*/0);
  setenv("LOCKSTEP_PROPTEST_DIR", "/tmp/lockstep-proptest", 0);
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
