// The lockstep half of the Hugging Face oracle, shared by the CPU test (tests/hf_families_test.cpp)
// and the GPU check (tests/gpu/hf_oracle_check.cpp): reads a fixture's hf_reference.json (written
// by tests/hf_fixtures.py from the saved checkpoint as transformers reads it back), runs its
// prompts greedily through the production path (Scheduler + Executor + serving loop) on a backend,
// and measures the agreement: tokens position by position, and the first-step logits as
// ‖Δ‖/‖ref‖ per prompt (the largest over prompts is the figure).
#pragma once

#include "core/check.h"
#include "core/executor.h"
#include "core/model/weights.h"
#include "core/scheduler.h"
#include "core/serving_loop.h"
#include "tests/gpu/backend_test_support.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

namespace ls::hf_oracle {

constexpr double kTokensAgreementMin = 0.95;
// fp32 on both sides; what differs is the order of sums.
constexpr double kFp32LogitsTolerance = 1e-4;

struct Reference {
  std::vector<std::vector<int32_t>> prompts;
  std::vector<std::vector<int32_t>> tokens;
  std::vector<std::vector<float>> first_logits;
  nlohmann::json meta;
};

inline Reference read_reference(const std::filesystem::path& path) {
  std::ifstream in(path);
  LS_REQUIRE(in.good(), "cannot open {}", path.string());
  const nlohmann::json j = nlohmann::json::parse(in);
  Reference r;
  r.prompts = j.at("prompts").get<std::vector<std::vector<int32_t>>>();
  r.tokens = j.at("tokens").get<std::vector<std::vector<int32_t>>>();
  r.first_logits = j.at("first_logits").get<std::vector<std::vector<float>>>();
  LS_REQUIRE(!r.prompts.empty() && r.prompts.size() == r.tokens.size() &&
                 r.prompts.size() == r.first_logits.size(),
             "{}: prompts, tokens and first_logits are empty or differ in length", path.string());
  r.meta = {{"family", j.value("family", "")},
            {"torch", j.value("torch", "")},
            {"transformers", j.value("transformers", "")},
            {"dtype", j.value("dtype", "")},
            {"device", j.value("device", "")},
            {"seed", j.value("seed", 0)},
            {"computed_from", j.value("computed_from", "")}};
  return r;
}

// Limits that hold every prompt and its tokens in one request's context (prompts up to 700
// tokens, 24 new ones): L = 1024 = the fixtures' max_position_embeddings, prefill chunked at 256.
inline SchedulerConfig scheduler_config_for(const Reference& ref) {
  SchedulerConfig sc;
  sc.max_batch_rows = static_cast<int32_t>(ref.prompts.size());
  sc.prefill_chunk_tokens = 256;
  sc.page_size = 16;
  sc.context_length = 1024;
  sc.pages_count = sc.max_batch_rows * (sc.context_length / sc.page_size + 1) + 2;
  return sc;
}

struct Result {
  int64_t tokens_equal = 0;
  int64_t tokens_total = 0;
  int32_t sequences_equal = 0;
  int32_t sequences_total = 0;
  int32_t first_mismatch_prompt = -1;
  int32_t first_mismatch_step = -1;
  double logits_relative_error_max = 0;
  double logits_abs_error_max = 0;
  double lockstep_logits_norm_min = 0;  // non-degenerate outputs: > 0
  std::vector<std::vector<int32_t>> tokens;        // [prompt] what lockstep generated
  std::vector<std::vector<float>> first_logits;    // [prompt] lockstep's first-step logits

  double agreement() const {
    return static_cast<double>(tokens_equal) / static_cast<double>(std::max<int64_t>(tokens_total, 1));
  }
  bool passes(double tolerance) const {
    return agreement() >= kTokensAgreementMin && logits_relative_error_max <= tolerance;
  }
};

inline void compare_prompt(const Reference& ref, size_t i, Result& out) {
  const std::vector<int32_t>& got = out.tokens[i];
  const std::vector<int32_t>& want = ref.tokens[i];
  for (size_t t = 0; t < want.size(); ++t) {
    const bool equal = t < got.size() && got[t] == want[t];
    out.tokens_equal += equal;
    if (!equal && out.first_mismatch_prompt < 0) {
      out.first_mismatch_prompt = static_cast<int32_t>(i);
      out.first_mismatch_step = static_cast<int32_t>(t);
    }
  }
  out.tokens_total += static_cast<int64_t>(want.size());
  out.sequences_equal += got == want;
  const std::vector<float>& mine = out.first_logits[i];
  const std::vector<float>& theirs = ref.first_logits[i];
  LS_REQUIRE(mine.size() == theirs.size(), "prompt {}: {} logits against {}", i, mine.size(),
             theirs.size());
  double diff = 0, base = 0, own = 0;
  for (size_t k = 0; k < mine.size(); ++k) {
    const double d = double{mine[k]} - theirs[k];
    diff += d * d;
    base += double{theirs[k]} * theirs[k];
    own += double{mine[k]} * mine[k];
    out.logits_abs_error_max = std::max(out.logits_abs_error_max, std::abs(d));
  }
  LS_REQUIRE(base > 0, "prompt {}: HF's first-step logits are all zero", i);
  out.logits_relative_error_max = std::max(out.logits_relative_error_max, std::sqrt(diff / base));
  const double own_norm = std::sqrt(own);
  out.lockstep_logits_norm_min = i == 0 ? own_norm : std::min(out.lockstep_logits_norm_min, own_norm);
}

// For a model with Mamba layers (issue 19): a working state slot per batch row, the prefix cache
// off (SchedulerConfig::recurrent_state).
inline SchedulerConfig scheduler_config_for(const Reference& ref, const ModelConfig& model) {
  SchedulerConfig sc = scheduler_config_for(ref);
  if (model.has_recurrent_state()) sc.mamba_slots_count = sc.max_batch_rows;
  return scheduler_config_for_model(sc, model);
}

inline Result run(Backend& backend, const ModelWeights& weights, const Reference& ref) {
  const int32_t vocab = weights.config.vocab_size;
  const SchedulerConfig sc = scheduler_config_for(ref, weights.config);
  Scheduler scheduler(sc);
  for (size_t i = 0; i < ref.prompts.size(); ++i) {
    RequestSpec r;
    r.id = static_cast<RequestId>(i + 1);
    r.prompt = ref.prompts[i];
    r.max_new_tokens = static_cast<int32_t>(ref.tokens[i].size());
    scheduler.submit(r, vocab);
  }
  Executor executor(executor_config_for(sc), vocab, backend,
                    ExecutorOptions{.capture_logits = true});
  gpu_test::FirstLogits observer(vocab);
  run_serving_loop(scheduler, executor, ServingLoopOptions{.observer = &observer});
  Result out;
  out.sequences_total = static_cast<int32_t>(ref.prompts.size());
  for (size_t i = 0; i < ref.prompts.size(); ++i) {
    const RequestId id = static_cast<RequestId>(i + 1);
    out.tokens.push_back(scheduler.outcomes().at(id).tokens);
    out.first_logits.push_back(observer.logits.at(id));
    compare_prompt(ref, i, out);
  }
  return out;
}

}  // namespace ls::hf_oracle
