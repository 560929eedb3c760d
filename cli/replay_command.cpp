#include "cli/replay_command.h"

#include "cli/backend_factory.h"
#include "cli/model_options.h"
#include "cli/number_flags.h"
#include "cli/exit_status.h"
#include "core/check.h"
#include "core/tensor_parallel.h"
#include "replay/replay.h"
#include "replay/replay_json.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <filesystem>
#include <limits>
#include <optional>
#include <fstream>
#include <memory>
#include <unistd.h>

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
};

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
  if (o.isolate && h.backend != "cpu") {
    fmt::print("note: --isolate assumes batch invariance, which the {} backend that recorded this "
               "trace does not guarantee\n", h.backend);
  }
}

int report_exact(const replay::ReplayReport& r, const ReplayCliOptions& o) {
  if (r.divergence) {
    const replay::Divergence& d = *r.divergence;
    fmt::print("DIVERGED at step {}\n  request  {} (op row {})\n  field    {}\n  expected {}\n  actual   {}\n",
               d.step, d.request_id, d.row, d.field, d.expected, d.actual);
    fmt::print("replay up to it: {}\n", replay_command_until(o, d.step));
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
  return r.identical() ? kExitOk : kExitFinding;
}

void write_json(const replay::ReplayReport& report, replay::ReplayMode mode, const ReplayCliOptions& o) {
  const replay::ReplayedTrace trace{o.trace, std::filesystem::file_size(o.trace)};
  const std::string until = report.divergence ? replay_command_until(o, report.divergence->step) : "";
  std::ofstream out(o.json);
  out << replay::replay_result_json(report, mode, trace, until).dump(2) << '\n';
  out.flush();
  LS_REQUIRE(out.good(), "--json {}: cannot write", o.json);
}

int run_replay(const ReplayCliOptions& o) {
  replay::ReplayOptions options;
  options.mode = o.mode == "exact" ? replay::ReplayMode::kExact : replay::ReplayMode::kTeacherForced;
  options.until_step = o.until;
  options.isolate = o.isolate;
  if (!o.weights_dir.empty()) options.weights_directory = o.weights_dir;
  if (o.tp_degree > 0) options.tp_degree = o.tp_degree;
  if (o.backend != "cpu") {
    options.make_backend = [name = o.backend](const ModelWeights& weights,
                                              const ExecutorConfig& limits,
                                              const std::string& drafter, int32_t tp_degree) {
      return make_backend(name, weights, limits, drafter, false, tp_degree);
    };
  }
  const bool tty = isatty(STDERR_FILENO) != 0;
  if (!o.quiet) {
    options.on_progress = [tty](int64_t steps, uint64_t bytes, uint64_t total) {
      fmt::print(stderr, "{}replay: {} steps, {:.0f}% of the trace{}", tty ? "\r" : "", steps,
                 total ? 100.0 * double(bytes) / double(total) : 100.0, tty ? "" : "\n");
    };
  }
  replay::ReplayReport report;
  try {
    report = replay::replay_trace(o.trace, options);
  } catch (const replay::EmptySelection& e) {
    fmt::print(stderr, "{}lockstep replay: error: {}\n", tty && !o.quiet ? "\n" : "", e.what());
    return kExitUnusable;
  } catch (const Error& e) {
    fmt::print(stderr, "{}lockstep replay: unusable trace: {}\n", tty && !o.quiet ? "\n" : "", e.what());
    return kExitUnusable;
  }
  if (!o.quiet && tty) fmt::print(stderr, "\r\033[K");
  if (!o.json.empty()) write_json(report, options.mode, o);
  print_header(report, o);
  if (report.truncation) fmt::print("note: {} (the complete prefix was replayed)\n", report.truncation->describe());
  return options.mode == replay::ReplayMode::kExact ? report_exact(report, o)
                                                    : report_teacher_forced(report);
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
                  "Replay one request alone (valid where batch invariance holds: the CPU "
                  "reference); a request in no step of the trace is an error")
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
  cmd->footer(kExitStatusHelp);
  return [cmd, o]() { return cmd->parsed() ? run_replay(*o) : -1; };
}

}  // namespace ls::cli
