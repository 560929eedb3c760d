// A replay's result as JSON (`lockstep replay --json OUT`), and the reading side that
// `lockstep report --replay-json` uses to show the first divergence.
#pragma once

#include "replay/replay.h"

#include <nlohmann/json.hpp>

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>

namespace ls::replay {

// What identifies the trace a result belongs to, so a report never pairs a trace with the replay
// of another one.
struct ReplayedTrace {
  std::string path;
  uint64_t file_bytes = 0;
};

// `replay_until` is the command that replays up to the divergence (printed by the CLI too).
nlohmann::ordered_json replay_result_json(const ReplayReport& report, ReplayMode mode,
                                          const ReplayedTrace& trace, const std::string& replay_until);

// The parts of a replay result a report shows.
struct ReplayResultSummary {
  std::string mode;     // "exact" or "teacher-forced"
  std::string verdict;  // "identical", "diverged", "disagreed"
  std::string backend;
  int64_t tp_degree = 1;  // the tensor-parallel degree it replayed at
  int64_t steps_replayed = 0;
  int64_t steps_compared = 0;
  std::optional<Divergence> divergence;
  std::string replay_until;  // with a divergence
  std::optional<double> token_agreement;  // teacher-forced: tokens equal / tokens
};

// Reads and checks a result file: every key known and of its type (ls::Error naming the file and
// the field otherwise), and the result must be of this trace (same size and weights digest).
ReplayResultSummary read_replay_result(const std::filesystem::path& path, const trace::TraceHeader& header,
                                       uint64_t trace_bytes);

}  // namespace ls::replay
