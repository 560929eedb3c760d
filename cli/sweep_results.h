// A sweep's results as files CI can read: one JSON line per seed (`lockstep sim --results`) and
// JUnit XML (`--junit`), and the reading side that `lockstep sweep merge` uses to join the shards.
//
// A line holds everything that identifies the seed's run (seed, derived parameters, summary,
// verdict with its failures, fingerprints, the reproduce command) and its wall time, which is the
// one field that differs between two honest runs of the same seed.
#pragma once

#include "sim/sweep.h"

#include <nlohmann/json.hpp>

#include <cstdint>
#include <fstream>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace ls::cli {

// "A..B" (inclusive, A <= B); `flag` names the option in the error.
std::pair<uint64_t, uint64_t> parse_seed_range(const std::string& text, std::string_view flag);

struct SeedFailure {
  std::string checker;  // a sim checker, "twin-run", or "sweep-merge" (a conflict between shards)
  int64_t step = -1;    // -1: not at a step (end-of-run checks, twin run, merge)
  std::string detail;

  bool operator==(const SeedFailure&) const = default;
};

struct SeedResult {
  uint64_t seed = 0;
  nlohmann::ordered_json params;   // the derived parameters (object)
  nlohmann::ordered_json summary;  // the run's counts (object)
  std::vector<SeedFailure> failures;  // empty: the seed passed
  uint64_t fingerprint = 0;
  std::optional<uint64_t> twin_fingerprint;  // absent with --no-twin
  std::string reproduce;
  double wall_seconds = 0;

  bool passed() const { return failures.empty(); }
  // Equal in everything but wall time: the same run of the same seed.
  bool same_run(const SeedResult& other) const;
  // The first field (other than wall time) where two results differ, or "".
  std::string first_difference(const SeedResult& other) const;
};

// The result line of one seed's run.
SeedResult seed_result_of(const sim::SimParams& params, const sim::SeedVerdict& verdict,
                          std::string reproduce, double wall_seconds);

// One line of JSONL, without the newline; keys in a fixed order, seed first.
std::string result_line(const SeedResult& result);
// Parses one line; throws ls::Error "WHERE: field 'F': why" for anything missing, mistyped,
// inconsistent or unknown (`where` is "file:line").
SeedResult parse_result_line(std::string_view line, const std::string& where);

// Reads a JSONL file of result lines; throws ls::Error naming file:line for a bad line.
struct LocatedResult {
  SeedResult result;
  std::string where;  // "file:line"
};
std::vector<LocatedResult> read_results_file(const std::string& path);

// Opens an output file, or throws ls::Error naming it (before a sweep runs, not after).
std::ofstream open_output_file(const std::string& path);
// Writes the lines and flushes; throws ls::Error naming `path` when the write failed.
void write_results(std::ostream& out, const std::vector<SeedResult>& results, const std::string& path);
// JUnit XML: one <testcase> per seed, a <failure> with the reproduce command for a failed one.
void write_junit(std::ostream& out, const std::vector<SeedResult>& results,
                 const std::string& suite_name, const std::string& path);

}  // namespace ls::cli
