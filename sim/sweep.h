// Running a seed with its twin-run check, and sweeps over seed ranges.
#pragma once

#include "sim/world.h"

#include <string>

namespace ls::sim {

struct SeedVerdict {
  SimSummary summary;
  bool twin_checked = false;
  uint64_t twin_fingerprint = 0;

  bool twin_ok() const { return !twin_checked || twin_fingerprint == summary.fingerprint; }
  bool passed() const { return summary.passed() && twin_ok(); }
};

// Runs the seed; with `twin`, runs it again (no observer) and compares fingerprints.
SeedVerdict run_seed(const SimParams& params, const ModelWeights& weights,
                     const WorldOptions& options, bool twin);

// The command line that reproduces a run of these parameters.
std::string reproduce_command(const SimParams& params, const SimOverrides& overrides);

}  // namespace ls::sim
