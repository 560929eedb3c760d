// proptest-long: runs every property with fresh seeds until the time budget is spent, then reports
// the cases run and the failures found per property. Each failure prints its trace and reproduce
// line as the CI test would.
//
//   lockstep_proptest_long --minutes 20 [--property NAME]
#include "proptest/runner.h"

#include <fmt/format.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <map>
#include <random>
#include <string>

int main(int argc, char** argv) {
  double minutes = 1.0;
  std::string only;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--minutes") == 0 && i + 1 < argc) {
      minutes = std::atof(argv[++i]);
    } else if (std::strcmp(argv[i], "--property") == 0 && i + 1 < argc) {
      only = argv[++i];
    } else {
      fmt::print(stderr, "usage: {} --minutes N [--property NAME]\n", argv[0]);
      return 2;
    }
  }
  using Clock = std::chrono::steady_clock;
  const auto deadline = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                           std::chrono::duration<double>(minutes * 60.0));
  struct Tally { int64_t rounds = 0, cases = 0, failures = 0; };
  std::map<std::string, Tally> tally;
  std::random_device entropy;
  int64_t failures = 0;
  fmt::print("proptest-long: {} minutes, fresh seeds; failing cases go to $LOCKSTEP_PROPTEST_DIR "
             "or /tmp/lockstep-proptest\n", minutes);
  while (Clock::now() < deadline) {
    for (const ls::proptest::PropertyEntry& p : ls::proptest::all_properties()) {
      if (!only.empty() && p.name != only) continue;
      if (Clock::now() >= deadline) break;
      ls::proptest::PropertyConfig config;
      config.seed = (uint64_t{entropy()} << 32) | entropy();
      config.cases = p.ci_cases;
      const ls::proptest::Outcome o = p.run(config);
      Tally& t = tally[p.name];
      ++t.rounds;
      t.cases += o.cases_run;
      if (!o.passed) {
        ++t.failures, ++failures;
        fmt::print("FAILED {} (seed {}):\n{}\n", p.name, config.seed, o.message);
      }
    }
  }
  fmt::print("{:<26} {:>8} {:>10} {:>9}\n", "property", "rounds", "cases", "failures");
  for (const auto& [name, t] : tally) {
    fmt::print("{:<26} {:>8} {:>10} {:>9}\n", name, t.rounds, t.cases, t.failures);
  }
  return failures == 0 ? 0 : 1;
}
