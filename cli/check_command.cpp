#include "cli/check_command.h"

#include "cli/exit_status.h"
#include "core/check.h"
#include "replay/trace_check.h"

#include <fmt/format.h>

#include <memory>

namespace ls::cli {

namespace {

int run_check(const std::string& path) {
  replay::CheckReport report;
  try {
    report = replay::check_trace(path);
  } catch (const Error& e) {
    fmt::print(stderr, "lockstep check: unusable trace: {}\n", e.what());
    return kExitUnusable;
  }
  fmt::print("checked {} steps ({} rows) of {}\n", report.steps_checked, report.rows_checked, path);
  if (report.truncation) fmt::print("note: {} (the complete prefix was checked)\n", report.truncation->describe());
  if (report.violation) {
    fmt::print("VIOLATION: {}\n", report.violation->describe());
    fmt::print("replay up to it: lockstep replay {} --until {}\n", path, report.violation->step);
    return kExitFinding;
  }
  fmt::print("every invariant holds\n");
  return kExitOk;
}

}  // namespace

std::function<int()> add_check_command(CLI::App& app) {
  auto path = std::make_shared<std::string>();
  CLI::App* cmd = app.add_subcommand(
      "check", "Run every invariant checker over a recorded trace (production, simulator or "
               "property test) without re-executing it; name the first step and field that breaks one");
  cmd->add_option("trace", *path, "The trace file")->required()->check(CLI::ExistingFile);
  cmd->footer("Invariants: the forward-op contract, sampling parameters on a request new to its pool "
              "row, a request on one pool row at a time, decode only with KV, output shapes, ids in "
              "[0, V), accepted lengths in [0, W], the context clamp, vcl = committed tokens, NaN "
              "flags.\n" + std::string(kExitStatusHelp));
  return [cmd, path]() { return cmd->parsed() ? run_check(*path) : -1; };
}

}  // namespace ls::cli
