// The property suite under fixed seeds (CI), each property's companion against a planted bug
// (which it must catch), and the acceptance check that a planted failure's shrunk trace replays
// with the divergence at the step the property named.
#include <gtest/gtest.h>

#include "core/page_allocator.h"
#include "proptest/broken_backend.h"
#include "proptest/properties.h"
#include "proptest/runner.h"
#include "proptest/state_models.h"
#include "proptest/workload.h"
#include "replay/replay.h"
#include "replay/trace_check.h"

#include <rapidcheck/gtest.h>

#include <regex>

namespace ls::proptest {
namespace {

PropertyConfig ci(int cases) {
  PropertyConfig c;
  c.seed = rc::detail::configuration().testParams.seed;
  c.cases = cases;
  return c;
}

void expect_passes(const std::string& name) {
  const PropertyEntry& p = property_named(name);
  const Outcome o = p.run(ci(p.ci_cases));
  EXPECT_TRUE(o.passed) << o.message;
  EXPECT_GT(o.cases_run, 0);
}

// A companion: the property against a planted bug must fail, and record its shrunk case.
Outcome expect_catches(const std::string& name, BackendBug bug, bool planted = false, int cases = 150) {
  PropertyConfig c = ci(cases);
  c.bug = bug;
  c.planted = planted;
  const Outcome o = property_named(name).run(c);
  EXPECT_FALSE(o.passed) << name << " did not catch the planted bug (" << to_string(bug)
                         << (planted ? ", property's own plant" : "") << ") in " << o.cases_run << " cases";
  if (!o.passed) {
    EXPECT_NE(o.reproduce.find("RC_PARAMS=\"") , std::string::npos) << o.message;
    if (o.trace) {
      EXPECT_NE(o.message.find("lockstep replay"), std::string::npos) << o.message;
      EXPECT_TRUE(std::filesystem::exists(*o.trace)) << o.message;
    }
    std::cout << "[ planted ] " << name << " caught "
              << (planted ? "the property's own plant" : std::string(to_string(bug))) << ":\n"
              << o.message << "\n";
  }
  return o;
}

// ----------------------------------------------------------------------------- the properties

TEST(Properties, AllocatorModel) { expect_passes("allocator_model"); }
TEST(Properties, SchedulerModel) { expect_passes("scheduler_model"); }
TEST(Properties, ExecutorInvariants) { expect_passes("executor_invariants"); }
// The generated runs were not degenerate: every feature the properties claim to cover occurred.
TEST(Properties, GeneratedRunsCoverEveryFeature) {
  const Coverage before = coverage();
  for (const char* name : {"executor_invariants", "retraction_invariance"}) {
    PropertyConfig c = ci(100);
    EXPECT_TRUE(property_named(name).run(c).passed);
  }
  const Coverage& after = coverage();
  std::cout << "coverage: " << after.runs - before.runs << " runs, " << after.steps - before.steps
            << " steps, " << after.tokens - before.tokens << " tokens, " << after.mixed_steps - before.mixed_steps
            << " MIXED steps, " << after.retractions - before.retractions << " retractions, "
            << after.pool_row_moves - before.pool_row_moves << " recoveries on another pool row, "
            << after.prefix_hits - before.prefix_hits << " prefix hits, " << after.poisoned - before.poisoned
            << " poisoned rows, " << after.rejected - before.rejected << " rejected ops, "
            << after.context_clamped - before.context_clamped << " context-clamped rows\n";
  EXPECT_GT(after.tokens - before.tokens, 1000);
  EXPECT_GT(after.mixed_steps - before.mixed_steps, 0);
  EXPECT_GT(after.retractions - before.retractions, 0);
  EXPECT_GT(after.pool_row_moves - before.pool_row_moves, 0);
  EXPECT_GT(after.prefix_hits - before.prefix_hits, 0);
  EXPECT_GT(after.poisoned - before.poisoned, 0);
  EXPECT_GT(after.rejected - before.rejected, 0);
  EXPECT_GT(after.context_clamped - before.context_clamped, 0);
}

TEST(Properties, OpContract) { expect_passes("op_contract"); }
TEST(Properties, CoBatchInvariance) { expect_passes("co_batch_invariance"); }
TEST(Properties, ChunkingInvariance) { expect_passes("chunking_invariance"); }
TEST(Properties, PoolRowInvariance) { expect_passes("pool_row_invariance"); }
TEST(Properties, RetractionInvariance) { expect_passes("retraction_invariance"); }
TEST(Properties, OverlapInvariance) { expect_passes("overlap_invariance"); }
TEST(Properties, RunAheadInvariance) { expect_passes("run_ahead_invariance"); }
TEST(Properties, RecordReplayIdentical) { expect_passes("record_replay_identical"); }
TEST(Properties, TraceCheckClean) { expect_passes("trace_check_clean"); }
TEST(Properties, SimFingerprint) { expect_passes("sim_fingerprint"); }
TEST(Properties, TraceMutation) { expect_passes("trace_mutation"); }
TEST(Properties, SimTraceCheckClean) { expect_passes("sim_trace_check_clean"); }

// The allocator's invalid calls are bugs of its caller (the scheduler), so they are LS_ASSERTs
// that abort with the page named — not ls::Error.
TEST(AllocatorDeathTest, DoubleFreeAborts) {
  EXPECT_DEATH(
      {
        PageAllocator a(8, 2);
        const std::vector<int32_t> pages = a.allocate(1);
        a.release(pages[0]);
        a.release(pages[0]);
      },
      "double free of page");
}

// ----------------------------------------------------------------------------- companions

TEST(PlantedBugs, AllocatorModelCatchesADoubleHandout) {
  expect_catches("allocator_model", BackendBug::kNone, true);
}
TEST(PlantedBugs, SchedulerModelCatchesALostFinish) {
  expect_catches("scheduler_model", BackendBug::kNone, true, 60);
}
TEST(PlantedBugs, InvariantsCatchASkippedChunkReset) {
  expect_catches("executor_invariants", BackendBug::kSkipChunkReset);
}
TEST(PlantedBugs, InvariantsCatchAnOffByOneSlot) {
  expect_catches("executor_invariants", BackendBug::kShiftedChunkSlots);
}
TEST(PlantedBugs, InvariantsCatchAPaddedRowOnPage1) {
  expect_catches("executor_invariants", BackendBug::kPaddedRowLivePage);
}
TEST(PlantedBugs, InvariantsCatchAMissingContextClamp) {
  expect_catches("executor_invariants", BackendBug::kNoContextClamp);
}
TEST(PlantedBugs, InvariantsCatchANanGuardThatMissesDecodeRows) {
  expect_catches("executor_invariants", BackendBug::kNanGuardMissesDecode);
}
TEST(PlantedBugs, InvariantsCatchASkippedRecoveryReset) {
  expect_catches("executor_invariants", BackendBug::kSkipRecoveryReset);
}
TEST(PlantedBugs, ContractCatchesAFrontThatRunsBrokenOps) {
  expect_catches("op_contract", BackendBug::kNone, true);
}
TEST(PlantedBugs, CoBatchCatchesAnRngKeyedByBatchRow) {
  expect_catches("co_batch_invariance", BackendBug::kRngByBatchRow);
}
TEST(PlantedBugs, ChunkingCatchesAnOffByOneSlot) {
  expect_catches("chunking_invariance", BackendBug::kShiftedChunkSlots);
}
TEST(PlantedBugs, PoolRowCatchesAnRngKeyedByPoolRow) {
  expect_catches("pool_row_invariance", BackendBug::kRngByPoolRow);
}
TEST(PlantedBugs, RetractionCatchesASkippedRecoveryReset) {
  expect_catches("retraction_invariance", BackendBug::kSkipRecoveryReset);
}
TEST(PlantedBugs, OverlapCatchesAnRngKeyedByBatchRow) {
  expect_catches("overlap_invariance", BackendBug::kRngByBatchRow, false, 60);
}
TEST(PlantedBugs, RunAheadCatchesResultsSharingOneSlot) {
  expect_catches("run_ahead_invariance", BackendBug::kNone, true, 60);
}
TEST(PlantedBugs, RecordReplayCatchesAnOffByOneSlot) {
  expect_catches("record_replay_identical", BackendBug::kShiftedChunkSlots);
}
TEST(PlantedBugs, TraceCheckCatchesASkippedChunkReset) {
  expect_catches("trace_check_clean", BackendBug::kSkipChunkReset);
}
TEST(PlantedBugs, SimFingerprintCatchesADifferentModel) {
  expect_catches("sim_fingerprint", BackendBug::kNone, true, 3);
}
TEST(PlantedBugs, TraceMutationCatchesAnRngKeyedByPoolRow) {
  expect_catches("trace_mutation", BackendBug::kRngByPoolRow, false, 60);
}

// ----------------------------------------------------------------------------- acceptance

// The shrunk trace of a planted failure (vcl reset skipped on a later chunk) replays with
// `lockstep replay` on the correct backend and diverges at the step the property named;
// `lockstep check` names the broken invariant at that same step.
TEST(PlantedTrace, ShrunkTraceReplaysWithTheDivergenceAtTheNamedStep) {
  const Outcome o = expect_catches("executor_invariants", BackendBug::kSkipChunkReset);
  ASSERT_FALSE(o.passed);
  ASSERT_TRUE(o.trace.has_value()) << o.message;
  std::smatch m;
  ASSERT_TRUE(std::regex_search(o.message, m, std::regex("step ([0-9]+) row"))) << o.message;
  const int64_t named_step = std::stoll(m[1].str());

  const replay::ReplayReport replayed = replay::replay_trace(*o.trace, {});
  ASSERT_TRUE(replayed.divergence.has_value()) << "the planted failure replays identically";
  EXPECT_EQ(replayed.divergence->step, named_step) << replayed.divergence->describe();
  EXPECT_EQ(replayed.divergence->field, "valid_cache_length") << replayed.divergence->describe();

  const replay::CheckReport checked = replay::check_trace(*o.trace);
  ASSERT_TRUE(checked.violation.has_value());
  EXPECT_EQ(checked.violation->step, named_step) << checked.violation->describe();
  EXPECT_EQ(checked.violation->invariant, "valid_cache_length") << checked.violation->describe();
}

}  // namespace
}  // namespace ls::proptest
