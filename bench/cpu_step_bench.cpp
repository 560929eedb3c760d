// CPU reference step time for the `tiny` model: one decode step at batch 1 and 16, with every
// row holding a 64-token prompt, at tensor-parallel degrees 1 and 2 (the ranks simulated in one
// process: the figure is the cost of the simulation, not a speed-up). And the time to make a
// seeded model's fp32 weights (what `generate`, `sim` and `replay` wait for before a seeded named
// shape's first step), qwen3-0.6b's 0.6 G parameters, on one thread and on every core.
// Run: build/bench/lockstep_bench_cpu [--tp N] [Google Benchmark flags]
#include "core/cpu_backend.h"
#include "core/executor.h"
#include "core/model/safetensors.h"
#include "core/model/weights.h"

#include "core/check.h"
#include "core/host_threads.h"
#include "core/tensor_parallel.h"

#include <benchmark/benchmark.h>

#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

namespace {

constexpr int32_t kPromptTokens = 64;

void BM_CpuDecodeStep(benchmark::State& state) {
  const int32_t batch = static_cast<int32_t>(state.range(0));
  const int32_t tp_degree = static_cast<int32_t>(state.range(1));
  const ls::ModelWeights weights = ls::weights_from_seed(ls::model_config_named("tiny"), 1);
  ls::ExecutorConfig config;
  config.max_batch_rows = batch;
  config.context_length = 4096;
  config.page_size = 16;
  config.prefill_chunk_tokens = kPromptTokens * batch;
  const int32_t pages_per_row = config.table_width();
  config.pages_count = batch * pages_per_row + 1;
  ls::CpuBackend backend(weights, config, nullptr, false, nullptr, tp_degree);
  ls::Executor executor(config, weights.config.vocab_size, backend);

  ls::ForwardOp prefill;
  for (int32_t r = 0; r < batch; ++r) {
    ls::OpRow row{.kind = ls::RowKind::kPrefill, .request_id = static_cast<uint64_t>(r + 1),
                  .pool_row = r + 1, .input_length = kPromptTokens, .prefix_length = 0,
                  .prompt_length = kPromptTokens};
    for (int32_t p = 0; p < pages_per_row; ++p) row.refresh.pages.push_back(1 + r * pages_per_row + p);
    row.sampling = ls::SamplingParams{};
    prefill.rows.push_back(row);
    for (int32_t t = 0; t < kPromptTokens; ++t) prefill.prefill_token_ids.push_back((r * 31 + t * 7) % 512);
  }
  executor.step(prefill);
  ls::ForwardOp decode;
  for (int32_t r = 0; r < batch; ++r) {
    // Every iteration resumes from KV length kPromptTokens (the retraction-recovery path), so
    // each step attends over the same 65 positions however many iterations run.
    decode.rows.push_back({.kind = ls::RowKind::kDecode, .request_id = static_cast<uint64_t>(r + 1),
                           .pool_row = r + 1, .input_length = 1, .decode_override = 5,
                           .hist_token_length = kPromptTokens});
  }
  ls::StepResult result;  // reused, as the serving loop does: the step allocates nothing
  for (auto _ : state) {
    executor.step(decode, result);
    benchmark::DoNotOptimize(result.tokens.data());
  }
  state.SetItemsProcessed(state.iterations() * batch);
  state.counters["batch"] = batch;
  state.counters["tp"] = tp_degree;
}

void BM_WeightsFromSeed(benchmark::State& state) {
  const ls::ModelConfig config = ls::model_config_named("qwen3-0.6b");
  const auto threads = static_cast<int32_t>(state.range(0));
  for (auto _ : state) {
    const ls::ModelWeights weights = ls::weights_from_seed(config, 1, threads);
    benchmark::DoNotOptimize(weights.embedding.data());
  }
  state.SetItemsProcessed(state.iterations() * config.parameters_count());
  state.counters["threads"] = threads;
}

// The weight digest a recording's header carries and replay checks, over qwen3-0.6b's fp32
// weights (2.4 GB, made once): the stream form (one pass on one core, what format versions 3 and
// 4 recorded) and the blocks form (what recording writes now) on one thread and on every core.
void BM_WeightsDigest(benchmark::State& state) {
  static const ls::ModelWeights weights =
      ls::weights_from_seed(ls::model_config_named("qwen3-0.6b"), 1);
  const auto form = static_cast<ls::WeightsDigestForm>(state.range(0));
  const auto threads = static_cast<int32_t>(state.range(1));
  for (auto _ : state) benchmark::DoNotOptimize(weights.digest(form, threads));
  state.SetBytesProcessed(state.iterations() * weights.config.parameters_count() *
                          static_cast<int64_t>(sizeof(float)));
  state.SetLabel(std::string(ls::to_string(form)));
  state.counters["threads"] = threads;
}

// fp32 → bf16 of llama-1b's largest tensor (its 263 M-value embedding, random values), as a bf16
// device's upload converts every weight: on one thread, and on every core.
void BM_F32ToBf16(benchmark::State& state) {
  const auto threads = static_cast<int32_t>(state.range(0));
  std::vector<float> values(size_t{128256} * 2048);
  uint32_t bits = 1;
  for (float& v : values) {
    bits = bits * 1664525u + 1013904223u;
    v = static_cast<float>(bits >> 8) * 0x1p-24f - 0.5f;
  }
  std::vector<uint16_t> out(values.size());
  for (auto _ : state) {
    ls::f32_to_bf16(values, out, threads);
    benchmark::DoNotOptimize(out.data());
  }
  state.SetItemsProcessed(state.iterations() * static_cast<int64_t>(values.size()));
  state.counters["threads"] = threads;
}

// Takes `--tp N` (or --tp=N) out of argv: the degrees to run, 1 and 2 when it is absent.
std::vector<int64_t> take_tp_flag(int& argc, char** argv) {
  std::vector<int64_t> degrees = {1, 2};
  int kept = 1;
  for (int i = 1; i < argc; ++i) {
    const bool separate = std::strcmp(argv[i], "--tp") == 0;
    if (!separate && std::strncmp(argv[i], "--tp=", 5) != 0) {
      argv[kept++] = argv[i];
      continue;
    }
    const char* value = separate ? (i + 1 < argc ? argv[++i] : "") : argv[i] + 5;
    char* end = nullptr;
    const long degree = std::strtol(value, &end, 10);
    LS_REQUIRE(*value != '\0' && *end == '\0' && degree >= 1 && degree <= ls::kTpDegreeMax,
               "--tp '{}': expected a tensor-parallel degree in [1, {}]", value, ls::kTpDegreeMax);
    ls::make_tp_layout(ls::model_config_named("tiny"), static_cast<int32_t>(degree));  // refuse now
    degrees = {degree};
  }
  argc = kept;
  return degrees;
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<int64_t> degrees;
  try {
    degrees = take_tp_flag(argc, argv);
  } catch (const ls::Error& e) {
    std::fprintf(stderr, "lockstep_bench_cpu: %s\n", e.what());
    return 2;
  }
  benchmark::RegisterBenchmark("BM_CpuDecodeStep", BM_CpuDecodeStep)
      ->ArgsProduct({{1, 16}, degrees})
      ->ArgNames({"batch", "tp"})
      ->Unit(benchmark::kMicrosecond);
  auto* seeding = benchmark::RegisterBenchmark("BM_WeightsFromSeed", BM_WeightsFromSeed)->Arg(1);
  if (ls::host_cores() > 1) seeding->Arg(ls::host_cores());
  seeding->ArgName("threads")
      ->Iterations(1)
      ->Unit(benchmark::kSecond)
      ->UseRealTime();
  auto* digest = benchmark::RegisterBenchmark("BM_WeightsDigest", BM_WeightsDigest)
                     ->Args({static_cast<int64_t>(ls::WeightsDigestForm::kStream), 1})
                     ->Args({static_cast<int64_t>(ls::WeightsDigestForm::kBlocks), 1});
  if (ls::host_cores() > 1) {
    digest->Args({static_cast<int64_t>(ls::WeightsDigestForm::kBlocks), ls::host_cores()});
  }
  digest->ArgNames({"form", "threads"})->Unit(benchmark::kMillisecond)->UseRealTime();
  auto* bf16 = benchmark::RegisterBenchmark("BM_F32ToBf16", BM_F32ToBf16)->Arg(1);
  if (ls::host_cores() > 1) bf16->Arg(ls::host_cores());
  bf16->ArgName("threads")->Unit(benchmark::kMillisecond)->UseRealTime();
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 2;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
