// Running ahead (issue 6, DESIGN.md rule 9): Executor::submit/collect with step k+1 submitted
// before step k is collected gives exactly the results of step() one at a time — planted faults
// and a rejected op in between included — and the serving loop's run-ahead order (plan k, submit
// k, collect and apply k − 1) gives the same tokens as one step at a time. The oracle is the same
// script run through Executor::step on a second CPU backend, never the code under test.
//
// Two backends run the pipelined side: the CPU reference itself (it cannot run ahead, so the
// executor completes each step at submit and holds the result) and RunAheadCpu, a test double
// that says it can: it computes each step at enqueue_finish, hands the result out at
// collect_finish, and checks what the executor promises a real run-ahead backend — results
// collected in order, each with the very plan object it was enqueued with, unchanged.
#include "core/check.h"
#include "core/executor.h"
#include "core/scheduler.h"
#include "core/serving_loop.h"
#include "core/step_observer.h"
#include "tests/test_support.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <deque>
#include <functional>
#include <map>
#include <memory>

namespace ls {
namespace {

using ::testing::HasSubstr;
using testing::decode_row;
using testing::pages_from;
using testing::prefill_row;
using testing::prompt_for;
using testing::small_config;
using testing::tiny_weights;

constexpr int32_t kVocab = 512;  // the tiny model

class RunAheadCpu final : public testing::CpuBackendWrapper {
 public:
  explicit RunAheadCpu(const ExecutorConfig& config) : CpuBackendWrapper(tiny_weights(), config) {}

  std::string name() const override { return "cpu-run-ahead"; }
  void apply_table_writes(const StepPlan& plan) override {
    if (++submits_ == fail_at_submit) throw Error("RunAheadCpu: planted failure");
    inner_.apply_table_writes(plan);
  }
  void finish_step(const StepPlan& plan, StepResult& result) override {
    ADD_FAILURE() << "finish_step called on a backend that runs ahead";
    inner_.finish_step(plan, result);
  }
  bool can_run_ahead() const override { return true; }
  void enqueue_finish(const StepPlan& plan) override {
    EXPECT_LT(queue_.size(), 2u) << "a third step enqueued before the first was collected";
    queue_.push_back({&plan, plan.request_ids, plan.rows_count, {}});
    inner_.finish_step(plan, queue_.back().result);
    in_flight_max = std::max(in_flight_max, static_cast<int32_t>(queue_.size()));
  }
  void collect_finish(const StepPlan& plan, StepResult& result) override {
    ASSERT_FALSE(queue_.empty()) << "collect with nothing enqueued";
    Enqueued e = std::move(queue_.front());
    queue_.pop_front();
    EXPECT_EQ(&plan, e.plan) << "collected with another plan than it was enqueued with";
    EXPECT_EQ(plan.request_ids, e.request_ids) << "the plan changed while its step was in flight";
    EXPECT_EQ(plan.rows_count, e.rows_count);
    result = std::move(e.result);
  }

  int32_t in_flight_max = 0;
  int64_t fail_at_submit = -1;  // the submit (1-based) whose first rule throws ls::Error

