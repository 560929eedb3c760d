#include "cli/replay_command.h"

#include "backends/backend_factory.h"
#include "cli/model_options.h"
#include "cli/number_flags.h"
#include "cli/exit_status.h"
#include "cli/progress_line.h"
#include "core/check.h"
#include "core/tensor_parallel.h"
#include "replay/localise.h"
#include "replay/replay.h"
#include "trace/trace_observer.h"
#include "replay/replay_json.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <filesystem>
#include <limits>
#include <optional>
#include <fstream>
#include <memory>

namespace ls::cli {

namespace {

struct ReplayCliOptions {
  std::string trace;
  std::string mode = "exact";
  std::optional<int64_t> until;
  std::optional<RequestId> isolate;
  std::string weights_dir;
  std::string backend = "cpu";
  int32_t tp_degree = 0;  // 0: the recorded degree
  bool quiet = false;
  std::string json;  // the result as JSON (replay/replay_json.h)
  bool localise = false;        // --localise
  std::string localise_against;  // --localise-against BACKEND; "": the recorded digests or the
                                 // recording's backend
};

// The backend replay_options gives `name` ("cpu": the replay's own CPU reference).
std::function<std::unique_ptr<Backend>(const ModelWeights&, const ExecutorConfig&,
                                       const std::string&, int32_t)>
backend_maker(const std::string& name, bool batch_invariant) {
  if (name == "cpu") return nullptr;
  return [name, batch_invariant](const ModelWeights& weights, const ExecutorConfig& limits,
                                 const std::string& drafter, int32_t tp_degree) {
    return make_backend(BackendSpec{.name = name,
                                    .drafter = drafter,
                                    .tp_degree = tp_degree,
                                    .batch_invariant = batch_invariant},
                        weights, limits);
  };
}

// Whether the trace's run promised batch invariance (TraceHeader::determinism_mode): the replay
// then runs the same mode (CUDA: batch-invariant, whatever recorded it), and only then can
// --isolate reproduce one request alone.
bool recorded_batch_invariant(const trace::TraceHeader& h) {
  return h.determinism_mode == trace::kBatchInvariantMode;
}

// What --localise compares the replay with, decided from the flags and the trace's header before
// anything runs: the recorded digests (other empty) or a second replay on `other`. ls::Error
// naming the flags when they ask for what cannot be compared.
struct LocaliseSides {
  std::string other;                // "" : the recorded activation digests
  std::optional<double> tolerance;  // a cross-backend comparison's
};

void require_localise_flags(const ReplayCliOptions& o) {
  LS_REQUIRE(o.localise || o.localise_against.empty(),
             "--localise-against {} names the other side of --localise: add --localise",
             o.localise_against);
  LS_REQUIRE(!o.localise || !o.isolate, "--localise with --isolate {}: localisation re-runs the "
             "divergent step of the whole recorded batch; drop one of the two", *o.isolate);
}

// With --localise (require_localise_flags passed).
LocaliseSides localise_sides(const ReplayCliOptions& o, const trace::TraceHeader& h) {
  LocaliseSides sides;
  if (o.localise_against.empty() && h.activation_digests) {
    LS_REQUIRE(o.backend == h.backend,
               "--localise: the recorded activation digests are the {} backend's (its storage "
               "dtypes), which --backend {} cannot reproduce; replay with --backend {}, or compare "
               "with a second replay (--localise-against {}, --mode teacher-forced)",
               h.backend, o.backend, h.backend, h.backend);
    return sides;
  }
  sides.other = o.localise_against.empty() ? h.backend : o.localise_against;
  const std::string error = backend_name_error(sides.other);
  LS_REQUIRE(error.empty(), "--localise{}: the other side's backend {}: {}",
             o.localise_against.empty() ? " (the trace has no activation digests: a second "
                                          "replay on the recording's backend)"
                                        : "-against",
             sides.other, error);
  if (sides.other != o.backend) {
    LS_REQUIRE(o.mode == "teacher-forced",
               "--localise comparing --backend {} with a replay on {} needs --mode "
               "teacher-forced: the two agree only within a tolerance, and an exact replay of "
               "one backend's trace on the other diverges at once", o.backend, sides.other);
    sides.tolerance = replay::kCrossBackendTolerance;
  }
  return sides;
}

// The step --localise re-runs: the first divergent one (exact) or the first with a token unlike
// the recorded one (teacher-forced); none when the replay found nothing.
std::optional<int64_t> step_to_localise(const replay::ReplayReport& r, replay::ReplayMode mode) {
  if (mode == replay::ReplayMode::kExact) {
    if (!r.divergence || r.divergence->field == "rejected") return std::nullopt;
    return r.divergence->step;
  }
  return r.first_disagreeing_step();
}

std::string replay_command_until(const ReplayCliOptions& o, int64_t step) {
  return fmt::format("lockstep replay {} --until {}", o.trace, step);
}

void print_header(const replay::ReplayReport& r, const ReplayCliOptions& o) {
  const trace::TraceHeader& h = r.header;
  fmt::print("trace {}: {}, recorded on {} ({}) by {}\n", o.trace, h.model.name, h.backend,
             h.machine.gpu_name.empty() ? h.machine.cpu_name : h.machine.gpu_name, h.build_id);
  if (h.is_foreign()) {
    fmt::print("recorded by a foreign executor: {}{}\n", h.foreign_executor,
               h.weights_digest == 0 ? " (no weight digest recorded: replayed on the weights given)" : "");
  }
  fmt::print("replayed on {}{} in {} mode: {} steps, {} compared\n", r.backend,
             r.tp_degree > 1 || h.tp_degree > 1
                 ? fmt::format(" at TP {} (recorded at TP {})", r.tp_degree, h.tp_degree)
                 : std::string(),
             o.mode, r.steps_replayed, r.steps_compared);
  if (h.nccl_version != 0) {
    fmt::print("recorded collectives: NCCL {}.{}.{} (NCCL_ALGO={}, NCCL_PROTO={}); an exact "
               "replay on CUDA expects the same NCCL and one GPU per rank\n",
               h.nccl_version / 10000, h.nccl_version / 100 % 100, h.nccl_version % 100,
               h.nccl_algo, h.nccl_proto);
  }
}

void print_other_build_note(const replay::ReplayReport& r) {
  if (const auto note = replay::other_build_note(r.header, trace::build_id())) {
    fmt::print("{}\n", *note);
  }
}

int report_exact(const replay::ReplayReport& r, const ReplayCliOptions& o) {
  if (r.divergence) {
    const replay::Divergence& d = *r.divergence;
    fmt::print("DIVERGED at step {}\n  request  {} (op row {})\n  field    {}\n  expected {}\n  actual   {}\n",
               d.step, d.request_id, d.row, d.field, d.expected, d.actual);
    fmt::print("replay up to it: {}\n", replay_command_until(o, d.step));
    print_other_build_note(r);
    return kExitFinding;
  }
  fmt::print("IDENTICAL: every compared output and digest matches bit for bit\n");
  return kExitOk;
}

int report_teacher_forced(const replay::ReplayReport& r) {
  int64_t steps_all_equal = 0;
  for (const replay::StepAgreement& a : r.agreement) steps_all_equal += a.tokens_equal == a.tokens_count;
  const double fraction = r.tokens_count ? double(r.tokens_equal) / double(r.tokens_count) : 1.0;
  fmt::print("agreement: {}/{} tokens ({:.2f}%), {}/{} steps with every token equal, max |Δlogit| "
             "over recorded top-k {:.6g}\n",
             r.tokens_equal, r.tokens_count, 100 * fraction, steps_all_equal, r.agreement.size(),
             r.logit_delta_max);
  int printed = 0;
  for (const replay::StepAgreement& a : r.agreement) {
    if (a.tokens_equal == a.tokens_count || printed++ >= 10) continue;
    fmt::print("  step {}: {}/{} tokens equal, max |Δlogit| {:.6g}\n", a.step, a.tokens_equal,
               a.tokens_count, a.logit_delta_max);
  }
  if (r.identical()) return kExitOk;
  print_other_build_note(r);
  return kExitFinding;
}

void write_json(const replay::ReplayReport& report, replay::ReplayMode mode, const ReplayCliOptions& o,
                const std::optional<replay::Localisation>& localisation) {
  const replay::ReplayedTrace trace{o.trace, std::filesystem::file_size(o.trace)};
  const std::string until = report.divergence ? replay_command_until(o, report.divergence->step) : "";
  nlohmann::ordered_json j = replay::replay_result_json(report, mode, trace, until);
  if (localisation) j["localisation"] = replay::localisation_json(*localisation);
  std::ofstream out(o.json);
  out << j.dump(2) << '\n';
  out.flush();
  LS_REQUIRE(out.good(), "--json {}: cannot write", o.json);
}

replay::Localisation localise(const ReplayCliOptions& o, const replay::ReplayOptions& options,
                              const LocaliseSides& sides, int64_t step, bool batch_invariant) {
  replay::LocaliseRequest q{.trace = o.trace, .step = step, .replay_side = options,
                            .replay_backend = o.backend};
  if (!sides.other.empty()) {
    q.other_side = options;
    q.other_side->make_backend = backend_maker(sides.other, batch_invariant);
    q.other_backend = sides.other;
    q.tolerance = sides.tolerance;
  }
  if (!o.quiet) fmt::print(stderr, "replay: localising step {}\n", step);
  return replay::localise_step(q);
}

// The localisation's sides from the flags and the trace's header, before anything runs; an exit
// status when they refuse it.
std::optional<int> prepare_localise(const ReplayCliOptions& o, const trace::TraceHeader& header,
                                    LocaliseSides& sides) {
  if (!o.localise) return std::nullopt;
  try {
    sides = localise_sides(o, header);
  } catch (const Error& e) {
    fmt::print(stderr, "lockstep replay: error: {}\n", e.what());
    return kExitUnusable;
  }
  return std::nullopt;
}

void print_localisation(const ReplayCliOptions& o, replay::ReplayMode mode,
                        const std::optional<replay::Localisation>& localisation) {
  if (localisation) {
    fmt::print("{}", replay::describe_localisation(*localisation));
  } else if (o.localise) {
    fmt::print("localise: nothing to localise: no step {}\n",
               mode == replay::ReplayMode::kExact ? "diverged (or only a refusal did)" : "disagreed");
  }
}

int run_replay(const ReplayCliOptions& o) {
  try {
    require_localise_flags(o);  // the flags first: a refusal names them whatever the trace holds
  } catch (const Error& e) {
    fmt::print(stderr, "lockstep replay: error: {}\n", e.what());
    return kExitUnusable;
  }
  trace::TraceHeader header;  // read once: the localisation's sides, the recorded mode
  try {
    header = trace::TraceReader::open(o.trace).header();
  } catch (const Error& e) {
    fmt::print(stderr, "lockstep replay: unusable trace: {}\n", e.what());
    return kExitUnusable;
  }
  LocaliseSides sides;
  if (const std::optional<int> refused = prepare_localise(o, header, sides)) return *refused;
  const bool batch_invariant = recorded_batch_invariant(header);
  if (o.isolate && !batch_invariant) {
    fmt::print(stderr, "lockstep replay: error: --isolate {}: the trace was recorded in "
               "determinism mode '{}' ({}), which does not promise that a request's results are "
               "the same alone as in its batch; record with --determinism invariant to replay one "
               "request alone\n", *o.isolate, header.determinism_mode, header.backend);
    return kExitUnusable;
  }
  replay::ReplayOptions options;
  options.mode = o.mode == "exact" ? replay::ReplayMode::kExact : replay::ReplayMode::kTeacherForced;
  options.until_step = o.until;
  options.isolate = o.isolate;
  if (!o.weights_dir.empty()) options.weights_directory = o.weights_dir;
  if (o.tp_degree > 0) options.tp_degree = o.tp_degree;
  options.make_backend = backend_maker(o.backend, batch_invariant);
  ProgressLine progress;
  if (!o.quiet) {
    options.on_progress = [&progress](int64_t steps, uint64_t bytes, uint64_t total) {
      const double fraction = total ? double(bytes) / double(total) : 1.0;
      progress.show(fmt::format("replay: {} steps, {:.0f}% of the trace", steps, 100.0 * fraction),
                    fraction);
    };
  }
  replay::ReplayReport report;
  try {
    report = replay::replay_trace(o.trace, options);
  } catch (const replay::EmptySelection& e) {
    progress.finish(/*keep=*/true);
    fmt::print(stderr, "lockstep replay: error: {}\n", e.what());
    return kExitUnusable;
  } catch (const Error& e) {
    progress.finish(/*keep=*/true);
    fmt::print(stderr, "lockstep replay: unusable trace: {}\n", e.what());
    return kExitUnusable;
  }
  progress.finish(/*keep=*/false);
  std::optional<replay::Localisation> localisation;
  const std::optional<int64_t> step = o.localise ? step_to_localise(report, options.mode) : std::nullopt;
  if (step) {
    try {
      localisation = localise(o, options, sides, *step, batch_invariant);
    } catch (const Error& e) {
      fmt::print(stderr, "lockstep replay: --localise: {}\n", e.what());
      return kExitUnusable;
    }
  }
  if (!o.json.empty()) write_json(report, options.mode, o, localisation);
  print_header(report, o);
  if (report.truncation) fmt::print("note: {} (the complete prefix was replayed)\n", report.truncation->describe());
  const int status = options.mode == replay::ReplayMode::kExact ? report_exact(report, o)
                                                                : report_teacher_forced(report);
  print_localisation(o, options.mode, localisation);
  return status;
}

}  // namespace

std::function<int()> add_replay_command(CLI::App& app) {
  auto o = std::make_shared<ReplayCliOptions>();
  CLI::App* cmd = app.add_subcommand(
      "replay", "Re-execute a recorded trace (on the CPU reference, or --backend) and report the "
                "first divergence (exact) or the agreement (teacher-forced)");
  cmd->add_option("trace", o->trace, "The trace file")->required()->check(CLI::ExistingFile);
  cmd->add_option("--mode", o->mode,
                  "exact: compare every output and digest bit for bit and stop at the first "
                  "divergence; teacher-forced: feed the recorded tokens back and report agreement")
      ->check(CLI::IsMember({"exact", "teacher-forced"}))
      ->capture_default_str();
  cmd->add_option("--until", o->until, "Stop after this step")
      ->check(integer_in(0, std::numeric_limits<int64_t>::max(), "the step"));
  cmd->add_option("--isolate", o->isolate,
                  "Replay one request alone: for a trace whose header promises batch invariance "
                  "(the CPU reference's, or CUDA's with --determinism invariant; any other is "
                  "refused); a request in no step of the trace is an error")
      ->check(unsigned_64());
  cmd->add_option("--weights-dir,--model", o->weights_dir,
                  "Where the trace's model directory is on this machine (checked against the "
                  "recorded weight digest; a foreign executor's trace that recorded none is "
                  "replayed on these weights)");
  cmd->add_option("--backend", o->backend,
                  fmt::format("Backend to replay on ({}); exact mode expects the one that "
                              "recorded the trace",
                              fmt::join(backend_names(), ", ")))
      ->check(backend_validator())
      ->capture_default_str();
  cmd->add_option("--tp", o->tp_degree,
                  "Tensor-parallel degree to replay at (0 = the recorded one); exact mode refuses "
                  "another, teacher-forced mode measures the agreement across degrees. With "
                  "--backend cuda: one rank per GPU over NCCL, or every rank on GPU 0 when the "
                  "host has fewer GPUs")
      ->check(CLI::Range(0, kTpDegreeMax))
      ->capture_default_str();
  cmd->add_flag("--quiet,-q", o->quiet, "No progress line");
  cmd->add_option("--json", o->json,
                  "Also write the result as JSON (verdict, steps, the first divergence with the "
                  "command that replays up to it, teacher-forced agreement): what `lockstep "
                  "report --replay-json` reads");
  cmd->add_flag("--localise", o->localise,
                "On the first divergent step (exact) or the first step with a disagreeing token "
                "(teacher-forced), re-run it with per-layer activations and print the first layer "
                "and tensor (attn_in, q, k, v, attn_out, mlp_out, final_norm, logits), token row "
                "and element where the replay departs from the other side: the trace's recorded "
                "activation digests (generate/sim --record-activations; --backend must be the "
                "recording's), else a second replay (--localise-against). Bits are compared on "
                "one backend; CUDA against the CPU reference needs --mode teacher-forced and "
                "reports the first element with |a - b| > 0.1 x max|b| over its row. Not with "
                "--isolate; TP 1, models without Mamba layers");
  cmd->add_option("--localise-against", o->localise_against,
                  "With --localise: the other side is a second replay of the trace up to that "
                  "step on this backend (default: the recorded activation digests when the trace "
                  "has them, else a replay on the recording's backend)")
      ->check(backend_validator());
  cmd->footer(kExitStatusHelp);
  return [cmd, o]() { return cmd->parsed() ? run_replay(*o) : -1; };
}

}  // namespace ls::cli
