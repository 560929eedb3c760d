// Tensor parallelism on CUDA (issue 18, kernels/tp_cuda_backend.h), at TP 2 on two placements:
// both ranks on device 0 (lockstep's shared-device collectives, kernels/tp_collectives.h) and, on
// a host with two GPUs, one rank per GPU (NCCL, Ring/Simple pinned). Claims:
//  - TP 2 equals TP 1 within a stated tolerance with every greedy token equal (fp32 mode, where
//    only the order of sums differs), on device-seeded random weights and on an HF fixture (Qwen3:
//    per-head norms, tied embeddings, so the LM head shard comes from the embedding's rows);
//  - bf16 TP 2 is bit-identical run to run (logits and tokens, sampled rows included) and close
//    to bf16 TP 1;
//  - a trace recorded at TP 2 on CUDA replays bit-identical at TP 2, graphs on and off (and one
//    recorded on two GPUs, over NCCL, also with both ranks on one);
//  - an IDLE step issues the busy step's collectives with no elements (the CPU reference's calls).
// Its own binary (lockstep_gpu_tp_tests): ranks sharing a GPU need every CUDA module loaded
// eagerly, which the first line below asks for before CUDA starts.
#include "core/cpu_backend.h"
#include "core/executor.h"
#include "core/model/weights.h"
#include "core/serving_loop.h"
#include "kernels/cuda_backend.h"
#include "kernels/tp_cuda_backend.h"
#include "replay/replay.h"
#include "tests/gpu/gpu_test_support.h"
#include "tests/test_support.h"
#include "tests/tp_workload.h"
#include "trace/recorder.h"
#include "trace/trace_observer.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <functional>
#include <memory>
#include <string>

namespace {
// Before any CUDA call of this process (static initialisation runs before main): see
// kernels/tp_cuda_backend.h's prepare_tp_environment.
const int kEagerModules = (ls::prepare_tp_environment(), 0);
}  // namespace

