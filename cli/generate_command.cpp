#include "cli/generate_command.h"

#include "backends/backend_factory.h"
#include "cli/model_options.h"
#include "cli/exit_status.h"
#include "cli/progress_line.h"
#include "core/check.h"
#include "core/executor.h"
#include "core/prompts.h"
#include "core/serving_loop.h"
#include "trace/trace_observer.h"

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
  std::string record;
  bool record_activations = false;  // --record-activations
  bool quiet = false;
};

std::vector<RequestSpec> read_prompts(const GenerateOptions& o, const ModelConfig& model) {
  const int32_t context = o.model.executor.context_length;
  if (o.prompts == "-") return parse_prompts_jsonl(std::cin, "<stdin>", model.vocab_size, context);
  std::ifstream in(o.prompts);
  LS_REQUIRE(in.good(), "cannot open prompts file '{}'", o.prompts);
  return parse_prompts_jsonl(in, o.prompts, model.vocab_size, context);
}

// One line per request, in the prompt file's order.
void write_outputs(std::ostream& out, const std::vector<RequestSpec>& requests,
                   const Scheduler& scheduler) {
  for (const RequestSpec& r : requests) {
    const RequestOutcome& outcome = scheduler.outcomes().at(r.id);
    nlohmann::json line = {{"id", r.id},
                           {"prompt_tokens", r.prompt.size()},
                           {"tokens", outcome.tokens},
                           {"finish_reason", std::string(to_string(outcome.reason))}};
    out << line.dump() << '\n';
  }
}

int run_generate(GenerateOptions& o) {
  LS_REQUIRE(!o.record_activations || !o.record.empty(),
             "--record-activations records into a trace: add --record FILE");
  prepare_backend_environment(o.model.backend, o.model.tp_degree);  // before CUDA starts
  WeightSource source;
  const auto loading = std::chrono::steady_clock::now();
  const ModelWeights weights = load_model(o.model, source);
  if (!o.quiet) {  // a large model's start takes seconds: say what they went on
    fmt::print(stderr, "generate: {} loaded in {:.3f} s ({})\n", weights.config.name,
               std::chrono::duration<double>(std::chrono::steady_clock::now() - loading).count(),
               source.kind == WeightSource::Kind::kSeed
                   ? fmt::format("random weights from seed {}", source.seed)
                   : source.directory);
  }
  const std::vector<RequestSpec> requests = read_prompts(o, weights.config);
  const ExecutorConfig& limits = o.model.executor;
  Scheduler scheduler(scheduler_config_for_model(limits, weights.config));
  for (const RequestSpec& r : requests) scheduler.submit(r, weights.config.vocab_size);
  const bool recording = !o.record.empty();
  // The digest the trace header records, beside the backend's start.
  std::shared_future<uint64_t> weights_digest;
  if (recording) weights_digest = weights.digest_in_background();
  // A recorded run's step stats carry the device's own times (CUDA events) where it has them.
  const std::unique_ptr<Backend> backend =
      make_backend(BackendSpec{.name = o.model.backend,
                               .drafter = o.model.drafter,
                               .tp_degree = o.model.tp_degree,
                               .batch_invariant = o.model.determinism == "invariant",
                               .time_steps = recording},
                   weights, limits);
  Executor executor(limits, weights.config.vocab_size, *backend,
                    recording ? trace::recording_executor_options(o.record_activations)
                              : ExecutorOptions{});
  std::unique_ptr<trace::Recorder> recorder;
  std::unique_ptr<trace::TraceObserver> observer;
  if (recording) {
    trace::TraceHeader header =
        trace::make_trace_header(weights, weights_digest.get(), source, limits, backend->name(),
                                 machine_info_for(backend->name()));
    header.drafter = o.model.drafter;  // what replay rebuilds
    header.determinism_mode =
        trace::determinism_mode_of(backend->name(), o.model.determinism == "invariant");
    header.activation_digests = o.record_activations;
    header.tp_degree = o.model.tp_degree;
    describe_collectives(o.model.backend, o.model.tp_degree, header);
    header.step_clock = "steady";
    header.device_timer = backend->name() == "cuda" ? "cuda-events" : "host-clock";
    recorder = trace::Recorder::open(o.record, header);
    observer = std::make_unique<trace::TraceObserver>(*recorder);
  }
  const auto start = std::chrono::steady_clock::now();
  const SteadyClock clock;
  ServingLoopOptions loop;
  loop.observer = observer.get();
  loop.clock = &clock;
  ProgressLine progress;
  loop.on_step = [&](const ServingProgress& p) {
    if (o.quiet || p.steps_count % 64 != 0) return;
    progress.show(fmt::format("generate: step {}, {}/{} requests finished, {} tokens",
                              p.steps_count, p.finished_count, requests.size(),
                              p.tokens_generated),
                  requests.empty() ? 1.0
                                   : static_cast<double>(p.finished_count) /
                                         static_cast<double>(requests.size()));
  };
  const ServingProgress done = run_serving_loop(scheduler, executor, loop);
  progress.finish(/*keep=*/false);
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  if (o.output == "-") {
    write_outputs(std::cout, requests, scheduler);
  } else {
    std::ofstream out(o.output);
    LS_REQUIRE(out.good(), "cannot write output file '{}'", o.output);
    write_outputs(out, requests, scheduler);
  }
  if (recorder) {
    recorder->close();
    if (!o.quiet) {
      fmt::print(stderr, "generate: recorded {} steps to {}\n", done.steps_count, o.record);
    }
  }
  if (!o.quiet) {
    std::string spec = limits.verify_width > 1
                           ? fmt::format(", W {}, drafter {}", limits.verify_width, o.model.drafter)
                           : std::string();
    if (o.model.tp_degree > 1) spec += fmt::format(", TP {}", o.model.tp_degree);
    fmt::print(stderr, "generate: {} requests, {} tokens in {} steps on {} ({}{}, {:.3f} s)\n",
               requests.size(), done.tokens_generated, done.steps_count, backend->name(),
               weights.config.name, spec, seconds);
  }
  return kExitOk;
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
      "\"prompt_tokens\", \"tokens\", \"finish_reason\": length|stop|context|numerical_error}.\n" +
      std::string(kExitStatusHelp));
  cmd->add_option("--prompts", options->prompts, "JSONL file of prompts ('-' for stdin)")
      ->required();
  cmd->add_option("--output,-o", options->output, "Where to write the JSONL outputs ('-' = stdout)")
      ->capture_default_str();
  cmd->add_option("--record", options->record,
                  "Record every step to this trace file (replay it with `lockstep replay`)");
  cmd->add_flag("--record-activations", options->record_activations,
                kRecordActivationsHelp);
  cmd->add_flag("--quiet,-q", options->quiet, "No progress or summary on stderr");
  add_model_options(*cmd, options->model);
  return [cmd, options]() { return cmd->parsed() ? run_generate(*options) : -1; };
}

}  // namespace ls::cli
