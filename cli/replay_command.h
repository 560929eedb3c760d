#pragma once

#include <CLI/CLI.hpp>

#include <functional>

namespace ls::cli {

// Registers `lockstep replay`; the returned function runs it when parsed and returns the exit
// status (0 identical, 1 diverged, 2 unusable trace), or -1 when another command was chosen.
std::function<int()> add_replay_command(CLI::App& app);

}  // namespace ls::cli
