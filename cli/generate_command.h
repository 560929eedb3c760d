#pragma once

#include <CLI/CLI.hpp>

#include <functional>

namespace ls::cli {

// Registers `lockstep generate`; the returned function runs it and returns the exit status.
std::function<int()> add_generate_command(CLI::App& app);

}  // namespace ls::cli
