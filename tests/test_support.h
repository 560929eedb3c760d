// Builders shared by the executor tests: a tiny model on the CPU backend and forward-op rows.
#pragma once

#include "core/cpu_backend.h"
#include "core/executor.h"
#include "core/model/weights.h"

#include <memory>
#include <numeric>
#include <string>
#include <vector>

namespace ls::testing {

// A Backend that hands every required call to the CPU reference inside it: test doubles derive
// from it and override only what they change (running ahead, a planted bit). The optional calls
// keep Backend's defaults, as a plain CpuBackend user would see for the tiny model.
class CpuBackendWrapper : public Backend {
 public:
  CpuBackendWrapper(const ModelWeights& weights, const ExecutorConfig& config)
      : inner_(weights, config) {}
  std::string name() const override { return inner_.name(); }
  void apply_table_writes(const StepPlan& plan) override { inner_.apply_table_writes(plan); }
  void reset_lengths(const StepPlan& plan) override { inner_.reset_lengths(plan); }
  void fill_inputs(const StepPlan& plan) override { inner_.fill_inputs(plan); }
  void forward(const StepPlan& plan) override { inner_.forward(plan); }
  void poison_logits(std::span<const int32_t> rows, float value) override {
    inner_.poison_logits(rows, value);
  }
  void finish_step(const StepPlan& plan, StepResult& result) override {
    inner_.finish_step(plan, result);
  }
  void copy_pages(const CacheOp& op) override { inner_.copy_pages(op); }
  StateSnapshot read_state(std::span<const int32_t> pool_rows) const override {
    return inner_.read_state(pool_rows);
  }
  InputSnapshot read_inputs() const override { return inner_.read_inputs(); }

 protected:
  CpuBackend inner_;
};

inline ExecutorConfig small_config() {
  ExecutorConfig c;
  c.max_batch_rows = 8;
  c.context_length = 64;
  c.page_size = 4;
  c.pages_count = 200;
  c.verify_width = 1;
  c.prefill_chunk_tokens = 64;
  return c;
}

inline const ModelWeights& tiny_weights() {
  static const ModelWeights weights = weights_from_seed(model_config_named("tiny"), 7);
  return weights;
}

// `tiny` with layers wide enough (hidden 512, ffn 2048: 4 MiB a product) that the CPU reference's
// products take tokens in tiles (core/cpu_model.cpp kTiledLayerBytes); tiny's take one at a time.
inline const ModelWeights& tiled_weights() {
  static const ModelWeights weights = [] {
    ModelConfig c = model_config_named("tiny");
    c.name = "tiny-wide";
    c.hidden_size = 512, c.query_heads_count = 8, c.kv_heads_count = 4, c.head_dim = 64;
    c.ffn_size = 2048;
    return weights_from_seed(c, 7);
  }();
  return weights;
}

// The simulator's weights of `model` (tiny or tiny-hybrid), from the seed `lockstep sim` draws
// them from (cli/sim_command.cpp kSimWeightsSeed).
inline constexpr uint64_t kSimWeightsSeed = 0;
inline const ModelWeights& sim_weights(const std::string& model = "tiny") {
  static const ModelWeights tiny = weights_from_seed(model_config_named("tiny"), kSimWeightsSeed);
  static const ModelWeights hybrid =
      weights_from_seed(model_config_named("tiny-hybrid"), kSimWeightsSeed);
  return model == "tiny" ? tiny : hybrid;
}

// A CPU backend and executor over the shared tiny weights.
struct Harness {
  explicit Harness(ExecutorConfig c = small_config(), std::unique_ptr<Verifier> verifier = nullptr,
                   ExecutorOptions options = {.capture_logits = true},
                   const ModelWeights& weights = tiny_weights())
      : config(c),
        backend(weights, c, std::move(verifier)),
        executor(c, weights.config.vocab_size, backend, options) {}

  int32_t vcl(int32_t pool_row) const {
    const int32_t rows[] = {pool_row};
    return backend.read_state(rows).valid_cache_length[0];
  }

  ExecutorConfig config;
  CpuBackend backend;
  Executor executor;
};

// Pages first..first+count-1, handy for a row's table refresh.
inline std::vector<int32_t> pages_from(int32_t first, int32_t count) {
  std::vector<int32_t> pages(static_cast<size_t>(count));
  std::iota(pages.begin(), pages.end(), first);
  return pages;
}

inline OpRow prefill_row(RequestId id, int32_t pool_row, int32_t prefix, int32_t chunk,
                         int32_t prompt_length) {
  return OpRow{.kind = RowKind::kPrefill, .request_id = id, .pool_row = pool_row,
               .input_length = chunk, .prefix_length = prefix, .prompt_length = prompt_length};
}

inline OpRow decode_row(RequestId id, int32_t pool_row, int32_t width = 1) {
  return OpRow{.kind = RowKind::kDecode, .request_id = id, .pool_row = pool_row,
               .input_length = width};
}

// A deterministic prompt: ids spread over the vocabulary, different per request.
inline std::vector<int32_t> prompt_for(RequestId id, int32_t length, int32_t vocab = 512) {
  std::vector<int32_t> ids;
  for (int32_t t = 0; t < length; ++t) {
    ids.push_back(static_cast<int32_t>((id * 97 + static_cast<uint64_t>(t) * 31 + 5) % vocab));
  }
  return ids;
}

}  // namespace ls::testing