namespace ls {
namespace {

using testing::decode_row;
using testing::pages_from;
using testing::prefill_row;
using testing::prompt_for;

// fp32 TP 2 vs TP 1 (the o and down partial sums re-associated, the GEMMs of other shapes): over
// each logits row, max |Δlogit| / max |logit| below this, and every greedy token equal.
constexpr double kFp32Tolerance = 1e-4;
// bf16: the partial sums' rounding differences pass through bf16 activations.
constexpr double kBf16Tolerance = 5e-2;

enum class Placement { kOneGpu, kTwoGpus };

std::string placement_name(const ::testing::TestParamInfo<Placement>& info) {
  return info.param == Placement::kOneGpu ? "BothRanksOnDevice0" : "OneRankPerGpu";
}

int device_count() {
  int count = 0;
  return cudaGetDeviceCount(&count) == cudaSuccess ? count : 0;
}

class CudaTp : public ::testing::TestWithParam<Placement> {
 protected:
  void SetUp() override {
    ASSERT_EQ(kEagerModules, 0);
    if (!gpu_test::have_device()) GTEST_SKIP() << "no CUDA device";
    if (GetParam() == Placement::kTwoGpus && device_count() < 2) {
      GTEST_SKIP() << "one rank per GPU needs two GPUs; this host has " << device_count();
    }
  }
  std::vector<int32_t> devices() const {
    return GetParam() == Placement::kOneGpu ? std::vector<int32_t>{0, 0} : std::vector<int32_t>{0, 1};
  }
};

// An HF fixture of tests/fixtures/hf: under $LOCKSTEP_SOURCE_DIR when set, else under the working
// directory when it is a checkout (the device machine runs in one), else where this was built.
ModelWeights hf_fixture(const std::string& family) {
  const std::string tail = "/tests/fixtures/hf/" + family;
  const char* root = std::getenv("LOCKSTEP_SOURCE_DIR");
  if (root != nullptr) return load_hf_directory(root + tail);
  if (std::filesystem::exists("." + tail)) return load_hf_directory("." + tail);
  return load_hf_directory(LOCKSTEP_SOURCE_DIR + tail);
}

// --- a fixed workload, as the CPU reference's TP test runs it --------------------------------

using testing::bit_identical;
using testing::compare_tp_runs;
using testing::kTpWorkloadDecodeSteps;
using testing::TpWorkloadRun;

ExecutorConfig workload_config() {
  ExecutorConfig c = testing::small_config();
  c.max_batch_rows = 4;
  return c;
}

// tests/tp_workload.h's workload on `backend` (workload_config()'s limits).
TpWorkloadRun run_workload(Backend& backend, int32_t vocab, bool sampled) {
  return testing::run_tp_workload(backend, workload_config(), vocab, sampled);
}

using BackendFactory = std::function<std::unique_ptr<Backend>(int32_t degree, bool graphs)>;

// TP 2 twice (bit for bit) and against TP 1 (within `tolerance`, every greedy token equal when
// `greedy_equal`).
void expect_tp2_matches_tp1(const BackendFactory& make, int32_t vocab, double tolerance,
                            bool greedy_equal, const std::string& label) {
  const TpWorkloadRun tp1 = run_workload(*make(1, true), vocab, false);
  const TpWorkloadRun tp2 = run_workload(*make(2, true), vocab, false);
  const TpWorkloadRun tp2_again = run_workload(*make(2, true), vocab, false);
  EXPECT_TRUE(bit_identical(tp2, tp2_again)) << label << ": TP 2 differs run to run";
  const testing::TpAgreement a = compare_tp_runs(tp1, tp2, vocab);
  std::printf("%s: TP 2 vs TP 1: max relative logit difference %.3g (tolerance %.0e) over %zu of "
              "%zu steps, %ld/%ld greedy tokens equal, %ld logits differ in their bits\n",
              label.c_str(), a.relative_max, tolerance, a.steps_compared, tp1.logits.size(),
              static_cast<long>(a.tokens_equal), static_cast<long>(a.tokens_count),
              static_cast<long>(a.logits_differing));
  ASSERT_GT(a.norm, 0) << label;
  ASSERT_GE(a.steps_compared, 2u) << label << ": the prefill steps' inputs are fixed";
  EXPECT_LE(a.relative_max, tolerance) << label;
  if (greedy_equal) {
    EXPECT_EQ(a.steps_compared, tp1.logits.size()) << label;
    EXPECT_GE(a.tokens_count, 3 * kTpWorkloadDecodeSteps) << label;
    EXPECT_EQ(a.tokens_equal, a.tokens_count) << label;
  }
}

TEST_P(CudaTp, SeededWeightsFp32AtTp2AreWithinToleranceOfTp1AndGreedyTokensEqual) {
  const DeviceSeededWeights weights{model_config_named("tiny"), 7};
  const std::vector<int32_t> d = devices();
  const BackendFactory make = [&](int32_t degree, bool graphs) -> std::unique_ptr<Backend> {
    const CudaBackendOptions options{.precision = CudaPrecision::kFp32, .graphs = graphs};
    if (degree == 1) return std::make_unique<CudaBackend>(weights, workload_config(), options);
    return std::make_unique<TpCudaBackend>(weights, workload_config(), options, d);
  };
  expect_tp2_matches_tp1(make, weights.config.vocab_size, kFp32Tolerance, true,
                         "tiny seeded on the device, fp32");
}

TEST_P(CudaTp, HfQwen3FixtureFp32AtTp2IsWithinToleranceOfTp1AndGreedyTokensEqual) {
  const ModelWeights weights = hf_fixture("qwen3");
  const std::vector<int32_t> d = devices();
  const BackendFactory make = [&](int32_t degree, bool graphs) -> std::unique_ptr<Backend> {
    const CudaBackendOptions options{.precision = CudaPrecision::kFp32, .graphs = graphs};
    if (degree == 1) return std::make_unique<CudaBackend>(weights, workload_config(), options);
    return std::make_unique<TpCudaBackend>(weights, workload_config(), options, d);
  };
  expect_tp2_matches_tp1(make, weights.config.vocab_size, kFp32Tolerance, true,
                         "hf qwen3, fp32");
}

TEST_P(CudaTp, HfQwen2FixtureBf16AtTp2IsWithinToleranceOfTp1) {
  // Qwen2: q/k/v biases split with their weights' rows; untied LM head.
  const ModelWeights weights = hf_fixture("qwen2");
  const std::vector<int32_t> d = devices();
  const BackendFactory make = [&](int32_t degree, bool graphs) -> std::unique_ptr<Backend> {
    const CudaBackendOptions options{.graphs = graphs};
    if (degree == 1) return std::make_unique<CudaBackend>(weights, workload_config(), options);
    return std::make_unique<TpCudaBackend>(weights, workload_config(), options, d);
  };
  expect_tp2_matches_tp1(make, weights.config.vocab_size, kBf16Tolerance, false, "hf qwen2, bf16");
}

TEST_P(CudaTp, Bf16Tp2WithSampledRowsIsBitIdenticalRunToRunGraphsOnAndOff) {
  const DeviceSeededWeights weights{model_config_named("tiny"), 7};
  const int32_t vocab = weights.config.vocab_size;
  auto run = [&](bool graphs) {
    TpCudaBackend backend(weights, workload_config(), CudaBackendOptions{.graphs = graphs}, devices());
    return run_workload(backend, vocab, /*sampled=*/true);
  };
  const TpWorkloadRun graphs = run(true);
  EXPECT_TRUE(bit_identical(graphs, run(true))) << "graphs on: differs run to run";
  // A decode step gives the same bits eagerly and from its graph (the CUDA backend's promise at
  // TP 1, kept at TP 2: the collectives are the same calls in the same order).
  EXPECT_TRUE(bit_identical(graphs, run(false))) << "graphs off differs from graphs on";
}

// --- a trace recorded at TP 2 replays bit-identical at TP 2 ----------------------------------

std::vector<RequestSpec> mixed_requests(int32_t vocab) {
  std::vector<RequestSpec> out;
  for (int32_t i = 0; i < 24; ++i) {
    RequestSpec r;
    r.id = static_cast<RequestId>(i + 1);
    r.prompt = prompt_for(r.id, 5 + (i * 37) % 120, vocab);  // chunked under a 64 budget
    r.max_new_tokens = 12 + (i * 11) % 40;
    if (i % 3 == 1) r.sampling.temperature = 0.8f, r.sampling.top_k = 40;
    if (i % 3 == 2) r.sampling.temperature = 1.1f, r.sampling.top_p = 0.9f, r.sampling.seed = 100 + i;
    out.push_back(std::move(r));
  }
  return out;
}

TEST_P(CudaTp, ATraceRecordedAtTp2ReplaysBitIdenticalAtTp2GraphsOnAndOff) {
  const ModelWeights& weights = testing::tiny_weights();
  const int32_t vocab = weights.config.vocab_size;
  SchedulerConfig sc;
  sc.max_batch_rows = 8;
  sc.prefill_chunk_tokens = 64;
  sc.page_size = 16;
  sc.pages_count = 200;
  sc.context_length = 192;
  const ExecutorConfig ec = executor_config_for(sc);
  const std::filesystem::path path = std::filesystem::temp_directory_path() /
                                     (std::string("lockstep_cuda_tp2_") +
                                      placement_name({GetParam(), 0}) + ".trace");
  int64_t steps = 0;
  {
    TpCudaBackend backend(weights, ec, CudaBackendOptions{.graphs = true}, devices());
    Scheduler scheduler(sc);
    for (const RequestSpec& r : mixed_requests(vocab)) scheduler.submit(r, vocab);
    Executor executor(ec, vocab, backend, trace::recording_executor_options());
    trace::TraceHeader header = trace::make_trace_header(
        weights, WeightSource{WeightSource::Kind::kSeed, 7, ""}, ec, backend.name());
    header.tp_degree = 2;
    if (const auto& nccl = backend.nccl_pinning()) {
      header.nccl_version = nccl->version, header.nccl_algo = nccl->algo;
      header.nccl_proto = nccl->proto;
    }
    EXPECT_EQ(backend.nccl_pinning().has_value(), GetParam() == Placement::kTwoGpus);
    auto recorder = trace::Recorder::open(path, header);
    trace::TraceObserver observer(*recorder);
    steps = run_serving_loop(scheduler, executor, ServingLoopOptions{.observer = &observer}).steps_count;
    recorder->close();
    ASSERT_GE(steps, 50);
  }
  // Replayed where it was recorded, graphs on and off; a trace recorded on two GPUs (NCCL) also on
  // one (both ranks on device 0, lockstep's collectives): at TP 2 both sum two partials once.
  struct Replay {
    std::vector<int32_t> devices;
    bool graphs;
  };
  std::vector<Replay> replays = {{devices(), true}, {devices(), false}};
  if (GetParam() == Placement::kTwoGpus) replays.push_back({{0, 0}, true});
  for (const auto& [d, graphs] : replays) {
    replay::ReplayOptions options;
    options.mode = replay::ReplayMode::kExact;
    options.weights = &weights;
    options.make_backend = [graphs, d](const ModelWeights& w, const ExecutorConfig& c,
                                       const std::string& /*drafter: none*/,
                                       int32_t tp_degree) -> std::unique_ptr<Backend> {
      EXPECT_EQ(tp_degree, 2);
      return std::make_unique<TpCudaBackend>(w, c, CudaBackendOptions{.graphs = graphs}, d);
    };
    const replay::ReplayReport report = replay::replay_trace(path, options);
    EXPECT_EQ(report.tp_degree, 2);
    EXPECT_GE(report.steps_compared, steps);
    EXPECT_FALSE(report.divergence.has_value())
        << "devices " << d[0] << "," << d[1] << ", graphs " << graphs << ": diverged at step "
        << report.divergence->step << ", field " << report.divergence->field << ": expected "
        << report.divergence->expected << ", actual " << report.divergence->actual;
    std::printf("tp: exact replay at TP 2 on devices %d,%d (graphs %d) of %ld recorded steps: %s\n",
                d[0], d[1], graphs ? 1 : 0, static_cast<long>(steps),
                report.divergence ? "DIVERGED" : "IDENTICAL");
  }
  std::filesystem::remove(path);
}

// --- a model large enough for cuBLAS, the whole device's KV pool ------------------------------

// llama-1b's shapes (16 layers, vocab 128256) seeded on the device, KV pages from 90% of the free
// memory (tp_cuda_kv_sizing, as `lockstep_gpu_bench --tp 2` sizes them), 16 rows: the graphs'
// warm-ups at 16 tokens and the prefill run cuBLASLt products of their first shapes, thousands
// of launches per rank. Ranks sharing the GPU used to deadlock building this (a rank's host
// waiting for the device while its peer's barrier kernel spun for it, kernels/tp_collectives.cpp):
// the test hangs when that comes back (run it under `timeout`).
TEST_P(CudaTp, Llama1bShapesWithTheDevicesKvPoolBuildAndDecodeBitIdenticalGraphsOnAndOff) {
  const DeviceSeededWeights weights{model_config_named("llama-1b"), 7};
  const int32_t vocab = weights.config.vocab_size;
  constexpr int32_t kRows = 16;
  constexpr int32_t kPrompt = 100;
  ExecutorConfig config;
  config.max_batch_rows = kRows;
  config.context_length = 160;
  config.page_size = 16;
  config.verify_width = 1;
  config.prefill_chunk_tokens = kRows * kPrompt;
  auto run = [&](bool graphs) {
    const CudaBackendOptions options{.graphs = graphs};
    ExecutorConfig c = config;
    c.pages_count = tp_cuda_kv_sizing(weights.config, c, options, devices()).pages_count;
    EXPECT_GE(c.pages_count, kRows * 10 + 1);
    TpCudaBackend backend(weights, c, options, devices());
    Executor executor(c, vocab, backend, {.capture_logits = true});
    TpWorkloadRun out;
    ForwardOp prefill;
    for (int32_t i = 0; i < kRows; ++i) {
      OpRow row = prefill_row(100 + i, 1 + i, 0, kPrompt, kPrompt);
      row.refresh = {0, pages_from(1 + 10 * i, 10)};
      row.sampling = SamplingParams{};
      if (i % 4 == 1) row.sampling->temperature = 0.8f, row.sampling->top_k = 40;
      prefill.rows.push_back(row);
      const std::vector<int32_t> prompt = prompt_for(100 + i, kPrompt, vocab);
      prefill.prefill_token_ids.insert(prefill.prefill_token_ids.end(), prompt.begin(), prompt.end());
    }
    const StepResult first = executor.step(prefill);
    out.logits.push_back(first.logits), out.tokens.push_back(first.tokens);
    for (int32_t step = 0; step < 6; ++step) {
      ForwardOp decode;
      for (int32_t i = 0; i < kRows; ++i) decode.rows.push_back(decode_row(100 + i, 1 + i));
      const StepResult r = executor.step(decode);
      EXPECT_EQ(r.tokens.size(), static_cast<size_t>(kRows)) << "decode step " << step;
      out.logits.push_back(r.logits), out.tokens.push_back(r.tokens);
    }
    if (graphs) {
      EXPECT_GT(backend.rank(0).graph_replays_count(), 0);
    }
    std::printf("llama-1b shapes at TP 2 (graphs %d): %d KV pages per rank, %zu steps\n",
                graphs ? 1 : 0, c.pages_count, out.tokens.size());
    return out;
  };
  const TpWorkloadRun with_graphs = run(true);
  EXPECT_TRUE(bit_identical(with_graphs, run(false))) << "graphs off differs from graphs on";
}

// --- the IDLE forward -------------------------------------------------------------------------

TEST_P(CudaTp, AnIdleStepIssuesTheBusyStepsCollectivesWithNoElementsAsTheCpuReferenceDoes) {
  const ExecutorConfig config = workload_config();
  const ModelWeights& weights = testing::tiny_weights();
  auto prefill = [] {
    ForwardOp op;
    op.rows.push_back(prefill_row(5, 1, 0, 6, 6));
    op.rows[0].refresh = {0, pages_from(1, 8)};
    op.rows[0].sampling = SamplingParams{};
    op.prefill_token_ids = prompt_for(5, 6);
    return op;
  };
  TpCudaBackend cuda(weights, config, CudaBackendOptions{.graphs = false}, devices());
  Executor on_cuda(config, weights.config.vocab_size, cuda);
  CpuBackend cpu(weights, config, nullptr, false, nullptr, 2);
  Executor on_cpu(config, weights.config.vocab_size, cpu);
  on_cuda.step(prefill());
  on_cpu.step(prefill());
  EXPECT_EQ(cuda.rank(0).collectives(), cpu.collectives()) << "the busy step's calls";
  EXPECT_EQ(cuda.rank(1).collectives(), cpu.collectives()) << "rank 1 issued other calls";
  ASSERT_EQ(cpu.collectives().size(), static_cast<size_t>(2 * weights.config.layers_count + 1));
  const StepResult idle = on_cuda.step(ForwardOp{});
  on_cpu.step(ForwardOp{});
  EXPECT_EQ(idle.mode, ForwardMode::kIdle);
  const std::vector<CollectiveCall> idle_calls = cuda.rank(0).collectives();
  EXPECT_EQ(idle_calls, cpu.collectives()) << "the IDLE step's calls";
  ASSERT_EQ(idle_calls.size(), static_cast<size_t>(2 * weights.config.layers_count + 1));
  for (const CollectiveCall& call : idle_calls) EXPECT_EQ(call.elements_count, 0);
  // Both groups still in step: a decode after the IDLE step runs (it would hang, or the ranks'
  // results differ, if the IDLE step had left one rank a collective behind).
  ForwardOp decode;
  decode.rows.push_back(decode_row(5, 1));
  const StepResult after = on_cuda.step(decode);
  EXPECT_EQ(after.tokens.size(), 1u);
}

INSTANTIATE_TEST_SUITE_P(Placements, CudaTp, ::testing::Values(Placement::kOneGpu, Placement::kTwoGpus),
                         placement_name);

TEST(CudaTpRefusals, AModelTheDegreeCannotShardIsRefusedByName) {
  if (!gpu_test::have_device()) GTEST_SKIP() << "no CUDA device";
  try {
    TpCudaBackend backend(DeviceSeededWeights{model_config_named("tiny"), 7}, workload_config(),
                          CudaBackendOptions{}, std::vector<int32_t>{0, 0, 0, 0});
    FAIL() << "TP 4 over tiny (2 kv heads) was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("kv heads (num_key_value_heads) = 2"), std::string::npos)
        << e.what();
  }
}

TEST(CudaTpRefusals, RanksSpreadOverSomeButNotAllDevicesAreRefused) {
  if (device_count() < 2) GTEST_SKIP() << "needs two GPUs";
  ModelConfig mha = model_config_named("tiny");
  mha.kv_heads_count = mha.query_heads_count;  // shards at 4
  try {
    TpCudaBackend backend(DeviceSeededWeights{mha, 7}, workload_config(), CudaBackendOptions{},
                          std::vector<int32_t>{0, 0, 1, 1});
    FAIL() << "two ranks on each of two GPUs was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("is neither"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace ls
