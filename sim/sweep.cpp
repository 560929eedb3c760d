#include "sim/sweep.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

namespace ls::sim {

SeedVerdict run_seed(const SimParams& params, const ModelWeights& weights,
                     const WorldOptions& options, bool twin) {
  SeedVerdict verdict;
  verdict.summary = run_world(params, weights, options);
  if (twin) {
    WorldOptions quiet = options;
    quiet.observer = nullptr;
    verdict.twin_checked = true;
    verdict.twin_fingerprint = run_world(params, weights, quiet).fingerprint;
  }
  return verdict;
}

std::string reproduce_command(const SimParams& params, const SimOverrides& overrides) {
  std::string command = fmt::format("lockstep sim --seed {}", params.seed);
  if (overrides.requests_count) command += fmt::format(" --requests {}", *overrides.requests_count);
  if (overrides.faults) {
    std::vector<std::string> names;
    for (FaultSite site : *overrides.faults) names.emplace_back(to_string(site));
    command += fmt::format(" --faults {}", names.empty() ? "none" : fmt::format("{}", fmt::join(names, ",")));
  } else if (!overrides.faults_enabled) {
    command += " --faults none";
  }
  if (overrides.speculative) command += " --spec";
  if (overrides.tp_degree != 1) command += fmt::format(" --tp {}", overrides.tp_degree);
  if (overrides.model != "tiny") command += fmt::format(" --model {}", overrides.model);
  if (overrides.drafter) {
    command += *overrides.drafter == SimDrafter::kNgram ? " --drafter ngram" : " --drafter oracle-mix";
  }
  return command;
}

}  // namespace ls::sim
