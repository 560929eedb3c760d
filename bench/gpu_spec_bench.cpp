// Speculative decoding on the GPU (issue 7): the CUDA backend with the device n-gram drafter at
// W = 4 against plain decoding (W = 1), on llama-1b (random bf16 weights made on the device from a
// seed, as lockstep_gpu_bench does) with CUDA graphs, batch 1 and batch 16. The workload is
// repetitive — each prompt is a 256-token sequence S written twice — so prompt lookup proposes the
// copy S[0], S[1], … after the prompt; whether drafts are accepted depends on what the model
// emits. Random weights do not know how to copy, so the run reports what it measured: the mean
// accepted length per decode row per step, the fractions of emitted tokens that follow S and that
// repeat the previous token (random weights tend to settle on one token, which prompt lookup then
// predicts perfectly: a speed-up that says nothing about a real model's text), the step time,
// generated tokens/s, the speed-up of W = 4 over W = 1 in tokens/s, and the mean accepted length
// W = 4 needs to break even (its step time over W = 1's) — the figure that carries over.
//
//   lockstep_gpu_spec_bench OUT.json [--quick]
#include "bench/gpu_run_header.h"
#include "core/check.h"
#include "core/executor.h"
#include "kernels/cuda_backend.h"

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

namespace ls {
namespace {

using Clock = std::chrono::steady_clock;
using nlohmann::json;

constexpr uint64_t kWeightsSeed = 1234;
constexpr const char* kShape = "llama-1b";
constexpr int32_t kSequenceTokens = 256;           // S
constexpr int32_t kPromptTokens = 2 * kSequenceTokens;  // S S
constexpr int32_t kRowsMax = 16;
constexpr int32_t kPageSize = 16;
constexpr int32_t kPrefillChunk = 2048;
constexpr int32_t kContextLength = 1024;
constexpr int32_t kWarmupSteps = 4;
constexpr int32_t kSpecWidth = 4;
static_assert(kPromptTokens + (kWarmupSteps + 96) * kSpecWidth <= kContextLength,
              "the longest run stays below the context length");

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0.0 : v[v.size() / 2];
}

// S for one row: ids spread over the vocabulary by a multiplicative hash (no short repeats).
std::vector<int32_t> sequence_of(int32_t row, int32_t vocab) {
  std::vector<int32_t> s(static_cast<size_t>(kSequenceTokens));
  for (int32_t t = 0; t < kSequenceTokens; ++t) {
    const uint64_t h = (uint64_t(row + 1) * 0x9E3779B97F4A7C15ull) ^ (uint64_t(t) * 0xBF58476D1CE4E5B9ull);
    s[static_cast<size_t>(t)] = static_cast<int32_t>((h >> 17) % static_cast<uint64_t>(vocab));
  }
  return s;
}

ExecutorConfig spec_config(int32_t width) {
  ExecutorConfig c;
  c.max_batch_rows = kRowsMax;
  c.context_length = kContextLength;
  c.page_size = kPageSize;
  c.verify_width = width;
  c.prefill_chunk_tokens = kPrefillChunk;
  c.pages_count = kRowsMax * c.table_width() + 2;
  return c;
}

struct CaseFigures {
  int32_t batch = 0;
  int32_t width = 0;
  std::vector<double> step_seconds;
  int64_t accepted_sum = 0;      // tokens emitted over the timed steps
  int64_t row_steps = 0;         // decode rows × timed steps
  int64_t copied = 0;            // emitted tokens equal to S at their offset
  int64_t repeated = 0;          // emitted tokens equal to the row's previous token
  std::vector<std::vector<int32_t>> tokens;  // per row: every emitted token after the prompt
};

// Prefills rows 1..batch with S S (fresh requests), decodes kWarmupSteps untimed, then `steps`
// timed steps; counts accepted lengths and how many emitted tokens follow S.
CaseFigures run_case(Executor& executor, const ExecutorConfig& config, int32_t vocab,
                     int32_t batch, int32_t steps, RequestId first_id) {
  CaseFigures f;
  f.batch = batch;
  f.width = config.verify_width;
  f.tokens.resize(static_cast<size_t>(batch));
  std::vector<std::vector<int32_t>> sequences;
  for (int32_t r = 0; r < batch; ++r) sequences.push_back(sequence_of(r, vocab));
  const int32_t pages_per_row = config.table_width();
  auto record = [&](int32_t row, const std::vector<int32_t>& emitted, bool timed) {
    std::vector<int32_t>& all = f.tokens[static_cast<size_t>(row)];
    for (const int32_t token : emitted) {
      const size_t offset = all.size() % kSequenceTokens;  // a copy continues S from its start
      if (timed) {
        f.copied += token == sequences[static_cast<size_t>(row)][offset] ? 1 : 0;
        f.repeated += !all.empty() && token == all.back() ? 1 : 0;
      }
      all.push_back(token);
    }
  };
  // Prefill: kPrefillChunk / kPromptTokens whole prompts per step.
  for (int32_t row = 0; row < batch;) {
    ForwardOp op;
    for (int32_t budget = kPrefillChunk; row < batch && budget >= kPromptTokens; ++row) {
      OpRow r;
      r.kind = RowKind::kPrefill;
      r.request_id = first_id + static_cast<RequestId>(row);
      r.pool_row = row + 1;
      r.input_length = kPromptTokens;
      r.prompt_length = kPromptTokens;
      r.sampling = SamplingParams{};  // greedy
      for (int32_t p = 0; p < pages_per_row; ++p) r.refresh.pages.push_back(1 + row * pages_per_row + p);
      for (int32_t copy = 0; copy < 2; ++copy) {
        op.prefill_token_ids.insert(op.prefill_token_ids.end(), sequences[static_cast<size_t>(row)].begin(),
                                    sequences[static_cast<size_t>(row)].end());
      }
      op.rows.push_back(std::move(r));
      budget -= kPromptTokens;
    }
    const int32_t first_row = row - op.rows_count();
    const StepResult result = executor.step(op);
    for (int32_t i = 0; i < op.rows_count(); ++i) record(first_row + i, result.row_tokens(i), false);
  }
  ForwardOp decode;
  for (int32_t r = 0; r < batch; ++r) {
    OpRow row;
    row.kind = RowKind::kDecode;
    row.request_id = first_id + static_cast<RequestId>(r);
    row.pool_row = r + 1;
    row.input_length = config.verify_width;
    decode.rows.push_back(row);
  }
  StepResult result;  // every step's, into the same buffers: the timed step allocates nothing
  for (int32_t s = 0; s < kWarmupSteps + steps; ++s) {
    const bool timed = s >= kWarmupSteps;
    const auto begin = Clock::now();
    executor.step(decode, result);
    const double wall = std::chrono::duration<double>(Clock::now() - begin).count();
    for (int32_t r = 0; r < batch; ++r) {
      record(r, result.row_tokens(r), timed);
      if (timed) f.accepted_sum += result.accepted_lengths[static_cast<size_t>(r)];
    }
    if (timed) {
      f.step_seconds.push_back(wall);
      f.row_steps += batch;
    }
  }
  return f;
}

json figures_json(const CaseFigures& f) {
  double total = 0;
  for (const double s : f.step_seconds) total += s;
  const double mean_accepted = static_cast<double>(f.accepted_sum) / static_cast<double>(f.row_steps);
  const double tokens_per_s = static_cast<double>(f.accepted_sum) / total;
  const double copy_fraction = static_cast<double>(f.copied) / static_cast<double>(f.accepted_sum);
  const double repeat_fraction =
      static_cast<double>(f.repeated) / static_cast<double>(f.accepted_sum);
  std::printf("  batch %2d W %d%s: %.3f ms/step (median), mean accepted %.3f per row per step, "
              "%.0f tokens/s; of the emitted tokens %.1f%% follow S, %.1f%% repeat the previous "
              "token\n",
              f.batch, f.width, f.width > 1 ? " (ngram)" : "        ", median(f.step_seconds) * 1e3,
              mean_accepted, tokens_per_s, 100 * copy_fraction, 100 * repeat_fraction);
  return {{"batch", f.batch},
          {"verify_width", f.width},
          {"drafter", f.width > 1 ? "ngram" : "none"},
          {"steps", static_cast<int64_t>(f.step_seconds.size())},
          {"step_ms_median", median(f.step_seconds) * 1e3},
          {"step_ms_mean", total / static_cast<double>(f.step_seconds.size()) * 1e3},
          {"mean_accepted_per_row_step", mean_accepted},
          {"generated_tokens", f.accepted_sum},
          {"generated_tokens_per_s", tokens_per_s},
          {"copy_fraction", copy_fraction},
          {"repeat_fraction", repeat_fraction}};
}

// Rows whose first `count` emitted tokens agree between two runs (bf16: spec decoding is not
// bit-invariant there; the fp32 invariance is a GPU test).
int32_t rows_agreeing(const CaseFigures& a, const CaseFigures& b, size_t count) {
  int32_t equal = 0;
  for (size_t r = 0; r < a.tokens.size(); ++r) {
    const size_t n = std::min({count, a.tokens[r].size(), b.tokens[r].size()});
    equal += std::equal(a.tokens[r].begin(), a.tokens[r].begin() + static_cast<ptrdiff_t>(n),
                        b.tokens[r].begin()) ? 1 : 0;
  }
  return equal;
}

int run(const std::string& out_path, bool quick) {
  const int32_t steps = quick ? 24 : 64;
  const CudaMachineInfo machine = cuda_machine_info();
  ls::bench::print_machine(machine);
  const ModelConfig model = model_config_named(kShape);
  std::printf("%s (random bf16 weights, seed %lu), CUDA graphs; prompts S S with |S| = %d; %d timed "
              "decode steps after %d\n",
              kShape, static_cast<unsigned long>(kWeightsSeed), kSequenceTokens, steps, kWarmupSteps);
  json out = ls::bench::run_json(
      machine, quick ? "lockstep_gpu_spec_bench --quick" : "lockstep_gpu_spec_bench");
  out.update({{"shape", kShape},
              {"weights_seed", kWeightsSeed},
              {"graphs", true},
              {"prompt", "a 256-token sequence S twice (S S); greedy"},
              {"context_length", kContextLength},
              {"cases", json::array()},
              {"speedups", json::array()}});
  std::vector<CaseFigures> plain, spec;
  for (const int32_t width : {1, kSpecWidth}) {
    const ExecutorConfig config = spec_config(width);
    CudaBackendOptions options{.graphs = true};
    options.drafter = width > 1 ? "ngram" : "none";
    CudaBackend backend(DeviceSeededWeights{model, kWeightsSeed}, config, options);
    Executor executor(config, model.vocab_size, backend);
    RequestId next_id = 1;
    for (const int32_t batch : {1, 16}) {
      CaseFigures f = run_case(executor, config, model.vocab_size, batch, steps, next_id);
      next_id += static_cast<RequestId>(batch);
      out["cases"].push_back(figures_json(f));
      (width == 1 ? plain : spec).push_back(std::move(f));
    }
  }
  for (size_t i = 0; i < plain.size(); ++i) {
    const json& a = out["cases"][i];
    const json& b = out["cases"][i + plain.size()];
    const double speedup = b["generated_tokens_per_s"].get<double>() / a["generated_tokens_per_s"].get<double>();
    const double break_even = b["step_ms_median"].get<double>() / a["step_ms_median"].get<double>();
    const int32_t agree = rows_agreeing(plain[i], spec[i], 32);
    std::printf("batch %2d: W %d over W 1: %.2fx tokens/s; a W %d step costs %.2fx a W 1 step, so it "
                "breaks even at a mean accepted length of %.2f; first 32 tokens equal in %d of %d "
                "rows (bf16)\n",
                plain[i].batch, kSpecWidth, speedup, kSpecWidth, break_even, break_even, agree,
                plain[i].batch);
    out["speedups"].push_back({{"batch", plain[i].batch},
                               {"speedup_tokens_per_s", speedup},
                               {"step_time_ratio", break_even},
                               {"break_even_mean_accepted", break_even},
                               {"rows_first_32_tokens_equal", agree}});
  }
  std::ofstream(out_path) << out.dump(2) << "\n";
  return 0;
}

}  // namespace
}  // namespace ls

int main(int argc, char** argv) {
  std::string out_path;
  bool quick = false;
  CLI::App app{"Speculative decoding on the GPU: W = 4 with the device n-gram drafter against W = 1",
               "lockstep_gpu_spec_bench"};
  app.add_option("out", out_path, "Where the figures go (JSON)")->required();
  app.add_flag("--quick", quick, "Fewer timed steps");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : 2;
  }
  try {
    return ls::run(out_path, quick);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "lockstep_gpu_spec_bench: %s\n", e.what());
    return 1;
  }
}
