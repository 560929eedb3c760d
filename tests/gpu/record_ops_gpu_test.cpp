// What a trace records, computed on the device (issue 12): the logits pass's digests and top-k
// pairs equal the CPU reference's (core/logits_digest.cpp) on the same (sanitised) logits bits,
// and recording leaves the guard's results unchanged — odd vocabularies (1, 7, 111, 500, one and
// two segments of 1024 and of 4096, llama's 128256, 600000), rows 1, 3, 17,
// values with ties, ±0, ±inf and NaN — and the CUDA backend's recorded step (digests, top-k, the
// rows' state after the commit) equals the same computed on the host from its captured logits and its state
// read after the step; running ahead with recording on gives the same bits as one step at a time,
// and the serving loop with a recorder runs ahead on CUDA.
#include "core/executor.h"
#include "core/logits_digest.h"
#include "core/scheduler.h"
#include "core/serving_loop.h"
#include "kernels/cuda_backend.h"
#include "kernels/logits_ops.h"
#include "tests/gpu/gpu_test_support.h"
#include "tests/test_support.h"
#include "trace/reader.h"
#include "trace/trace_observer.h"

#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <limits>
#include <random>
#include <string>

namespace ls {
namespace {

std::vector<float> odd_logits(int32_t rows, int32_t vocab, uint64_t seed) {
  std::mt19937_64 rng(seed);
  const float specials[] = {0.0f, -0.0f, 3.0f, -1e30f, 1e30f,
                            std::numeric_limits<float>::infinity(),
                            -std::numeric_limits<float>::infinity(),
                            std::numeric_limits<float>::quiet_NaN()};
  std::vector<float> v(static_cast<size_t>(rows) * vocab);
  std::normal_distribution<float> normal;
  for (float& x : v) {
    const uint64_t r = rng() % 100;
    x = r < 4 ? specials[rng() % 8] : r < 20 ? 3.0f : normal(rng);  // many ties at 3.0
  }
  return v;
}

// Runs the logits pass on `logits` (rows × vocab) with and without recording, twice each, and
// checks: the guard's outputs (sanitised logits, argmax, NaN flags, logprob sums) are the same
// bits either way, and every row's digest and top-k pairs equal the CPU reference's computed
// from the sanitised logits the pass left in device memory (what the sampler reads), bit for bit.
void expect_kernel_equals_reference(const std::vector<float>& logits, int32_t rows, int32_t vocab,
                                    const std::string& what) {
  const int32_t k = std::min(kTopLogitsCountMax, vocab);
  gpu_test::DeviceBuffer<uint8_t> workspace(kernels::logits_pass_workspace_bytes(rows, vocab));
  gpu_test::DeviceBuffer<uint64_t> digests(static_cast<size_t>(rows));
  gpu_test::DeviceBuffer<int32_t> top(static_cast<size_t>(rows) * kTopLogitsCountMax * 2);
  gpu_test::DeviceBuffer<int32_t> nan_flags(static_cast<size_t>(rows)), argmax(static_cast<size_t>(rows));
  gpu_test::DeviceBuffer<float> row_max(static_cast<size_t>(rows)), row_sum(static_cast<size_t>(rows));
  struct Guarded {
    std::vector<float> logits, row_max, row_sum;
    std::vector<int32_t> nan_flags, argmax;
    bool operator==(const Guarded& o) const {
      const auto same_bits = [](const std::vector<float>& x, const std::vector<float>& y) {
        return x.size() == y.size() && std::memcmp(x.data(), y.data(), x.size() * 4) == 0;
      };
      return same_bits(logits, o.logits) && same_bits(row_max, o.row_max) &&
             same_bits(row_sum, o.row_sum) && nan_flags == o.nan_flags && argmax == o.argmax;
    }
  };
  std::vector<Guarded> runs;
  for (int repeat = 0; repeat < 4; ++repeat) {
    const bool record = repeat % 2 == 1;
    gpu_test::DeviceBuffer<float> d_logits(logits);
    const kernels::LogitsPassArgs pass{.logits = d_logits.ptr, .rows = rows, .vocab = vocab,
                                       .workspace = workspace.ptr, .nan_flags = nan_flags.ptr,
                                       .argmax = argmax.ptr, .row_max = row_max.ptr,
                                       .row_sum = row_sum.ptr,
                                       .digests = record ? digests.ptr : nullptr,
                                       .top = record ? top.ptr : nullptr, .top_k = record ? k : 0};
    ASSERT_EQ(kernels::launch_logits_pass(pass, nullptr), cudaSuccess);
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    runs.push_back({d_logits.download(), row_max.download(), row_sum.download(),
                    nan_flags.download(), argmax.download()});
    ASSERT_TRUE(runs.back() == runs.front()) << what << " vocab " << vocab << " run " << repeat;
    if (!record) continue;
    const std::vector<float>& sanitised = runs.back().logits;
    const std::vector<uint64_t> got = digests.download();
    const std::vector<int32_t> pairs = top.download();
    for (int32_t r = 0; r < rows; ++r) {
      const std::span<const float> row(sanitised.data() + static_cast<size_t>(r) * vocab,
                                       static_cast<size_t>(vocab));
      ASSERT_EQ(got[r], logits_row_digest(row)) << what << " vocab " << vocab << " row " << r;
      std::vector<TopLogit> expected;
      append_top_logits(row, k, expected);
      for (int32_t j = 0; j < k; ++j) {
        const int32_t* pair = pairs.data() + (static_cast<size_t>(r) * kTopLogitsCountMax + j) * 2;
        uint32_t expected_bits = 0;
        std::memcpy(&expected_bits, &expected[j].logit, 4);
        ASSERT_EQ(pair[0], expected[j].id)
            << what << " vocab " << vocab << " row " << r << " rank " << j;
        ASSERT_EQ(static_cast<uint32_t>(pair[1]), expected_bits)
            << what << " vocab " << vocab << " row " << r << " rank " << j;
      }
    }
  }
}

class RecordKernel : public ::testing::TestWithParam<int32_t> {};

TEST_P(RecordKernel, DigestsAndTopKEqualTheCpuReferenceOnTheSameBits) {
  LS_SKIP_WITHOUT_DEVICE();
  const int32_t vocab = GetParam();
  for (const int32_t rows : {1, 3, 17}) {
    expect_kernel_equals_reference(odd_logits(rows, vocab, 1000 + rows), rows, vocab, "odd");
  }
}

INSTANTIATE_TEST_SUITE_P(OddVocabularies, RecordKernel,
                         ::testing::Values(1, 7, 111, 500, 1024, 1025, 4096, 4097, 8193, 128256, 600000));

// Rows built against the kernel's threshold: every logit equal (each key passes: the general
// path), ±0 only, NaN only, −inf only, fewer numbers than k among NaNs, the k best in one chunk
// with ties at the k-th, many ties at the k-th spread over chunks, +inf ties, plain normal logits
// (the threshold path on its usual input), and all logits rising or falling with the id.
std::vector<float> adversarial_logits(int32_t pattern, int32_t rows, int32_t vocab, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal;
  const float inf = std::numeric_limits<float>::infinity();
  const float nan = std::numeric_limits<float>::quiet_NaN();
  std::vector<float> v(static_cast<size_t>(rows) * vocab);
  for (int32_t r = 0; r < rows; ++r) {
    float* x = v.data() + static_cast<size_t>(r) * vocab;
    const auto at = [&]() { return static_cast<int32_t>(rng() % static_cast<uint64_t>(vocab)); };
    for (int32_t i = 0; i < vocab; ++i) {
      switch (pattern) {
        case 0: x[i] = 1.5f; break;
        case 1: x[i] = (rng() & 1) ? 0.0f : -0.0f; break;
        case 2: x[i] = nan; break;
        case 3: x[i] = -inf; break;
        case 4: x[i] = nan; break;
        case 5: case 6: case 7: case 8: x[i] = normal(rng); break;
        case 9: x[i] = static_cast<float>(i % 4096); break;
        default: x[i] = -static_cast<float>(i % 4096); break;
      }
    }
    if (pattern == 4) {
      for (int j = 0; j < 3; ++j) x[at()] = normal(rng);  // fewer numbers than k
    }
    if (pattern == 5) {  // the k best in one chunk, 20 equal at the k-th
      const int32_t base = (vocab / 2) / kernels::kLogitsSegment * kernels::kLogitsSegment;
      for (int32_t j = 0; j < 25 && base + j < vocab; ++j) x[base + j] = j < 5 ? 20.0f + static_cast<float>(j) : 10.0f;
    }
    if (pattern == 6) {  // 5 above, then 60 equal at the k-th, spread over the row
      for (int j = 0; j < 60; ++j) x[at()] = 10.0f;
      for (int j = 0; j < 5; ++j) x[at()] = 11.0f + static_cast<float>(j);
    }
    if (pattern == 7) {  // +inf ties and a NaN or two
      for (int j = 0; j < 20; ++j) x[at()] = inf;
      for (int j = 0; j < 2; ++j) x[at()] = nan;
    }
  }
  return v;
}

class RecordKernelAdversarial : public ::testing::TestWithParam<int32_t> {};

TEST_P(RecordKernelAdversarial, TiesNansAndTheThresholdEqualTheCpuReference) {
  LS_SKIP_WITHOUT_DEVICE();
  const int32_t vocab = GetParam();
  for (int32_t pattern = 0; pattern <= 10; ++pattern) {
    expect_kernel_equals_reference(adversarial_logits(pattern, 3, vocab, 77 + pattern), 3, vocab,
                                   "pattern " + std::to_string(pattern));
  }
}

INSTANTIATE_TEST_SUITE_P(Vocabularies, RecordKernelAdversarial,
                         ::testing::Values(7, 1025, 8193, 128256, 600000));

ExecutorConfig record_config() {
  ExecutorConfig c;
  c.max_batch_rows = 8;
  c.context_length = 128;
  c.page_size = 16;
  c.prefill_chunk_tokens = 128;
  c.pages_count = 8 * c.table_width() + 2;
  return c;
}

std::vector<ForwardOp> record_script(const ExecutorConfig& c) {
  std::vector<ForwardOp> ops(1);
  for (int32_t i = 0; i < 6; ++i) {
    const RequestId id = static_cast<RequestId>(i + 1);
    const int32_t length = 3 + i * 5;
    OpRow row = testing::prefill_row(id, i + 1, 0, length, length);
    row.refresh = {0, testing::pages_from(1 + i * c.table_width(), c.table_width())};
    row.sampling = i % 2 == 0 ? SamplingParams{}
                              : SamplingParams{.temperature = 0.9f, .top_k = 30, .seed = id};
    ops[0].rows.push_back(row);
    const std::vector<int32_t> prompt = testing::prompt_for(id, length, 512);
    ops[0].prefill_token_ids.insert(ops[0].prefill_token_ids.end(), prompt.begin(), prompt.end());
  }
  ForwardOp decode;
  for (int32_t i = 0; i < 6; ++i) decode.rows.push_back(testing::decode_row(static_cast<RequestId>(i + 1), i + 1));
  for (int s = 0; s < 12; ++s) ops.push_back(decode);
  return ops;
}

TEST(CudaRecord, AStepsRecordEqualsItsCapturedLogitsAndStateAndRunsAhead) {
  LS_SKIP_WITHOUT_DEVICE();
  const ExecutorConfig c = record_config();
  const std::vector<ForwardOp> ops = record_script(c);
  const ExecutorOptions capture{.capture_logits = true, .record = true, .top_logits_count = 8};
  const ExecutorOptions record{.record = true, .top_logits_count = 8};
  std::vector<StepResult> one_at_a_time;
  {
    CudaBackend backend(testing::tiny_weights(), c, CudaBackendOptions{.graphs = true});
    Executor executor(c, 512, backend, capture);
    for (const ForwardOp& op : ops) {
      StepResult r = executor.step(op);
      const int32_t bs = static_cast<int32_t>(r.accepted_lengths.size());
      const int32_t rows = r.prefill_rows_count + (bs - r.prefill_rows_count) * r.verify_width;
      ASSERT_EQ(r.logits_digests.size(), static_cast<size_t>(rows));
      ASSERT_EQ(r.top_logits.size(), static_cast<size_t>(rows) * 8);
      std::vector<TopLogit> top;
      for (int32_t i = 0; i < rows; ++i) {
        const std::span<const float> row(r.logits.data() + static_cast<size_t>(i) * 512, 512);
        ASSERT_EQ(r.logits_digests[i], logits_row_digest(row)) << "logits row " << i;
        append_top_logits(row, 8, top);
      }
      ASSERT_EQ(top, r.top_logits);
      const StateSnapshot after = backend.read_state(pool_rows_of(op));
      ASSERT_EQ(r.state, after);
      r.logits.clear();
      one_at_a_time.push_back(std::move(r));
    }
  }
  CudaBackend backend(testing::tiny_weights(), c, CudaBackendOptions{.graphs = true});
  Executor executor(c, 512, backend, record);
  std::vector<StepResult> ahead;
  for (const ForwardOp& op : ops) {
    executor.submit(op);
    if (executor.in_flight_count() == Executor::kInFlightMax) ahead.push_back(executor.collect());
  }
  while (executor.in_flight_count() > 0) ahead.push_back(executor.collect());
  ASSERT_EQ(ahead.size(), one_at_a_time.size());
  for (size_t k = 0; k < ahead.size(); ++k) {
    EXPECT_EQ(ahead[k].tokens, one_at_a_time[k].tokens) << "step " << k;
    EXPECT_EQ(ahead[k].logits_digests, one_at_a_time[k].logits_digests) << "step " << k;
    EXPECT_EQ(ahead[k].top_logits, one_at_a_time[k].top_logits) << "step " << k;
    EXPECT_EQ(ahead[k].state, one_at_a_time[k].state) << "step " << k;
  }
  std::printf("cuda record: %zu steps, digests, top-8 and state equal the host's from captured "
              "logits, and running ahead equals one step at a time\n", ahead.size());
}

// Sees whether a step was in flight when the previous one's output was recorded.
class InFlightProbe final : public StepObserver {
 public:
  InFlightProbe(StepObserver& inner, const Executor& executor) : inner_(inner), executor_(executor) {}
  void on_step_input(int64_t step, const ForwardOp& op, const std::vector<CacheOp>& cache_ops,
                     const StepFaults& faults) override {
    inner_.on_step_input(step, op, cache_ops, faults);
  }
  void on_step_output(int64_t step, const ForwardOp& op, const StepResult& result,
                      const StateSnapshot& state) override {
    in_flight_max = std::max(in_flight_max, executor_.in_flight_count());
    inner_.on_step_output(step, op, result, state);
  }
  void on_scheduler_events(int64_t step, const std::vector<SchedulerEvent>& events) override {
    inner_.on_scheduler_events(step, events);
  }
  int32_t in_flight_max = 0;

