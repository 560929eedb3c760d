#include "cli/model_options.h"

#include "backends/backend_factory.h"
#include "cli/number_flags.h"
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

namespace {

// --pages: 0 sizes the pool from L (or from memory), anything else is the pages_count limit.
std::string pages_error(std::string& text) {
  const LimitField& field = limit_field(&Limits::pages_count);
  const std::optional<int64_t> value = parse_int64(text);
  if (value && (*value == 0 || !limit_error(field, *value))) return "";
  return fmt::format("{} must be 0 or an integer in [{}, {}], got {}", field.name, field.min,
                     field.max, text);
}

}  // namespace

void add_model_options(CLI::App& app, ModelOptions& o) {
  app.add_option("--model", o.model,
                 fmt::format("Model: a named shape with random weights ({}) or a Hugging Face "
                             "directory holding config.json and *.safetensors",
                             fmt::join(model_config_names(), ", ")))
      ->capture_default_str();
  app.add_option("--weights-seed", o.weights_seed,
                 "Seed of the random weights of a named shape (platform-stable)")
      ->check(unsigned_64())
      ->capture_default_str();
  app.add_option("--backend", o.backend,
                 fmt::format("Backend that runs the model ({})", fmt::join(backend_names(), ", ")))
      ->check(backend_validator())
      ->capture_default_str();
  add_limit_option(app, o.executor.max_batch_rows, &Limits::max_batch_rows);
  add_limit_option(app, o.executor.context_length, &Limits::context_length);
  add_limit_option(app, o.executor.page_size, &Limits::page_size);
  app.add_option("--pages", o.pages_count,
                 fmt::format("{}; 0 = enough for every row to reach L",
                             limit_field(&Limits::pages_count).description))
      ->check(CLI::Validator(pages_error, fmt::format("0 or INT in [{} - {}]", kPagesCountMin,
                                                     kPagesCountMax)))
      ->capture_default_str();
  app.add_option("--kv-memory-fraction", o.kv_memory_fraction,
                 "--backend cuda with --pages 0: the fraction of the device memory left after "
                 "weights and workspaces that KV pages take")
      ->check(CLI::Range(0.01, 0.99))
      ->capture_default_str();
  add_limit_option(app, o.executor.verify_width, &Limits::verify_width);
  app.add_option("--drafter", o.drafter,
                 "Who proposes the W - 1 drafts: none (the last token repeated) or ngram (prompt "
                 "lookup over the request's tokens)")
      ->check(CLI::IsMember({std::string(kNoDrafterName), std::string("ngram")}))
      ->capture_default_str();
  app.add_option("--determinism", o.determinism, kDeterminismHelp)
      ->check(CLI::IsMember({std::string("default"), std::string("invariant")}))
      ->capture_default_str();
  app.add_option("--tp", o.tp_degree,
                 "Tensor-parallel degree N: the weights split the Megatron way over N ranks "
                 "(simulated in one process on the CPU reference; on CUDA one rank per GPU over "
                 "NCCL, Ring/Simple pinned; every rank on GPU 0 when the host has fewer than N); "
                 "the model's heads, kv heads and ffn size must divide by N")
      ->check(CLI::Range(1, kTpDegreeMax))
      ->capture_default_str();
  app.add_flag("--context-beyond-max-positions", o.context_beyond_max_positions,
               "Allow --context-length past the checkpoint's max_position_embeddings (warns: the "
               "model was not made for those positions)");
  add_limit_option(app, o.executor.prefill_chunk_tokens, &Limits::prefill_chunk_tokens);
  add_limit_option(app, o.executor.mamba_slots_count, &Limits::mamba_slots_count);
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
  // --mamba-slots 0 sizes the state pool for a model with Mamba layers: a working slot for every
  // batch row and no checkpoints, so the prefix cache is off (scheduler_config_for_model); more
  // slots than rows turn it on with the rest as its checkpoints.
  if (weights.config.has_recurrent_state()) {
    if (c.mamba_slots_count == 0) c.mamba_slots_count = c.max_batch_rows;
  } else {
    LS_REQUIRE(c.mamba_slots_count == 0, "--mamba-slots {}: model '{}' has no Mamba layers",
               c.mamba_slots_count, weights.config.name);
  }
  const int32_t pages_per_row = (c.context_length + c.page_size - 1) / c.page_size + 1;
  if (o.pages_count > 0) {
    c.pages_count = o.pages_count;
  } else if (const std::optional<int32_t> sized =
                 kv_pages_from_memory(BackendSpec{.name = o.backend,
                                                  .drafter = o.drafter,
                                                  .tp_degree = o.tp_degree,
                                                  .batch_invariant = o.determinism == "invariant"},
                                      weights.config, c, o.kv_memory_fraction)) {
    c.pages_count = *sized;
  } else {
    c.pages_count = c.max_batch_rows * pages_per_row + 1;
  }
  return weights;
}

}  // namespace ls::cli
