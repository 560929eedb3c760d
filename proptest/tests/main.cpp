// The CI entry point: fixed seeds unless the caller sets RC_PARAMS (e.g. a printed reproduce line).
#include <gtest/gtest.h>

#include <cstdlib>

int main(int argc, char** argv) {
  setenv("RC_PARAMS", "seed=20240501", /*overwrite=*/0);
  setenv("LOCKSTEP_PROPTEST_DIR", "/tmp/lockstep-proptest", 0);
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
