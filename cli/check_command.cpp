#include "cli/check_command.h"

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
    return 2;
  }
  fmt::print("checked {} steps ({} rows) of {}\n", report.steps_checked, report.rows_checked, path);
  if (report.truncation) fmt::print("note: {} (the complete prefix was checked)\n", report.truncation->describe());
  if (report.violation) {
    fmt::print("VIOLATION: {}\n", report.violation->describe());
    fmt::print("replay up to it: lockstep replay {} --until {}\n", path, report.violation->step);
    return 1;
  }
  fmt::print("every invariant holds\n");
  return 0;
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
              "flags.\nExit status: 0 every invariant holds, 1 a violation, 2 unusable trace.");
  return [cmd, path]() { return cmd->parsed() ? run_check(*path) : -1; };
}

}  // namespace ls::cli
