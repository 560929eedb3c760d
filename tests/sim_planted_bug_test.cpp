// Linked against lockstep_sim_planted: the scheduler leaks a page whenever a request holding pages
// is aborted. The simulator's own page-accounting checker (independent of the scheduler's
// self-check) must notice on every seed where a request was aborted mid-prefill.
#include "core/model/weights.h"
#include "sim/sweep.h"

#include <gtest/gtest.h>

#include <algorithm>

namespace ls::sim {
namespace {

TEST(PlantedBug, CheckersCatchAPageLeakOnAbort) {
  const ModelWeights weights = weights_from_seed(model_config_named("tiny"), 0);
  SimOverrides overrides;
  overrides.faults = std::vector<FaultSite>{FaultSite::kAbortMidPrefill};
  int64_t exercised = 0;
  for (uint64_t seed = 1; seed <= 20; ++seed) {
    const SeedVerdict v = run_seed(derive_params(seed, overrides), weights, {}, false);
    // A request aborted mid-prefill always holds pages, so the planted leak fires.
    if (v.summary.faults_fired[static_cast<size_t>(FaultSite::kAbortMidPrefill)] == 0) continue;
    ++exercised;
    const auto& f = v.summary.failures;
    EXPECT_TRUE(std::any_of(f.begin(), f.end(), [](const CheckFailure& x) {
      return x.checker == "page-accounting";
    })) << "seed " << seed << ": the leak went unnoticed";
  }
  EXPECT_GE(exercised, 3) << "too few seeds aborted a request mid-prefill";
}

}  // namespace
}  // namespace ls::sim