 private:
  StepObserver& inner_;
  const Executor& executor_;
};

TEST(CudaRecord, TheServingLoopRunsAheadWithTheRecorderOn) {
  LS_SKIP_WITHOUT_DEVICE();
  SchedulerConfig sc{{.max_batch_rows = 8, .context_length = 128, .page_size = 16,
                      .pages_count = 200, .verify_width = 1, .prefill_chunk_tokens = 64,
                      .host_pages_count = 0}};
  const ExecutorConfig ec = executor_config_for(sc);
  Scheduler scheduler(sc);
  for (int32_t i = 0; i < 8; ++i) {
    RequestSpec r{.id = static_cast<RequestId>(i + 1), .prompt = testing::prompt_for(i + 1, 5 + i, 512),
                  .max_new_tokens = 24};
    scheduler.submit(r, 512);
  }
  CudaBackend cuda(testing::tiny_weights(), ec, CudaBackendOptions{.graphs = true});
  Executor executor(ec, 512, cuda, trace::recording_executor_options());
  const std::filesystem::path path = std::filesystem::temp_directory_path() / "lockstep_cuda_record_ahead.trace";
  auto recorder = trace::Recorder::open(
      path, trace::make_trace_header(testing::tiny_weights(), WeightSource{WeightSource::Kind::kSeed, 7, ""},
                                     ec, "cuda"));
  trace::TraceObserver observer(*recorder);
  InFlightProbe probe(observer, executor);
  const ServingProgress done = run_serving_loop(scheduler, executor, ServingLoopOptions{.observer = &probe});
  recorder->close();
  EXPECT_EQ(probe.in_flight_max, 1) << "the loop never had a step in flight while recording";
  const trace::TraceSummary summary = trace::verify_trace(path);
  EXPECT_EQ(summary.complete_steps, done.steps_count);
  EXPECT_TRUE(summary.has_footer);
  std::filesystem::remove(path);
  std::printf("cuda record: the serving loop ran %ld steps ahead with the recorder on (a step in "
              "flight at each recorded output)\n", static_cast<long>(done.steps_count));
}

}  // namespace
}  // namespace ls
