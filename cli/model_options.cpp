#include "cli/model_options.h"

#include "cli/backend_factory.h"
#include "core/check.h"
#include "core/drafter.h"
#include "core/tensor_parallel.h"

#include <fmt/ranges.h>

#include <filesystem>
#include <optional>

namespace ls::cli {

CLI::Validator backend_validator() {
  return CLI::Validator([](std::string& name) { return backend_name_error(name); }, "BACKEND",
                        "backend");
}

void add_model_options(CLI::App& app, ModelOptions& o) {
  app.add_option("--model", o.model,
                 fmt::format("Model: a named shape with random weights ({}) or a Hugging Face "
                             "directory holding config.json and *.safetensors",
                             fmt::join(model_config_names(), ", ")))
      ->capture_default_str();
  app.add_option("--weights-seed", o.weights_seed,
                 "Seed of the random weights of a named shape (platform-stable)")
      ->capture_default_str();
  app.add_option("--backend", o.backend,
                 fmt::format("Backend that runs the model ({})", fmt::join(backend_names(), ", ")))
      ->check(backend_validator())
      ->capture_default_str();
  app.add_option("--max-batch-rows", o.executor.max_batch_rows, "B: rows in one forward op")
      ->check(CLI::Range(1, 4096))
      ->capture_default_str();
  app.add_option("--context-length", o.executor.context_length,
                 "L: tokens a request may hold (prompt + generated)")
      ->check(CLI::Range(2, 1 << 24))
      ->capture_default_str();
  app.add_option("--page-size", o.executor.page_size, "P: tokens per KV page")
      ->check(CLI::Range(1, 4096))
      ->capture_default_str();
  app.add_option("--pages", o.pages_count,
                 "KV pages (page 0 is the dummy); 0 = enough for every row to reach L")
      ->check(CLI::Range(0, 1 << 26))
      ->capture_default_str();
  app.add_option("--kv-memory-fraction", o.kv_memory_fraction,
                 "--backend cuda with --pages 0: the fraction of the device memory left after "
                 "weights and workspaces that KV pages take")
      ->check(CLI::Range(0.01, 0.99))
      ->capture_default_str();
  app.add_option("--verify-width", o.executor.verify_width,
                 "W: decode input tokens per row (speculative decoding when > 1: the last token "
                 "and W - 1 drafts, verified in one step)")
      ->check(CLI::Range(1, 16))
      ->capture_default_str();
  app.add_option("--drafter", o.drafter,
                 "Who proposes the W - 1 drafts: none (the last token repeated) or ngram (prompt "
                 "lookup over the request's tokens)")
      ->check(CLI::IsMember({std::string(kNoDrafterName), std::string("ngram")}))
      ->capture_default_str();
  app.add_option("--tp", o.tp_degree,
                 "Tensor-parallel degree N: the weights split the Megatron way over N ranks "
                 "(simulated in one process on the CPU reference); the model's heads, kv heads "
                 "and ffn size must divide by N")
      ->check(CLI::Range(1, kTpDegreeMax))
      ->capture_default_str();
  app.add_flag("--context-beyond-max-positions", o.context_beyond_max_positions,
               "Allow --context-length past the checkpoint's max_position_embeddings (warns: the "
               "model was not made for those positions)");
  app.add_option("--prefill-chunk-tokens", o.executor.prefill_chunk_tokens,
                 "Prefill tokens in one step, summed over rows (longer prompts are chunked)")
      ->check(CLI::Range(1, 1 << 20))
      ->capture_default_str();
}

namespace {

ModelWeights load_weights(const ModelOptions& o, WeightSource& source) {
  // Anything at that path (a symlink loop or an unreadable entry too) is a directory to load:
  // load_hf_directory names what is wrong with it. error_code: no filesystem_error escapes.
  std::error_code error;
  const auto entry = std::filesystem::symlink_status(o.model, error);
  const auto names = model_config_names();
  const bool named = std::find(names.begin(), names.end(), o.model) != names.end();
  if (entry.type() != std::filesystem::file_type::not_found &&
      (!named || entry.type() == std::filesystem::file_type::directory)) {
    source = {WeightSource::Kind::kDirectory, 0, o.model};
    return load_hf_directory(o.model);
  }
  LS_REQUIRE(named, "--model '{}' is neither a named shape ({}) nor a directory", o.model,
             fmt::join(names, ", "));
  source = {WeightSource::Kind::kSeed, o.weights_seed, ""};
  return weights_from_seed(model_config_named(o.model), o.weights_seed);
}

}  // namespace

ModelWeights load_model(ModelOptions& o, WeightSource& source) {
  LS_REQUIRE(o.drafter == kNoDrafterName || o.executor.verify_width > 1,
             "--drafter {} proposes W - 1 drafts per step: it needs --verify-width 2 or more",
             o.drafter);
  ModelWeights weights = load_weights(o, source);
  make_tp_layout(weights.config, o.tp_degree);  // refuse a degree the model cannot shard, first
  ExecutorConfig& c = o.executor;
  check_context_length(weights.config, c.context_length, o.context_beyond_max_positions);
  if (weights.config.max_positions > 0 && c.context_length > weights.config.max_positions) {
    fmt::print(stderr, "lockstep: warning: --context-length {} exceeds the model's "
               "max_position_embeddings = {}; positions past it were never trained\n",
               c.context_length, weights.config.max_positions);
  }
  const int32_t pages_per_row = (c.context_length + c.page_size - 1) / c.page_size + 1;
  if (o.pages_count > 0) {
    c.pages_count = o.pages_count;
  } else if (const std::optional<int32_t> sized =
                 kv_pages_from_memory(o.backend, weights.config, c, o.kv_memory_fraction,
                                      o.drafter)) {
    c.pages_count = *sized;
  } else {
    c.pages_count = c.max_batch_rows * pages_per_row + 1;
  }
  return weights;
}

}  // namespace ls::cli
