// Running ahead on the CUDA backend (issue 6): the same ops submitted with step k+1 enqueued before
// step k is collected give bit-identical tokens, accepted lengths, flags, logprobs and device state
// to Executor::step one at a time — on `tiny` in fp32 with graphs (32 prompts, greedy and sampled
// rows, prefill and decode steps both pipelined), through the serving loop (run ahead on and off),
// with step timing on (its figures sane), with the profile on (which cannot run ahead, so the
// executor completes each step at submit), and on llama-1b-sized device-seeded bf16 weights at
// batch 64. A wrong parity (step k+1's results copied over the buffer step k is unpacked from, a
// staging buffer rewritten before its copy ran, an event waited on for the wrong step) shows up
// as tokens that differ from the one-step-at-a-time run.
#include "core/executor.h"
#include "core/scheduler.h"
#include "core/serving_loop.h"
#include "kernels/cuda_backend.h"
#include "tests/gpu/backend_test_support.h"
#include "tests/gpu/gpu_test_support.h"
#include "tests/test_support.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <set>
#include <vector>

namespace ls {
namespace {

constexpr int32_t kPageSize = 16;

ExecutorConfig pipelined_config(int32_t rows, int32_t chunk_tokens) {
  ExecutorConfig c;
  c.max_batch_rows = rows;
  c.context_length = 256;
  c.page_size = kPageSize;
  c.verify_width = 1;
  c.prefill_chunk_tokens = chunk_tokens;
  c.pages_count = rows * c.table_width() + 2;  // every row its own full table
  return c;
}

// Prefill ops for `count` requests on pool rows 1..count (prompt lengths 1 .. length_max, whole
// prompts packed under the chunk budget; odd ids greedy, even ids sampled), then `decode_steps`
// decode steps of every row.
std::vector<ForwardOp> script(const ExecutorConfig& c, int32_t count, int32_t length_max,
                              int32_t decode_steps, int32_t vocab) {
  const int32_t pages_per_row = c.table_width();
  std::vector<ForwardOp> ops(1);
  int32_t budget = c.prefill_chunk_tokens;
  for (int32_t i = 0; i < count; ++i) {
    const RequestId id = static_cast<RequestId>(i + 1);
    const int32_t length = 1 + (i * 13 + 5) % length_max;
    if (length > budget || ops.back().rows_count() == c.max_batch_rows) {
      ops.emplace_back();
      budget = c.prefill_chunk_tokens;
    }
    budget -= length;
    OpRow row = testing::prefill_row(id, i + 1, 0, length, length);
    row.refresh = {0, testing::pages_from(1 + i * pages_per_row, pages_per_row)};
    row.sampling = id % 2 == 1 ? SamplingParams{}
                               : SamplingParams{.temperature = 0.8f, .top_k = 40, .seed = id * 7};
    ops.back().rows.push_back(std::move(row));
    const std::vector<int32_t> prompt = testing::prompt_for(id, length, vocab);
    ops.back().prefill_token_ids.insert(ops.back().prefill_token_ids.end(), prompt.begin(),
                                        prompt.end());
  }
  ForwardOp decode;
  for (int32_t i = 0; i < count; ++i) {
    decode.rows.push_back(testing::decode_row(static_cast<RequestId>(i + 1), i + 1));
  }
  for (int32_t s = 0; s < decode_steps; ++s) ops.push_back(decode);
  return ops;
}

struct DriveRun {
  std::vector<StepResult> results;
  StateSnapshot state;
  std::vector<CudaStepTiming> timings;  // per collected step
};

// Every op through one executor: one step at a time, or step k+1 submitted before step k is
// collected.
DriveRun drive(CudaBackend& backend, const ExecutorConfig& c, int32_t vocab,
          const std::vector<ForwardOp>& ops, bool pipelined) {
  Executor executor(c, vocab, backend, ExecutorOptions{.want_logprobs = true});
  DriveRun run;
  auto collect = [&] {
    run.results.push_back(executor.collect());
    run.timings.push_back(backend.last_step_timing());
  };
  for (const ForwardOp& op : ops) {
    executor.submit(op);
    if (!pipelined || executor.in_flight_count() == Executor::kInFlightMax) collect();
  }
  while (executor.in_flight_count() > 0) collect();
  std::vector<int32_t> rows;
  for (int32_t r = 0; r < c.pool_rows_count(); ++r) rows.push_back(r);
  run.state = backend.read_state(rows);
  return run;
}

// Bit for bit, step by step; returns the number of distinct tokens (the oracle is not degenerate).
size_t expect_identical(const DriveRun& expected, const DriveRun& actual, const char* what) {
  EXPECT_EQ(expected.results.size(), actual.results.size()) << what;
  std::set<int32_t> distinct;
  for (size_t k = 0; k < std::min(expected.results.size(), actual.results.size()); ++k) {
    const StepResult& a = expected.results[k];
    const StepResult& b = actual.results[k];
    EXPECT_EQ(a.tokens, b.tokens) << what << ", step " << k;
    EXPECT_EQ(a.accepted_lengths, b.accepted_lengths) << what << ", step " << k;
    EXPECT_EQ(a.nan_flags, b.nan_flags) << what << ", step " << k;
    EXPECT_EQ(a.oov_flags, b.oov_flags) << what << ", step " << k;
    EXPECT_EQ(a.mode, b.mode) << what << ", step " << k;
    EXPECT_EQ(a.logprobs.size(), b.logprobs.size()) << what << ", step " << k;
    if (a.logprobs.size() == b.logprobs.size()) {
      const size_t bytes = a.logprobs.size() * sizeof(float);
      EXPECT_EQ(std::memcmp(a.logprobs.data(), b.logprobs.data(), bytes), 0)
          << what << ", step " << k << ": logprob bits differ";
    }
    distinct.insert(a.tokens.begin(), a.tokens.end());
  }
  EXPECT_EQ(expected.state.valid_cache_length, actual.state.valid_cache_length) << what;
  EXPECT_EQ(expected.state.future_inputs, actual.state.future_inputs) << what;
  EXPECT_EQ(expected.state.table, actual.state.table) << what;
  return distinct.size();
}

constexpr int32_t kTinyVocab = 512;

TEST(CudaPipelined, TinyFp32GraphsThirtyTwoPromptsEqualOneStepAtATime) {
  LS_SKIP_WITHOUT_DEVICE();
  const ExecutorConfig c = pipelined_config(32, 256);
  const std::vector<ForwardOp> ops = script(c, 32, 40, 48, kTinyVocab);
  const CudaBackendOptions options{.precision = CudaPrecision::kFp32, .graphs = true};
  DriveRun expected;
  {
    CudaBackend backend(testing::tiny_weights(), c, options);
    expected = drive(backend, c, kTinyVocab, ops, false);
    EXPECT_GT(backend.graph_replays_count(), 0);
  }
  ASSERT_EQ(expected.results.size(), ops.size());
  {
    CudaBackend backend(testing::tiny_weights(), c, options);
    ASSERT_TRUE(backend.can_run_ahead());
    const size_t distinct = expect_identical(expected, drive(backend, c, kTinyVocab, ops, true),
                                             "tiny fp32 graphs, pipelined");
    EXPECT_GT(distinct, 32u) << "the tokens are degenerate";
    std::printf("tiny fp32 graphs: %zu steps pipelined, %zu distinct tokens, identical to one step "
                "at a time\n",
                ops.size(), distinct);
  }
  {
    // Eager steps too (no graphs): the tail's launches and the staging copy run from the host.
    CudaBackendOptions eager = options;
    eager.graphs = false;
    CudaBackend one(testing::tiny_weights(), c, eager);
    const DriveRun sync = drive(one, c, kTinyVocab, ops, false);
    CudaBackend two(testing::tiny_weights(), c, eager);
    expect_identical(sync, drive(two, c, kTinyVocab, ops, true), "tiny fp32 eager, pipelined");
  }
}

// Step timing on: the device's busy time per step is positive, and its idle time before every
// step but the first is measured and not negative. The tokens do not change.
TEST(CudaPipelined, StepTimingIsMeasuredAndChangesNothing) {
  LS_SKIP_WITHOUT_DEVICE();
  const ExecutorConfig c = pipelined_config(32, 256);
  const std::vector<ForwardOp> ops = script(c, 32, 40, 24, kTinyVocab);
  CudaBackend plain(testing::tiny_weights(), c, CudaBackendOptions{.graphs = true});
  const DriveRun expected = drive(plain, c, kTinyVocab, ops, true);
  for (const CudaStepTiming& t : expected.timings) {
    EXPECT_TRUE(std::isnan(t.busy_ms) && std::isnan(t.idle_before_ms)) << "timed without asking";
  }
  CudaBackend timed(testing::tiny_weights(), c,
                    CudaBackendOptions{.graphs = true, .time_steps = true});
  const DriveRun run = drive(timed, c, kTinyVocab, ops, true);
  expect_identical(expected, run, "tiny bf16 graphs, pipelined, step timing on");
  ASSERT_EQ(run.timings.size(), ops.size());
  EXPECT_TRUE(std::isnan(run.timings[0].idle_before_ms));
  double idle_sum = 0;
  for (size_t k = 0; k < run.timings.size(); ++k) {
    EXPECT_GT(run.timings[k].busy_ms, 0.0) << "step " << k;
    if (k > 0) {
      EXPECT_GE(run.timings[k].idle_before_ms, 0.0) << "step " << k;
      idle_sum += run.timings[k].idle_before_ms;
    }
  }
  std::printf("tiny bf16 graphs, pipelined: device idle between steps %.1f us on average\n",
              1e3 * idle_sum / static_cast<double>(run.timings.size() - 1));
}

// A profiling backend cannot run ahead: the executor completes each step at submit, and a caller
// that pipelines gets the same results.
TEST(CudaPipelined, ProfilingBackendCompletesEachStepAtSubmit) {
  LS_SKIP_WITHOUT_DEVICE();
  const ExecutorConfig c = pipelined_config(16, 256);
  const std::vector<ForwardOp> ops = script(c, 16, 40, 16, kTinyVocab);
  const CudaBackendOptions profile{.graphs = true, .profile = true};
  CudaBackend one(testing::tiny_weights(), c, profile);
  EXPECT_FALSE(one.can_run_ahead());
  const DriveRun expected = drive(one, c, kTinyVocab, ops, false);
  CudaBackend two(testing::tiny_weights(), c, profile);
  expect_identical(expected, drive(two, c, kTinyVocab, ops, true), "tiny bf16 profile, pipelined");
  EXPECT_TRUE(!two.phase_times().available || two.phase_times().steps > 0);
}

// The serving loop with run ahead on and off: the same tokens (greedy and sampled requests; pages
// for about half of what the requests need at once, so that some are retracted and swapped).
TEST(CudaPipelined, ServingLoopRunAheadGivesTheSameTokens) {
  LS_SKIP_WITHOUT_DEVICE();
  SchedulerConfig sc;
  sc.max_batch_rows = 16;
  sc.prefill_chunk_tokens = 96;
  sc.page_size = 16;
  sc.pages_count = 60;
  sc.host_pages_count = 200;
  sc.context_length = 256;
  std::vector<RequestSpec> requests = gpu_test::greedy_requests(32, 40, 48, kTinyVocab, 5);
  for (RequestSpec& r : requests) {
    if (r.id % 3 == 0) r.sampling = {.temperature = 0.9f, .top_p = 0.9f, .seed = r.id};
  }
  const ExecutorConfig ec = executor_config_for(sc);
  auto run = [&](bool run_ahead) {
    CudaBackend backend(testing::tiny_weights(), ec, CudaBackendOptions{.graphs = true});
    Scheduler scheduler(sc);
    for (const RequestSpec& r : requests) scheduler.submit(r, kTinyVocab);
    Executor executor(ec, kTinyVocab, backend);
    const ServingProgress p = run_serving_loop(scheduler, executor, {.run_ahead = run_ahead});
    gpu_test::Outcomes out;
    for (const auto& [id, outcome] : scheduler.outcomes()) out[id] = outcome.tokens;
    EXPECT_EQ(out.size(), requests.size());
    return std::make_pair(out, p.steps_count);
  };
  const auto off = run(false);
  const auto on = run(true);
  EXPECT_EQ(off.first, on.first);
  EXPECT_EQ(off.second, on.second);
  int64_t tokens = 0;
  for (const auto& [id, t] : off.first) tokens += static_cast<int64_t>(t.size());
  EXPECT_GT(tokens, 32 * 40);
}

// llama-1b's shape, bf16 weights seeded on the device, graphs, batch 64: the production setting
// the benchmark runs pipelined.
TEST(CudaPipelined, Llama1bBatch64DecodeEqualsOneStepAtATime) {
  LS_SKIP_WITHOUT_DEVICE();
  const ModelConfig model = model_config_named("llama-1b");
  const ExecutorConfig c = pipelined_config(64, 2048);
  const std::vector<ForwardOp> ops = script(c, 64, 100, 24, model.vocab_size);
  const CudaBackendOptions options{.graphs = true};
  DriveRun expected;
  {
    CudaBackend backend(DeviceSeededWeights{model, 1234}, c, options);
    expected = drive(backend, c, model.vocab_size, ops, false);
  }
  CudaBackend backend(DeviceSeededWeights{model, 1234}, c, options);
  const size_t distinct = expect_identical(expected, drive(backend, c, model.vocab_size, ops, true),
                                           "llama-1b bf16 graphs batch 64, pipelined");
  // Random weights of this size repeat a token per request: distinct across requests suffices.
  EXPECT_GE(distinct, 32u) << "the tokens are degenerate";
}

}  // namespace
}  // namespace ls
