// Where the GPU tests that run lockstep's CLIs find them: LOCKSTEP_BIN_DIR (scripts/gpu-run.sh
// sets it to the package's bin/), else the build directory (LOCKSTEP_BUILD_DIR, the
// lockstep_gpu_tests target's).
#pragma once

#include <cstdlib>
#include <filesystem>

namespace ls::gpu_test {

inline std::filesystem::path cli_bin_dir() {
  const char* env = std::getenv("LOCKSTEP_BIN_DIR");
  return env ? std::filesystem::path(env) : std::filesystem::path(LOCKSTEP_BUILD_DIR);
}

}  // namespace ls::gpu_test
