#include "cli/generate_command.h"

#include "cli/model_options.h"
#include "core/check.h"
#include "core/cpu_backend.h"
#include "core/executor.h"
#include "core/prompts.h"
#include "core/simple_batcher.h"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <chrono>
#include <fstream>
#include <iostream>
#include <memory>

namespace ls::cli {

namespace {

struct GenerateOptions {
  ModelOptions model;
  std::string prompts;
  std::string output = "-";
  bool quiet = false;
};

std::vector<GenerationRequest> read_prompts(const GenerateOptions& o, const ModelConfig& model) {
  const int32_t context = o.model.executor.context_length;
  if (o.prompts == "-") return parse_prompts_jsonl(std::cin, "<stdin>", model.vocab_size, context);
  std::ifstream in(o.prompts);
  LS_REQUIRE(in.good(), "cannot open prompts file '{}'", o.prompts);
  return parse_prompts_jsonl(in, o.prompts, model.vocab_size, context);
}

void write_outputs(std::ostream& out, const std::vector<GenerationOutput>& outputs) {
  for (const GenerationOutput& g : outputs) {
    nlohmann::json line = {{"id", g.id},
                           {"prompt_tokens", g.prompt_tokens},
                           {"tokens", g.tokens},
                           {"finish_reason", std::string(to_string(g.finish_reason))}};
    out << line.dump() << '\n';
  }
}

int run_generate(GenerateOptions& o) {
  WeightSource source;
  const ModelWeights weights = load_model(o.model, source);
  const std::vector<GenerationRequest> requests = read_prompts(o, weights.config);
  CpuBackend backend(weights, o.model.executor);
  Executor executor(o.model.executor, weights.config.vocab_size, backend);
  const auto start = std::chrono::steady_clock::now();
  const auto on_step = [&](const BatcherProgress& p) {
    if (o.quiet || p.steps_count % 64 != 0) return;
    fmt::print(stderr, "\rgenerate: step {}, {}/{} requests finished, {} tokens", p.steps_count,
               p.finished_count, p.requests_count, p.tokens_generated);
  };
  const std::vector<GenerationOutput> outputs = run_simple_batcher(executor, requests, on_step);
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  if (o.output == "-") {
    write_outputs(std::cout, outputs);
  } else {
    std::ofstream out(o.output);
    LS_REQUIRE(out.good(), "cannot write output file '{}'", o.output);
    write_outputs(out, outputs);
  }
  int64_t tokens = 0;
  for (const GenerationOutput& g : outputs) tokens += static_cast<int64_t>(g.tokens.size());
  if (!o.quiet) {
    fmt::print(stderr, "\rgenerate: {} requests, {} tokens in {} steps on {} ({}, {:.3f} s)\n",
               outputs.size(), tokens, executor.stats().steps_count, backend.name(),
               weights.config.name, seconds);
  }
  return 0;
}

}  // namespace

std::function<int()> add_generate_command(CLI::App& app) {
  auto options = std::make_shared<GenerateOptions>();
  CLI::App* cmd = app.add_subcommand(
      "generate", "Generate tokens for a JSONL file of prompts (token ids) and print JSONL outputs");
  cmd->footer(
      "Prompt lines: {\"id\": 1, \"prompt\": [1, 2, 3], \"max_new_tokens\": 16, \"temperature\": "
      "0.8,\n  \"top_k\": 40, \"top_p\": 0.95, \"min_p\": 0.0, \"seed\": 7, \"stop\": [2]} — only "
      "\"prompt\" is required;\n  temperature 0 (the default) is greedy.\nOutput lines: {\"id\", "
      "\"prompt_tokens\", \"tokens\", \"finish_reason\": length|stop|context|numerical_error}.");
  cmd->add_option("--prompts", options->prompts, "JSONL file of prompts ('-' for stdin)")
      ->required();
  cmd->add_option("--output,-o", options->output, "Where to write the JSONL outputs ('-' = stdout)")
      ->capture_default_str();
  cmd->add_flag("--quiet,-q", options->quiet, "No progress or summary on stderr");
  add_model_options(*cmd, options->model);
  return [cmd, options]() { return cmd->parsed() ? run_generate(*options) : -1; };
}

}  // namespace ls::cli
