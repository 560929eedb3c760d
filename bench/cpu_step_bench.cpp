// CPU reference step time for the `tiny` model: one decode step at batch 1 and 16, with every
// row holding a 64-token prompt. Run: build/bench/lockstep_bench_cpu
#include "core/cpu_backend.h"
#include "core/executor.h"
#include "core/model/weights.h"

#include <benchmark/benchmark.h>

namespace {

constexpr int32_t kPromptTokens = 64;

void BM_CpuDecodeStep(benchmark::State& state) {
  const int32_t batch = static_cast<int32_t>(state.range(0));
  const ls::ModelWeights weights = ls::weights_from_seed(ls::model_config_named("tiny"), 1);
  ls::ExecutorConfig config;
  config.max_batch_rows = batch;
  config.context_length = 4096;
  config.page_size = 16;
  config.prefill_chunk_tokens = kPromptTokens * batch;
  const int32_t pages_per_row = config.table_width();
  config.pages_count = batch * pages_per_row + 1;
  ls::CpuBackend backend(weights, config);
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
}

}  // namespace

BENCHMARK(BM_CpuDecodeStep)->Arg(1)->Arg(16)->Unit(benchmark::kMicrosecond);
BENCHMARK_MAIN();
