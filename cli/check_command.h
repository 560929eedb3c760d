#pragma once

#include <CLI/CLI.hpp>

#include <functional>

namespace ls::cli {

// Registers `lockstep check TRACE`: every invariant checker over a recorded trace, no re-execution.
std::function<int()> add_check_command(CLI::App& app);

}  // namespace ls::cli
