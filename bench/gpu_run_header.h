// What every whole-model GPU benchmark's log and JSON begin with (lockstep_gpu_bench,
// lockstep_gpu_spec_bench): when, on which machine, from which commit, by which command — so a
// figure in bench/results can always be traced to its GPU, driver and build.
#pragma once

#include "kernels/cuda_backend.h"

#include "lockstep_commit.h"  // generated at build time: LOCKSTEP_GIT_COMMIT

#include <nlohmann/json.hpp>

#include <cstdio>
#include <ctime>
#include <string>

namespace ls::bench {

inline std::string utc_now() {
  const std::time_t now = std::time(nullptr);
  char text[32];
  std::strftime(text, sizeof(text), "%Y-%m-%dT%H:%M:%SZ", std::gmtime(&now));
  return text;
}

// "NVIDIA H200, 132 SMs, driver …, CUDA runtime …, cuBLAS …, commit …" on stdout.
inline void print_machine(const CudaMachineInfo& m) {
  std::printf("%s, %s SMs, driver %s, CUDA runtime %s, cuBLAS %s, commit %s\n", m.gpu_name.c_str(),
              m.sm_count.c_str(), m.driver_version.c_str(), m.runtime_version.c_str(),
              m.cublas_version.c_str(), LOCKSTEP_GIT_COMMIT);
}

// The JSON's first keys: date, GPU, SM count, driver, CUDA runtime, cuBLAS, commit, command.
inline nlohmann::json run_json(const CudaMachineInfo& m, const std::string& command) {
  return {{"date", utc_now()},
          {"gpu", m.gpu_name},
          {"sm_count", m.sm_count},
          {"driver", m.driver_version},
          {"cuda_runtime", m.runtime_version},
          {"cublas", m.cublas_version},
          {"commit", LOCKSTEP_GIT_COMMIT},
          {"command", command}};
}

}  // namespace ls::bench