 private:
  struct Enqueued {
    const StepPlan* plan;
    std::vector<RequestId> request_ids;
    int32_t rows_count;
    StepResult result;
  };
  std::deque<Enqueued> queue_;
  int64_t submits_ = 0;
};

// ------------------------------------------------------------------------------- the executor

// One entry of a script: the faults planted before it, the op, and whether it must be rejected.
struct Action {
  ForwardOp op;
  std::function<void(Executor&)> plant;
  bool rejected = false;
};

OpRow fresh_prefill(RequestId id, int32_t pool_row, int32_t prefix, int32_t chunk, int32_t prompt,
                    std::vector<int32_t> pages, SamplingParams sampling) {
  OpRow row = prefill_row(id, pool_row, prefix, chunk, prompt);
  row.refresh = {0, std::move(pages)};
  row.sampling = sampling;
  return row;
}

void add_prefill_ids(ForwardOp& op, RequestId id, int32_t prefix, int32_t chunk, int32_t prompt) {
  const std::vector<int32_t> ids = prompt_for(id, prompt);
  op.prefill_token_ids.insert(op.prefill_token_ids.end(), ids.begin() + prefix,
                              ids.begin() + prefix + chunk);
}

ForwardOp decode_all(int32_t requests) {
  ForwardOp op;
  for (int32_t i = 1; i <= requests; ++i) op.rows.push_back(decode_row(i, i));
  return op;
}

// Prefill (greedy and stochastic rows), MIXED steps, a chunked prefill, a table slice clamped at
// the width, NaN and ±inf poison, an out-of-vocabulary forced output, injected faults, and two
// rejected ops (a pool row used twice; a new request without sampling parameters), each of which
// consumes the faults planted before it.
std::vector<Action> script() {
  const SamplingParams stochastic{.temperature = 0.9f, .top_k = 40, .top_p = 0.95f, .seed = 11};
  std::vector<Action> s;
  {
    ForwardOp op;
    op.rows.push_back(fresh_prefill(1, 1, 0, 5, 5, pages_from(1, 4), {}));
    op.rows.push_back(fresh_prefill(2, 2, 0, 7, 7, pages_from(5, 4), stochastic));
    add_prefill_ids(op, 1, 0, 5, 5);
    add_prefill_ids(op, 2, 0, 7, 7);
    s.push_back({op, nullptr});
  }
  {
    ForwardOp op;
    op.rows.push_back(fresh_prefill(3, 3, 0, 4, 4, pages_from(9, 4), {.temperature = 0.7f}));
    add_prefill_ids(op, 3, 0, 4, 4);
    op.rows.push_back(decode_row(1, 1));
    op.rows.push_back(decode_row(2, 2));
    s.push_back({op, nullptr});
  }
  s.push_back({decode_all(3), [](Executor& e) { e.poison_next_step({1}); }});
  {
    ForwardOp bad = decode_all(3);
    bad.rows[2].pool_row = 1;  // pool row 1 twice
    s.push_back({bad, [](Executor& e) { e.force_next_output(0, 7); }, true});
  }
  s.push_back({decode_all(3), [](Executor& e) {
                 e.force_next_output(2, kVocab + 88);  // out of vocabulary: flagged and clamped
                 e.poison_next_step({0}, INFINITY);
               }});
  {
    ForwardOp op;
    op.rows.push_back(fresh_prefill(4, 4, 0, 3, 6, pages_from(13, 4), stochastic));
    add_prefill_ids(op, 4, 0, 3, 6);
    for (int32_t i = 1; i <= 3; ++i) op.rows.push_back(decode_row(i, i));
    op.rows[1].refresh = {15, {70, 71, 72}};  // Wp = 17: column 15 and 16 kept, one page cut
    s.push_back({op, [](Executor& e) { e.poison_next_step({3}, -INFINITY); }});
  }
  {
    ForwardOp bad;
    bad.rows.push_back(prefill_row(9, 6, 0, 2, 2));  // new to pool row 6, no sampling parameters
    add_prefill_ids(bad, 9, 0, 2, 2);
    s.push_back({bad, [](Executor& e) { e.poison_next_step({0}); }, true});
  }
  {
    ForwardOp op;
    op.rows.push_back(prefill_row(4, 4, 3, 3, 6));
    add_prefill_ids(op, 4, 3, 3, 6);
    for (int32_t i = 1; i <= 3; ++i) op.rows.push_back(decode_row(i, i));
    s.push_back({op, nullptr});
  }
  for (int32_t k = 0; k < 8; ++k) {
    std::function<void(Executor&)> plant;
    if (k == 2) {
      plant = [](Executor& e) {
        StepFaults f;
        f.poisoned_rows = {2, 3};
        f.forced_outputs = {{1, -5}};
        e.inject_next_step(f);
      };
    }
    ForwardOp op = decode_all(4);
    if (k == 3) op.rows[1].refresh = {16, {73, 74}};  // column 16 kept, one page cut
    if (k == 5) op.rows[1].decode_override = 123;
    s.push_back({op, plant});
  }
  return s;
}

struct ScriptRun {
  std::vector<StepResult> results;
  StateSnapshot state;
  ExecutorStats stats;
};

StateSnapshot all_rows(const Backend& backend, const ExecutorConfig& c) {
  std::vector<int32_t> rows;
  for (int32_t r = 0; r < c.pool_rows_count(); ++r) rows.push_back(r);
  return backend.read_state(rows);
}

constexpr ExecutorOptions kCaptureAll{.capture_logits = true, .want_logprobs = true};

// The oracle: Executor::step, one step at a time, on the CPU reference.
ScriptRun run_one_at_a_time(const std::vector<Action>& actions) {
  const ExecutorConfig c = small_config();
  CpuBackend backend(tiny_weights(), c);
  Executor executor(c, kVocab, backend, kCaptureAll);
  ScriptRun run;
  for (const Action& a : actions) {
    if (a.plant) a.plant(executor);
    if (a.rejected) {
      EXPECT_THROW(executor.step(a.op), Error);
    } else {
      run.results.push_back(executor.step(a.op));
    }
  }
  run.state = all_rows(backend, c);
  run.stats = executor.stats();
  return run;
}

// Step k+1 submitted before step k is collected; each rejected op is submitted with a step in
// flight. Results are collected into one reused StepResult and copied out.
ScriptRun run_pipelined(const std::vector<Action>& actions, Backend& backend,
                        const ExecutorConfig& c) {
  Executor executor(c, kVocab, backend, kCaptureAll);
  ScriptRun run;
  StepResult result;
  for (const Action& a : actions) {
    if (a.plant) a.plant(executor);
    if (a.rejected) {
      EXPECT_EQ(executor.in_flight_count(), 1);
      EXPECT_THROW(executor.submit(a.op), Error);
      EXPECT_TRUE(executor.pending_faults().empty()) << "the rejected step took its faults";
      continue;
    }
    executor.submit(a.op);
    if (executor.in_flight_count() == Executor::kInFlightMax) {
      executor.collect(result);
      run.results.push_back(result);
    }
  }
  while (executor.in_flight_count() > 0) run.results.push_back(executor.collect());
  run.state = all_rows(backend, c);
  run.stats = executor.stats();
  return run;
}

void expect_same(const ScriptRun& expected, const ScriptRun& actual) {
  ASSERT_EQ(expected.results.size(), actual.results.size());
  for (size_t k = 0; k < expected.results.size(); ++k) {
    const StepResult& a = expected.results[k];
    const StepResult& b = actual.results[k];
    EXPECT_EQ(a.tokens, b.tokens) << "step " << k;
    EXPECT_EQ(a.accepted_lengths, b.accepted_lengths) << "step " << k;
    EXPECT_EQ(a.nan_flags, b.nan_flags) << "step " << k;
    EXPECT_EQ(a.oov_flags, b.oov_flags) << "step " << k;
    // Bits, not values: sanitised rows hold ±1e30 and logprobs may be −inf.
    ASSERT_EQ(a.logits.size(), b.logits.size()) << "step " << k;
    EXPECT_EQ(std::memcmp(a.logits.data(), b.logits.data(), a.logits.size() * sizeof(float)), 0)
        << "step " << k;
    ASSERT_EQ(a.logprobs.size(), b.logprobs.size()) << "step " << k;
    EXPECT_EQ(std::memcmp(a.logprobs.data(), b.logprobs.data(), a.logprobs.size() * sizeof(float)),
              0)
        << "step " << k;
    EXPECT_EQ(a.mode, b.mode) << "step " << k;
  }
  EXPECT_EQ(expected.state.valid_cache_length, actual.state.valid_cache_length);
  EXPECT_EQ(expected.state.future_inputs, actual.state.future_inputs);
  EXPECT_EQ(expected.state.table, actual.state.table);
  EXPECT_EQ(expected.stats.steps_count, actual.stats.steps_count);
  EXPECT_EQ(expected.stats.table_slices_clamped, actual.stats.table_slices_clamped);
}

TEST(ExecutorRunAhead, TheScriptIsNotDegenerate) {
  const ScriptRun run = run_one_at_a_time(script());
  ASSERT_EQ(run.results.size(), 14u);
  EXPECT_EQ(run.stats.table_slices_clamped, 2);
  EXPECT_EQ(run.results[2].nan_flags, (std::vector<uint8_t>{0, 1, 0}));
  EXPECT_EQ(run.results[3].oov_flags, (std::vector<uint8_t>{0, 0, 1}));
  EXPECT_EQ(run.results[3].tokens[2], kVocab - 1);
  EXPECT_EQ(run.results[8].oov_flags, (std::vector<uint8_t>{0, 1, 0, 0}));
  EXPECT_EQ(run.results[8].nan_flags, (std::vector<uint8_t>{0, 0, 1, 1}));
  int64_t nonzero = 0;
  for (const StepResult& r : run.results) {
    for (int32_t t : r.tokens) nonzero += t != 0;
  }
  EXPECT_GT(nonzero, 20);
}

TEST(ExecutorRunAhead, InterleavedSubmitCollectOnTheCpuBackendEqualsOneStepAtATime) {
  const std::vector<Action> actions = script();
  const ScriptRun expected = run_one_at_a_time(actions);
  const ExecutorConfig c = small_config();
  CpuBackend backend(tiny_weights(), c);
  expect_same(expected, run_pipelined(actions, backend, c));
}

TEST(ExecutorRunAhead, InterleavedSubmitCollectOnABackendThatRunsAheadEqualsOneStepAtATime) {
  const std::vector<Action> actions = script();
  const ScriptRun expected = run_one_at_a_time(actions);
  const ExecutorConfig c = small_config();
  RunAheadCpu backend(c);
  expect_same(expected, run_pipelined(actions, backend, c));
  EXPECT_EQ(backend.in_flight_max, 2);
}

TEST(ExecutorRunAhead, RefusesAThirdStepAndCollectsOnlyWhatWasSubmitted) {
  const ExecutorConfig c = small_config();
  RunAheadCpu backend(c);
  Executor executor(c, kVocab, backend);
  EXPECT_THAT([&] { executor.collect(); },
              ::testing::ThrowsMessage<Error>(HasSubstr("no step in flight")));
  ForwardOp op;
  op.rows.push_back(fresh_prefill(1, 1, 0, 3, 3, pages_from(1, 2), {}));
  add_prefill_ids(op, 1, 0, 3, 3);
  executor.submit(op);
  EXPECT_THAT([&] { executor.step(decode_all(1)); },
              ::testing::ThrowsMessage<Error>(HasSubstr("in flight")));
  executor.submit(decode_all(1));
  executor.poison_next_step({0});
  EXPECT_THAT([&] { executor.submit(decode_all(1)); },
              ::testing::ThrowsMessage<Error>(HasSubstr("2 steps are in flight")));
  // Refused before anything was taken: the faults wait for the next step that is submitted.
  EXPECT_FALSE(executor.pending_faults().empty());
  EXPECT_EQ(executor.stats().steps_count, 2);
  EXPECT_EQ(executor.collect().mode, ForwardMode::kExtend);
  EXPECT_EQ(executor.collect().mode, ForwardMode::kDecode);
  EXPECT_EQ(executor.in_flight_count(), 0);
  EXPECT_EQ(executor.step(decode_all(1)).nan_flags, (std::vector<uint8_t>{1}));
}

// ------------------------------------------------------------------------------ serving loop

SchedulerConfig loop_config() {
  SchedulerConfig c;
  c.max_batch_rows = 6;
  c.prefill_chunk_tokens = 24;
  c.page_size = 4;
  c.pages_count = 20;  // tight: requests are retracted (swap and recompute)
  c.host_pages_count = 12;
  c.verify_width = 1;
  c.context_length = 64;
  c.overlap = true;
  return c;
}

std::vector<RequestSpec> loop_requests() {
  std::vector<RequestSpec> requests;
  for (RequestId id = 1; id <= 14; ++id) {
    RequestSpec r{.id = id, .prompt = prompt_for(id, 3 + static_cast<int32_t>(id * 7 % 19), kVocab),
                  .max_new_tokens = 6 + static_cast<int32_t>(id * 5 % 17)};
    if (id % 3 == 0) r.sampling = {.temperature = 0.8f, .top_k = 50, .seed = id * 31};
    if (id % 4 == 0) r.stop_ids = {static_cast<int32_t>(id * 13 % kVocab)};
    requests.push_back(std::move(r));
  }
  return requests;
}

struct LoopRun {
  std::map<RequestId, std::vector<int32_t>> tokens;
  std::map<RequestId, FinishReason> reasons;
  ServingProgress progress;
  int64_t retractions = 0;
};

class CountRetractions final : public StepObserver {
 public:
  void on_step_input(int64_t, const ForwardOp&, const std::vector<CacheOp>&,
                     const StepFaults&) override {}
  void on_step_output(int64_t, const ForwardOp&, const StepResult&,
                      const StateSnapshot&) override {}
  void on_scheduler_events(int64_t, const std::vector<SchedulerEvent>& events) override {
    for (const SchedulerEvent& e : events) retractions += e.kind == SchedulerEvent::Kind::kRetract;
  }
  int64_t retractions = 0;
};

LoopRun run_loop(Backend& backend, bool run_ahead, StepObserver* observer = nullptr) {
  const SchedulerConfig sc = loop_config();
  Scheduler scheduler(sc);
  for (const RequestSpec& r : loop_requests()) scheduler.submit(r, kVocab);
  Executor executor(executor_config_for(sc), kVocab, backend);
  LoopRun run;
  run.progress =
      run_serving_loop(scheduler, executor, {.observer = observer, .run_ahead = run_ahead});
  for (const auto& [id, outcome] : scheduler.outcomes()) {
    run.tokens[id] = outcome.tokens;
    run.reasons[id] = outcome.reason;
  }
  return run;
}

void expect_same(const LoopRun& a, const LoopRun& b) {
  EXPECT_EQ(a.tokens, b.tokens);
  EXPECT_EQ(a.reasons, b.reasons);
  EXPECT_EQ(a.progress.steps_count, b.progress.steps_count);
  EXPECT_EQ(a.progress.finished_count, b.progress.finished_count);
  EXPECT_EQ(a.progress.tokens_generated, b.progress.tokens_generated);
}

TEST(ServingLoopRunAhead, GivesTheSameTokensAsOneStepAtATime) {
  const ExecutorConfig ec = executor_config_for(loop_config());
  CpuBackend cpu(tiny_weights(), ec);
  CountRetractions retractions;
  const LoopRun expected = run_loop(cpu, false, &retractions);
  ASSERT_EQ(expected.tokens.size(), 14u);
  EXPECT_GT(retractions.retractions, 0) << "the page budget is meant to force retractions";
  EXPECT_GT(expected.progress.tokens_generated, 100);

  RunAheadCpu ahead(ec);
  expect_same(expected, run_loop(ahead, true));
  EXPECT_EQ(ahead.in_flight_max, 2) << "the loop never submitted step k+1 before collecting k";

  RunAheadCpu off(ec);
  expect_same(expected, run_loop(off, false));
  EXPECT_EQ(off.in_flight_max, 1);

  // An observer snapshots each step's state: the loop must not run ahead then.
  RunAheadCpu observed(ec);
  CountRetractions observer;
  expect_same(expected, run_loop(observed, true, &observer));
  EXPECT_EQ(observed.in_flight_max, 1);
  EXPECT_EQ(observer.retractions, retractions.retractions);

  // The CPU reference cannot run ahead: the loop keeps the one-step-at-a-time order.
  CpuBackend cpu2(tiny_weights(), ec);
  expect_same(expected, run_loop(cpu2, true));
}

// tokens_generated counts what the outputs hold, not the steps' accepted lengths: those also
// count each mid-prompt chunk's sample and the results of steps applied after a retraction.
class SumAcceptedLengths final : public StepObserver {
 public:
  void on_step_input(int64_t, const ForwardOp&, const std::vector<CacheOp>&,
                     const StepFaults&) override {}
  void on_step_output(int64_t, const ForwardOp&, const StepResult& result,
                      const StateSnapshot&) override {
    for (int32_t a : result.accepted_lengths) accepted += a;
  }
  void on_scheduler_events(int64_t, const std::vector<SchedulerEvent>&) override {}
  int64_t accepted = 0;
};

TEST(ServingLoop, TokensGeneratedCountsTheTokensEmitted) {
  CpuBackend cpu(tiny_weights(), executor_config_for(loop_config()));
  SumAcceptedLengths sum;
  const LoopRun run = run_loop(cpu, false, &sum);
  int64_t emitted = 0;
  for (const auto& [id, tokens] : run.tokens) emitted += std::ssize(tokens);
  EXPECT_EQ(run.progress.tokens_generated, emitted);
  EXPECT_GT(sum.accepted, emitted) << "the workload is meant to chunk prompts and retract";
}

// Hooks that feed the requests one every other plan and can stop the loop after a number of
// steps; they count what the loop calls.
class FeedAndStop final : public ServingHooks {
 public:
  FeedAndStop(Scheduler& scheduler, int64_t stop_after_steps)
      : scheduler_(scheduler), requests_(loop_requests()), stop_after_(stop_after_steps) {}

