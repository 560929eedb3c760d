#pragma once

#include <CLI/CLI.hpp>

#include <functional>

namespace ls::cli {

// Registers `lockstep report`; the returned function runs it when parsed and returns the exit
// status.
std::function<int()> add_report_command(CLI::App& app);

}  // namespace ls::cli
