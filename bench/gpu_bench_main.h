// The start every kernel-alone GPU benchmark shares (lockstep_gpu_attention_bench,
// lockstep_gpu_mamba_bench): a CUDA check that exits, `--iterations N`, the header line that
// names the subject and the device, and how a case's launches are timed.
#pragma once

#include <CLI/CLI.hpp>
#include <cuda_runtime.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <functional>

// A failed CUDA call in a benchmark: the call site and CUDA's message, then exit 1.
#define CHECK(call)                                                                        \
  do {                                                                                     \
    const cudaError_t status_ = (call);                                                    \
    if (status_ != cudaSuccess) {                                                          \
      std::fprintf(stderr, "%s:%d: %s\n", __FILE__, __LINE__, cudaGetErrorString(status_)); \
      std::exit(1);                                                                        \
    }                                                                                      \
  } while (0)

namespace ls::bench {

// Seconds per launch of `launch`: three untimed, then `iterations` back to back between two CUDA
// events (the launches' own overlap included, as a step runs them).
inline double time_launches(const std::function<void()>& launch, int32_t iterations) {
  for (int32_t i = 0; i < 3; ++i) launch();
  cudaEvent_t begin = nullptr, end = nullptr;
  CHECK(cudaEventCreate(&begin));
  CHECK(cudaEventCreate(&end));
  CHECK(cudaEventRecord(begin));
  for (int32_t i = 0; i < iterations; ++i) launch();
  CHECK(cudaEventRecord(end));
  CHECK(cudaEventSynchronize(end));
  CHECK(cudaGetLastError());
  float ms = 0;
  CHECK(cudaEventElapsedTime(&ms, begin, end));
  cudaEventDestroy(begin);
  cudaEventDestroy(end);
  return ms * 1e-3 / iterations;
}

struct KernelBench {
  const char* name;          // the binary, for --help
  const char* description;   // what it measures, for --help
  const char* subject;       // the header line's start, before the device
  int32_t iterations = 20;   // timed launches per case unless --iterations says otherwise
};

// Parses the command line (exit 0 for --help, 2 for a bad flag), prints "<subject>, <GPU>, <N>
// SMs", then runs `cases` with the iterations per case (1 when one throws); main's exit status.
inline int run_kernel_bench(int argc, char** argv, const KernelBench& bench,
                            const std::function<void(int32_t iterations)>& cases) {
  int32_t iterations = bench.iterations;
  CLI::App app{bench.description, bench.name};
  app.add_option("--iterations", iterations, "Timed launches per case")
      ->check(CLI::Range(1, 1000000))
      ->capture_default_str();
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : 2;
  }
  cudaDeviceProp prop{};
  CHECK(cudaGetDeviceProperties(&prop, 0));
  std::printf("%s, %s, %d SMs\n", bench.subject, prop.name, prop.multiProcessorCount);
  try {
    cases(iterations);
  } catch (const std::exception& e) {  // a failed CUDA call the shared helpers check (LS_CUDA)
    std::fprintf(stderr, "%s: %s\n", bench.name, e.what());
    return 1;
  }
  return 0;
}

}  // namespace ls::bench
