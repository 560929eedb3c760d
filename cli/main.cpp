// `lockstep`: the command line. main builds everything and passes it down (STYLE.md §12).
#include "backends/backend_factory.h"
#include "cli/check_command.h"
#include "cli/generate_command.h"
#include "cli/replay_command.h"
#include "cli/report_command.h"
#include "cli/sim_command.h"
#include "cli/sweep_command.h"
#include "cli/trace_command.h"
#include "cli/exit_status.h"
#include "core/check.h"
#include "trace/trace_observer.h"

#include <CLI/CLI.hpp>
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <functional>
#include <vector>

int main(int argc, char** argv) {
  CLI::App app{"lockstep — a deterministic LLM model executor with record, replay, simulation and "
               "property testing"};
  // The build a trace header names as its writer (`trace inspect`'s "written by"), and the
  // backends this build has.
  app.set_version_flag("--version", fmt::format("{}; backends: {}", ls::trace::build_id(),
                                                fmt::join(ls::backend_names(), ", ")));
  app.require_subcommand(1);
  app.footer(ls::cli::kExitStatusHelp);
  std::vector<std::function<int()>> commands;
  commands.push_back(ls::cli::add_generate_command(app));
  commands.push_back(ls::cli::add_sim_command(app));
  commands.push_back(ls::cli::add_sweep_command(app));
  commands.push_back(ls::cli::add_replay_command(app));
  commands.push_back(ls::cli::add_report_command(app));
  commands.push_back(ls::cli::add_trace_command(app));
  commands.push_back(ls::cli::add_check_command(app));
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    // CLI11 prints the message (or the help); every usage error exits 2, as the help says, not
    // CLI11's own codes (105, 109, …).
    return app.exit(e) == 0 ? ls::cli::kExitOk : ls::cli::kExitUnusable;
  }
  try {
    for (const auto& command : commands) {
      const int status = command();
      if (status >= 0) return status;
    }
  } catch (const ls::Error& e) {
    fmt::print(stderr, "lockstep: error: {}\n", e.what());
    return ls::cli::kExitUnusable;
  }
  return ls::cli::kExitOk;
}