  bool requests_to_come() const override { return next_ < requests_.size(); }
  bool before_plan() override {
    if (after_steps == stop_after_) return false;
    if (plans++ % 2 == 0 && requests_to_come()) scheduler_.submit(requests_[next_++], kVocab);
    return true;
  }
  void on_idle() override { ++idles; }
  void before_step(const StepPlanOut& plan) override {
    EXPECT_FALSE(plan.op.rows.empty() && plan.cache_ops.empty());
    EXPECT_EQ(before_steps++, after_steps) << "before_step twice without after_step";
  }
  void after_step(const ForwardOp&) override { ++after_steps; }

  int64_t plans = 0, idles = 0, before_steps = 0, after_steps = 0;

 private:
  Scheduler& scheduler_;
  std::vector<RequestSpec> requests_;
  size_t next_ = 0;
  int64_t stop_after_;
};

TEST(ServingLoop, HooksFeedArrivalsWhileTheSchedulerIsDoneAndRunOneStepAtATime) {
  const SchedulerConfig sc = loop_config();
  Scheduler scheduler(sc);
  RunAheadCpu backend(executor_config_for(sc));
  Executor executor(executor_config_for(sc), kVocab, backend);
  FeedAndStop hooks(scheduler, -1);
  const ServingProgress done = run_serving_loop(scheduler, executor, {.hooks = &hooks});
  // The scheduler starts empty: only requests_to_come keeps the loop from ending at once.
  EXPECT_EQ(scheduler.outcomes().size(), 14u);
  EXPECT_EQ(hooks.after_steps, done.steps_count);
  EXPECT_EQ(hooks.plans, done.steps_count + hooks.idles);
  EXPECT_EQ(backend.in_flight_max, 1) << "the loop ran ahead although it has hooks";
}

TEST(ServingLoop, HooksStopTheLoopWithTheHeldBackStepApplied) {
  const SchedulerConfig sc = loop_config();  // overlap on: each step is held back one plan
  Scheduler scheduler(sc);
  CpuBackend cpu(tiny_weights(), executor_config_for(sc));
  Executor executor(executor_config_for(sc), kVocab, cpu);
  FeedAndStop hooks(scheduler, 10);
  const ServingProgress done = run_serving_loop(scheduler, executor, {.hooks = &hooks});
  EXPECT_EQ(done.steps_count, 10);
  EXPECT_EQ(scheduler.steps_in_flight_count(), 0);
  EXPECT_FALSE(scheduler.done());
}

// A step that fails at submit leaves the scheduler as one step at a time does: the step before
// it collected and applied, the failed one planned and not applied.
TEST(ServingLoopRunAhead, AFailedSubmitLeavesTheSameSchedulerStateAsOneStepAtATime) {
  const SchedulerConfig sc = loop_config();
  const ExecutorConfig ec = executor_config_for(sc);
  constexpr int64_t kFailAt = 9;
  auto run = [&](bool run_ahead) {
    RunAheadCpu backend(ec);
    backend.fail_at_submit = kFailAt;
    Scheduler scheduler(sc);
    for (const RequestSpec& r : loop_requests()) scheduler.submit(r, kVocab);
    Executor executor(ec, kVocab, backend);
    EXPECT_THAT([&] { run_serving_loop(scheduler, executor, {.run_ahead = run_ahead}); },
                ::testing::ThrowsMessage<Error>(HasSubstr("planted failure")));
    EXPECT_EQ(executor.in_flight_count(), 0);
    std::map<RequestId, std::vector<int32_t>> generated;
    for (RequestId id = 1; id <= 14; ++id) generated[id] = scheduler.generated_of(id);
    return std::make_pair(generated, scheduler.steps_in_flight_count());
  };
  const auto expected = run(false);
  const auto actual = run(true);
  EXPECT_EQ(expected.first, actual.first);
  EXPECT_EQ(expected.second, actual.second);
  int64_t tokens = 0;
  for (const auto& [id, t] : expected.first) tokens += static_cast<int64_t>(t.size());
  EXPECT_GT(tokens, 0);
}

}  // namespace
}  // namespace ls
