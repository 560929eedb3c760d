#pragma once

#include <CLI/CLI.hpp>

#include <functional>

namespace ls::cli {

// Registers `lockstep trace inspect|diff`.
std::function<int()> add_trace_command(CLI::App& app);

}  // namespace ls::cli
