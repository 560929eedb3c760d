// The deterministic serving simulation: seed sweeps with faults on, every checker and the twin-run
// check passing, and checkers that demonstrably fail on bad observations.
#include "core/model/weights.h"
#include "sim/checkers.h"
#include "sim/sweep.h"
#include "tests/test_support.h"

#include <gtest/gtest.h>

#include <fmt/format.h>

#include <algorithm>

namespace ls::sim {
namespace {

using testing::sim_weights;

struct SweepTotals {
  int64_t failed = 0, retract_swap = 0, retract_recompute = 0, recoveries = 0, prefix_hits = 0;
  std::array<int64_t, kFaultSitesCount> fired{};
};

SweepTotals sweep(uint64_t first, uint64_t last, const SimOverrides& overrides) {
  SweepTotals t;
  for (uint64_t seed = first; seed <= last; ++seed) {
    const SimParams params = derive_params(seed, overrides);
    const SeedVerdict v = run_seed(params, sim_weights(params.model), {}, /*twin=*/true);
    if (!v.passed()) {
      ++t.failed;
      ADD_FAILURE() << reproduce_command(params, overrides) << ": "
                    << (v.summary.failures.empty() ? "twin fingerprint differs"
                                                   : v.summary.failures[0].checker + ": " +
                                                         v.summary.failures[0].detail);
    }
    t.retract_swap += v.summary.retractions_swap;
    t.retract_recompute += v.summary.retractions_recompute;
    t.recoveries += v.summary.recoveries;
    t.prefix_hits += v.summary.prefix_hit_tokens;
    for (int i = 0; i < kFaultSitesCount; ++i) t.fired[i] += v.summary.faults_fired[i];
  }
  return t;
}

// CI's sweep: 200 seeds, each switching fault sites on with probability 1/2.
TEST(SimSweep, TwoHundredSeedsWithFaultsPassEveryCheckerAndTheTwinRun) {
  const SweepTotals t = sweep(1, 200, {});
  EXPECT_EQ(t.failed, 0);
  // The sweep must reach the paths it claims to test.
  EXPECT_GT(t.retract_swap, 0);
  EXPECT_GT(t.retract_recompute, 0);
  EXPECT_GT(t.recoveries, 0);
  EXPECT_GT(t.prefix_hits, 0);
  for (int i = 0; i < kFaultSitesCount; ++i) {
    if (static_cast<FaultSite>(i) == FaultSite::kPagePressure ||
        static_cast<FaultSite>(i) == FaultSite::kContextLimit) {
      continue;  // shape the workload rather than fire per step
    }
    EXPECT_GT(t.fired[i], 0) << to_string(static_cast<FaultSite>(i)) << " never fired";
  }
}

// Speculative mode: every seed draws W in 2..8 and a drafter (n-gram, or oracle-mix with a set
// acceptance), faults on as in CI's sweep; the checkers (vcl ≤ L, accepted lengths = vcl growth,
// KV slots in the request's own pages, page accounting, liveness) and the twin run must pass.
// 12 requests per world (half the mean) keep it as fast as the sweep above: a verify row computes
// W tokens, and page pressure, retraction and the context limit do not need more requests.
TEST(SimSweep, TwoHundredSeedsWithSpeculativeDecoding) {
  SimOverrides spec;
  spec.speculative = true;
  spec.requests_count = 12;
  std::array<int64_t, 17> accepted{};
  int64_t failed = 0, ngram = 0, oracle = 0, context_faults = 0, swaps = 0, recomputes = 0;
  for (uint64_t seed = 1; seed <= 200; ++seed) {
    const SimParams params = derive_params(seed, spec);
    ASSERT_GE(params.verify_width, 2);
    ASSERT_LE(params.verify_width, 8);
    (params.drafter == SimDrafter::kNgram ? ngram : oracle) += 1;
    const SeedVerdict v = run_seed(params, sim_weights(), {}, /*twin=*/true);
    if (!v.passed()) {
      ++failed;
      ADD_FAILURE() << reproduce_command(params, spec) << ": "
                    << (v.summary.failures.empty() ? "twin fingerprint differs"
                                                   : v.summary.failures[0].checker + ": " +
                                                         v.summary.failures[0].detail);
    }
    for (size_t a = 0; a < accepted.size(); ++a) accepted[a] += v.summary.decode_rows_by_accepted[a];
    swaps += v.summary.retractions_swap;
    recomputes += v.summary.retractions_recompute;
    context_faults += std::count(params.faults.begin(), params.faults.end(), FaultSite::kContextLimit);
  }
  EXPECT_EQ(failed, 0);
  EXPECT_GT(ngram, 50);
  EXPECT_GT(oracle, 50);
  EXPECT_GT(context_faults, 50);
  EXPECT_GT(swaps, 0);       // recovered by swap: a force-single row with W > 1
  EXPECT_GT(recomputes, 0);
  // Accepted lengths span 0 (a row at the context limit) through 8.
  for (size_t a = 0; a <= 8; ++a) EXPECT_GT(accepted[a], 0) << "no decode row accepted " << a;
}

TEST(SimSweep, EverySiteOnAtOnce) {
  SimOverrides all;
  all.faults = std::vector<FaultSite>{FaultSite::kNanLogits,       FaultSite::kOovSample,
                                      FaultSite::kPagePressure,    FaultSite::kAbortMidPrefill,
                                      FaultSite::kContextLimit,    FaultSite::kLateResult};
  EXPECT_EQ(sweep(1001, 1060, all).failed, 0);
}

// The world on tiny-hybrid (issue 19) with every fault site on: the recurrent-state checkers after
// every step, prefix hits through checkpoint slots, retraction by recompute and by swap (the
// working state carried with the pages), host pages as the seed draws them.
TEST(SimSweep, HybridSeedsWithEverySiteOnPass) {
  SimOverrides overrides;
  overrides.model = "tiny-hybrid";
  std::vector<FaultSite> all;
  for (int i = 0; i < kFaultSitesCount; ++i) all.push_back(static_cast<FaultSite>(i));
  overrides.faults = all;
  const SweepTotals t = sweep(1, 40, overrides);
  EXPECT_EQ(t.failed, 0);
  EXPECT_GT(t.retract_recompute, 0);
  EXPECT_GT(t.retract_swap, 0);
  EXPECT_GT(t.prefix_hits, 0);
  int32_t with_cache = 0, with_host_pages = 0;
  for (uint64_t seed = 1; seed <= 40; ++seed) {
    const SimParams p = derive_params(seed, overrides);
    EXPECT_TRUE(p.recurrent_state);
    EXPECT_EQ(p.mamba_slots_count, p.prefix_cache ? 2 * p.max_batch_rows + 2 : p.max_batch_rows);
    with_cache += p.prefix_cache ? 1 : 0;
    with_host_pages += p.host_pages_count > 0 ? 1 : 0;
  }
  EXPECT_GT(with_cache, 0);
  EXPECT_LT(with_cache, 40);
  EXPECT_GT(with_host_pages, 0);
  EXPECT_LT(with_host_pages, 40);
  const SimParams p = derive_params(1, overrides);
  EXPECT_NE(p.describe().find("a swap carries the working state with the pages"),
            std::string::npos);
  EXPECT_NE(reproduce_command(p, overrides).find("--model tiny-hybrid"), std::string::npos);
  // The same seed on tiny draws the same world but for what the hybrid overrides.
  SimOverrides tiny = overrides;
  tiny.model = "tiny";
  EXPECT_EQ(derive_params(1, tiny).max_batch_rows, p.max_batch_rows);
  EXPECT_EQ(derive_params(1, tiny).requests_count, p.requests_count);
  EXPECT_EQ(derive_params(1, tiny).host_pages_count, p.host_pages_count);
}

// The hybrid world with speculative decoding (issue 19): W in 2..8, the n-gram or oracle-mix
// drafter, every fault site on; verified rows keep each verify token's state and commit the one
// after the last accepted token, checkpoints follow the rule with a drafter. The checkers and the
// twin run must pass, the oracle-mix seeds reproduce their W = 1 greedy references (its drafts
// come from them), accepted lengths span partial acceptance, and prefix hits still land.
TEST(SimSweep, HybridSeedsWithSpeculativeDecodingPass) {
  SimOverrides o;
  o.model = "tiny-hybrid";
  o.speculative = true;
  std::vector<FaultSite> all;
  for (int i = 0; i < kFaultSitesCount; ++i) all.push_back(static_cast<FaultSite>(i));
  o.faults = all;
  std::array<int64_t, 17> accepted{};
  int64_t failed = 0, hits = 0;
  for (uint64_t seed = 1; seed <= 40; ++seed) {
    const SimParams params = derive_params(seed, o);
    ASSERT_GE(params.verify_width, 2);
    ASSERT_TRUE(params.recurrent_state);
    const SeedVerdict v = run_seed(params, sim_weights(params.model), {}, /*twin=*/true);
    if (!v.passed()) {
      ++failed;
      ADD_FAILURE() << reproduce_command(params, o) << ": "
                    << (v.summary.failures.empty() ? "twin fingerprint differs"
                                                   : v.summary.failures[0].checker + ": " +
                                                         v.summary.failures[0].detail);
    }
    for (size_t a = 0; a < accepted.size(); ++a) accepted[a] += v.summary.decode_rows_by_accepted[a];
    hits += v.summary.prefix_hit_tokens;
  }
  EXPECT_EQ(failed, 0);
  EXPECT_GT(hits, 0);
  for (size_t a = 1; a <= 3; ++a) EXPECT_GT(accepted[a], 0) << "no decode row accepted " << a;
}

TEST(SimParams, AHybridRefusesWhatItCannotRunByName) {
  SimOverrides o;
  o.model = "tiny-hybrid";
  o.tp_degree = 2;
  EXPECT_THROW(
      {
        try {
          derive_params(1, o);
        } catch (const Error& e) {
          EXPECT_NE(std::string(e.what()).find("--tp 2: model 'tiny-hybrid' has Mamba2 layers"),
                    std::string::npos) << e.what();
          throw;
        }
      },
      Error);
  o.tp_degree = 1;
  o.model = "llama-1b";
  EXPECT_THROW(derive_params(1, o), Error);
}

TEST(SimParams, OneSeedDerivesTheSameWorldAndDifferentSeedsDiffer) {
  EXPECT_EQ(derive_params(7, {}).describe(), derive_params(7, {}).describe());
  EXPECT_NE(derive_params(7, {}).describe(), derive_params(8, {}).describe());
  const SeedVerdict a = run_seed(derive_params(7, {}), sim_weights(), {}, false);
  const SeedVerdict b = run_seed(derive_params(8, {}), sim_weights(), {}, false);
  EXPECT_NE(a.summary.fingerprint, b.summary.fingerprint);
}

TEST(SimParams, FaultsNoneSwitchesEverySiteOff) {
  SimOverrides none;
  none.faults_enabled = false;
  for (uint64_t seed = 1; seed <= 20; ++seed) EXPECT_TRUE(derive_params(seed, none).faults.empty());
}

// The checkers themselves can fail: hand-made observations that break an invariant.
TEST(SimCheckers, FlagVclPastContextAndAWrongCommit) {
  ExecutorConfig config;
  config.context_length = 10;
  ForwardOp op;
  op.rows.push_back({.kind = RowKind::kDecode, .request_id = 5, .pool_row = 1, .input_length = 1});
  StepResult result;
  result.tokens = {3};
  result.accepted_lengths = {1};
  StateSnapshot before, after;
  before.valid_cache_length = {10};
  after.valid_cache_length = {11};  // 10 + 1 = 11 > L
  InputSnapshot inputs;
  inputs.positions = {10};
  inputs.slots = {0};
  const StepFaults faults;
  const StepObservation o{4, &op, &result, &before, &after, &inputs, 512, &config, &faults};
  Scheduler scheduler(SchedulerConfig{});
  std::vector<CheckFailure> failures;
  check_step(o, scheduler, failures);
  // Accepting 1 at vcl 10 = L is past the clamp, and the vcl it committed is past L.
  ASSERT_EQ(failures.size(), 2u);
  EXPECT_EQ(failures[0].checker, "context_clamp");
  EXPECT_EQ(failures[0].step, 4);
  EXPECT_EQ(failures[1].checker, "valid_cache_length");
  EXPECT_NE(failures[1].detail.find("11 outside [0, L = 10]"), std::string::npos) << failures[1].detail;

  before.valid_cache_length = {8};
  after.valid_cache_length = {7};  // not 8 + 1: a wrong commit within L
  failures.clear();
  check_step(o, scheduler, failures);
  ASSERT_EQ(failures.size(), 1u);
  EXPECT_EQ(failures[0].checker, "valid_cache_length");
  EXPECT_NE(failures[0].detail.find("7, expected previous vcl 8 + accepted 1 = 9"),
            std::string::npos)
      << failures[0].detail;
}

TEST(SimCheckers, FlagOutOfVocabularyOutputsAndBadAcceptedLengths) {
  ExecutorConfig config;
  ForwardOp op;
  op.rows.push_back({.kind = RowKind::kDecode, .request_id = 5, .pool_row = 1, .input_length = 1});
  StepResult result;
  result.tokens = {600};
  result.accepted_lengths = {2};
  StateSnapshot state;
  state.valid_cache_length = {3};
  InputSnapshot inputs;
  inputs.positions = {3};
  inputs.slots = {0};
  const StepFaults faults;
  const StepObservation o{0, &op, &result, &state, &state, &inputs, 512, &config, &faults};
  std::vector<CheckFailure> failures;
  check_step(o, Scheduler(SchedulerConfig{}), failures);
  ASSERT_EQ(failures.size(), 2u);
  EXPECT_EQ(failures[0].checker, "tokens");
  EXPECT_EQ(failures[1].checker, "accepted_length");
}

// A slot outside the pages the request holds, and NaN flags that disagree with the faults.
TEST(SimCheckers, FlagAForeignKvSlotAndNanFlagsThatDisagreeWithTheFaults) {
  ExecutorConfig config;
  config.page_size = 4;
  ForwardOp op;
  op.rows.push_back({.kind = RowKind::kDecode, .request_id = 5, .pool_row = 1, .input_length = 1});
  op.rows.push_back({.kind = RowKind::kDecode, .request_id = 6, .pool_row = 2, .input_length = 1});
  StepResult result;
  result.tokens = {3, 4};
  result.accepted_lengths = {1, 1};
  result.nan_flags = {0, 1};  // row 1 flagged, row 0 poisoned below
  StateSnapshot before, after;
  before.valid_cache_length = {2, 2};
  after.valid_cache_length = {3, 3};
  InputSnapshot inputs;
  inputs.positions = {2, 2};
  inputs.slots = {0, 4 * 7 + 2};  // request 6 holds no page, let alone page 7
  StepFaults faults;
  faults.poisoned_rows = {0};
  const StepObservation o{9, &op, &result, &before, &after, &inputs, 512, &config, &faults};
  const auto failures_of = [&] {
    std::vector<CheckFailure> failures;
    check_step(o, Scheduler(SchedulerConfig{}), failures);
    return failures;
  };
  std::vector<CheckFailure> failures = failures_of();
  ASSERT_EQ(failures.size(), 2u);
  EXPECT_EQ(failures[0].checker, "nan_flag");
  EXPECT_EQ(failures[0].detail, "nan_flags[0]: flag 0 but the step's faults poisoned this row with NaN");
  EXPECT_EQ(failures[1].checker, "nan_flag");
  EXPECT_EQ(failures[1].step, 9);

  faults.poisoned_rows = {1};  // the flags agree now; the slot does not
  failures = failures_of();
  ASSERT_EQ(failures.size(), 1u);
  EXPECT_EQ(failures[0].checker, "kv_slot");
  EXPECT_EQ(failures[0].detail, "slots[1]: position 2 wrote slot 30, expected 0 (pages held [])");
}

// The recurrent-state checkers on hand-made observations: each fires on its bug.
TEST(SimCheckers, FlagMambaPaddingForeignStateChangesAndUnzeroedFirstChunks) {
  ForwardOp op;
  op.rows.push_back({.kind = RowKind::kPrefill, .request_id = 5, .pool_row = 1, .input_length = 2,
                     .mamba_working = 0});
  op.rows.push_back({.kind = RowKind::kDecode, .request_id = 6, .pool_row = 2, .input_length = 1,
                     .mamba_working = 1});
  InputSnapshot inputs;
  inputs.mamba_slots = {0, 0, 1, -1, -1};
  std::vector<uint64_t> before = {10, 11, 12}, after = {20, 21, 12};
  StepPlan plan;
  plan.mamba_zeroes = {0};
  StepObservation o;
  o.step = 4, o.op = &op, o.inputs = &inputs, o.plan = &plan;
  o.mamba_before = &before, o.mamba_after = &after;
  const Scheduler scheduler{SchedulerConfig{}};
  const auto failures_of = [&] {
    MambaSlotOwners owners;
    std::vector<CheckFailure> failures;
    check_mamba_step(o, scheduler, owners, failures);
    return failures;
  };
  EXPECT_TRUE(failures_of().empty());

  inputs.mamba_slots = {0, 0, 1, 0, -1};  // a padded token on slot 0
  std::vector<CheckFailure> f = failures_of();
  ASSERT_EQ(f.size(), 1u);
  EXPECT_EQ(f[0].checker, "mamba-padding");
  EXPECT_EQ(f[0].detail, "padded token 3 (the step has 3 tokens) carries state slot 0; padding must carry -1");
  inputs.mamba_slots = {0, 1, 1, -1, -1};  // a real token on another row's slot
  f = failures_of();
  ASSERT_EQ(f.size(), 1u);
  EXPECT_EQ(f[0].checker, "mamba-padding");

  inputs.mamba_slots = {0, 0, 1, -1, -1};
  after = {20, 21, 13};  // slot 2 belongs to no row of the step
  f = failures_of();
  ASSERT_EQ(f.size(), 1u);
  EXPECT_EQ(f[0].checker, "mamba-state-owner");
  EXPECT_EQ(f[0].detail, "state slot 2 changed (digest 000000000000000c -> 000000000000000d) but no "
                         "row of the step owns it (owned: 0, 1)");

  after = {20, 21, 12};
  plan.mamba_zeroes.clear();  // request 5 starts at prefix 0 from a slot nobody zeroed
  f = failures_of();
  ASSERT_EQ(f.size(), 1u);
  EXPECT_EQ(f[0].checker, "mamba-first-chunk");
  EXPECT_EQ(f[0].detail, "op row 0 (request 5) starts its request at prefix 0 but its working slot "
                         "0 is not zeroed before the forward");

  op.rows[0].prefix_length = 8;  // a prefix hit: the first chunk copies checkpoint slot 2
  op.rows[0].mamba_cow_src = 2, op.rows[0].mamba_branching_seqlen = 8;
  f = failures_of();
  ASSERT_EQ(f.size(), 1u);
  EXPECT_EQ(f[0].checker, "mamba-first-chunk");
  EXPECT_EQ(f[0].detail, "op row 0 (request 5) starts its request at prefix 8 but its working slot "
                         "0 is not copied from slot 2 before the forward");
  plan.mamba_copies = {{2, 0}};
  EXPECT_TRUE(failures_of().empty());
}

// mamba-slot-owner across steps: request 2 on the working slot of request 1 while the scheduler
// still has request 1 prefilling (the hand-over after a finish is held by the sweeps passing).
TEST(SimCheckers, FlagAWorkingSlotGivenAwayWhileItsHolderIsLive) {
  SchedulerConfig c;
  c.max_batch_rows = 2, c.context_length = 32, c.page_size = 4, c.pages_count = 40;
  c.prefill_chunk_tokens = 4, c.mamba_slots_count = 2, c.recurrent_state = true;
  c.prefix_cache = false, c.overlap = false;
  Scheduler scheduler(c);
  scheduler.submit(RequestSpec{.id = 1, .prompt = std::vector<int32_t>(10, 3), .max_new_tokens = 2}, 64);
  const StepPlanOut first = scheduler.plan();  // request 1's first chunk: prefilling
  ASSERT_EQ(scheduler.state_of(1), RequestState::kPrefilling);
  ForwardOp other;
  other.rows.push_back({.kind = RowKind::kPrefill, .request_id = 2, .pool_row = 2, .input_length = 1,
                        .mamba_working = first.op.rows[0].mamba_working});
  MambaSlotOwners owners;
  std::vector<CheckFailure> failures;
  check_mamba_slot_owners(0, first.op, scheduler, owners, failures);
  EXPECT_TRUE(failures.empty());
  check_mamba_slot_owners(1, other, scheduler, owners, failures);
  ASSERT_EQ(failures.size(), 1u);
  EXPECT_EQ(failures[0].checker, "mamba-slot-owner");
  EXPECT_EQ(failures[0].step, 1);
  EXPECT_EQ(failures[0].detail, fmt::format("working slot {} given to request 2 while request 1 "
                                            "that holds it is prefilling",
                                            first.op.rows[0].mamba_working));
}

}  // namespace
}  // namespace ls::sim
