// `lockstep sweep merge`: joins the result files of a sweep's shards (`lockstep sim --shard I/N
// --results …`) into one, and writes its JUnit XML.
//
// Several lines for one seed come from re-run or overlapping shards. They are resolved, never
// dropped silently, and each resolution is printed:
//   - all the same run (equal in everything but wall time): a duplicate, kept once;
//   - a failing and a passing result: the failing one wins (a flaky pass must not hide it);
//   - two passing results that differ (another fingerprint, other parameters or another reproduce
//     command): the runs disagree, which is itself a failure — the seed is marked failed with a
//     `sweep-merge` failure that names both lines and the field;
//   - two failing results that differ: the first is kept and marked the same way.
#include "cli/sweep_command.h"

#include "cli/exit_status.h"
#include "cli/sweep_results.h"
#include "core/check.h"

#include <fmt/format.h>

#include <iostream>
#include <map>
#include <memory>

namespace ls::cli {

namespace {

struct MergeOptions {
  std::vector<std::string> inputs;
  std::string output;  // "": standard output
  std::string junit;
  std::string expect_seeds;  // "A..B": every seed present, no other
};

// A merge holds every result in memory; this bounds what --expect-seeds can add.
constexpr uint64_t kExpectedSeedsMax = 10'000'000;

struct MergeCounts {
  int64_t lines = 0;
  int64_t duplicates = 0;
  int64_t failing_wins = 0;
  int64_t conflicts = 0;
  int64_t missing = 0;
  int64_t unexpected = 0;
};

// The distinct runs among a seed's lines, in input order.
std::vector<const LocatedResult*> distinct_runs(const std::vector<const LocatedResult*>& lines) {
  std::vector<const LocatedResult*> runs;
  for (const LocatedResult* line : lines) {
    bool seen = false;
    for (const LocatedResult* run : runs) seen = seen || run->result.same_run(line->result);
    if (!seen) runs.push_back(line);
  }
  return runs;
}

std::string places(const std::vector<const LocatedResult*>& lines) {
  std::string out;
  for (const LocatedResult* line : lines) out += (out.empty() ? "" : ", ") + line->where;
  return out;
}

// Marks `kept` failed because `other` is a different run of the same seed.
SeedResult conflict(const LocatedResult& kept, const LocatedResult& other) {
  SeedResult r = kept.result;
  r.failures.push_back({"sweep-merge", -1,
                        fmt::format("{} and {} are different runs of seed {}: they differ in {}",
                                    kept.where, other.where, r.seed,
                                    kept.result.first_difference(other.result))});
  return r;
}

SeedResult resolve(uint64_t seed, const std::vector<const LocatedResult*>& lines, MergeCounts& counts) {
  const std::vector<const LocatedResult*> runs = distinct_runs(lines);
  if (lines.size() > runs.size()) {
    ++counts.duplicates;
    fmt::print(stderr, "sweep merge: seed {}: the same run at {}; kept once\n", seed, places(lines));
  }
  if (runs.size() == 1) return runs[0]->result;
  std::vector<const LocatedResult*> failing, passing;
  for (const LocatedResult* run : runs) (run->result.passed() ? passing : failing).push_back(run);
  if (failing.size() == 1) {
    ++counts.failing_wins;
    fmt::print(stderr, "sweep merge: seed {}: the failing result at {} wins over the passing one(s) at {}\n",
               seed, failing[0]->where, places(passing));
    return failing[0]->result;
  }
  ++counts.conflicts;
  const std::vector<const LocatedResult*>& group = failing.empty() ? passing : failing;
  const SeedResult merged = conflict(*group[0], *group[1]);
  fmt::print(stderr, "sweep merge: seed {}: CONFLICT: {}\n", seed, merged.failures.back().detail);
  return merged;
}

// A seed the expected range holds but no file does: a shard that never reported.
SeedResult missing_seed(uint64_t seed) {
  SeedResult r;
  r.seed = seed;
  r.params = nlohmann::ordered_json::object();
  r.summary = nlohmann::ordered_json::object();
  r.failures.push_back({"sweep-merge", -1, "no result in any input file (a shard did not run or did not finish)"});
  r.reproduce = fmt::format("lockstep sim --seed {}", seed);
  return r;
}

// Checks the merged seeds against --expect-seeds: missing ones become failures, ones outside it
// are reported and counted (and fail the merge).
void check_expected(const std::string& range, std::map<uint64_t, SeedResult>& merged, MergeCounts& counts) {
  if (range.empty()) return;
  const auto [first, last] = parse_seed_range(range, "--expect-seeds");
  LS_REQUIRE(last - first < kExpectedSeedsMax, "--expect-seeds {}: more than {} seeds", range, kExpectedSeedsMax);
  for (const auto& [seed, result] : merged) {
    if (seed < first || seed > last) {
      ++counts.unexpected;
      fmt::print(stderr, "sweep merge: seed {} is outside --expect-seeds {}\n", seed, range);
    }
  }
  for (uint64_t seed = first;; ++seed) {
    if (!merged.count(seed)) {
      ++counts.missing;
      merged.emplace(seed, missing_seed(seed));
    }
    if (seed == last) break;
  }
  if (counts.missing > 0) fmt::print(stderr, "sweep merge: {} seeds of {} have no result\n", counts.missing, range);
}

int run_merge(const MergeOptions& o) {
  // Open the outputs first: a bad path is refused before any work.
  std::ofstream output, junit;
  if (!o.output.empty()) output = open_output_file(o.output);
  if (!o.junit.empty()) junit = open_output_file(o.junit);
  std::vector<LocatedResult> lines;
  for (const std::string& path : o.inputs) {
    for (LocatedResult& line : read_results_file(path)) lines.push_back(std::move(line));
  }
  std::map<uint64_t, std::vector<const LocatedResult*>> by_seed;
  for (const LocatedResult& line : lines) by_seed[line.result.seed].push_back(&line);
  MergeCounts counts{.lines = static_cast<int64_t>(lines.size())};
  std::map<uint64_t, SeedResult> merged;
  for (const auto& [seed, seed_lines] : by_seed) merged.emplace(seed, resolve(seed, seed_lines, counts));
  check_expected(o.expect_seeds, merged, counts);
  std::vector<SeedResult> results;
  int64_t failed = 0;
  for (auto& [seed, result] : merged) failed += !result.passed(), results.push_back(std::move(result));
  write_results(o.output.empty() ? std::cout : output, results, o.output.empty() ? "<stdout>" : o.output);
  if (junit.is_open()) write_junit(junit, results, "lockstep sim (merged)", o.junit);
  fmt::print(stderr,
             "sweep merge: {} lines from {} files -> {} seeds, {} passed, {} failed; {} duplicated, "
             "{} failing over passing, {} conflicts, {} missing, {} outside the expected range\n",
             counts.lines, o.inputs.size(), results.size(), results.size() - failed, failed,
             counts.duplicates, counts.failing_wins, counts.conflicts, counts.missing, counts.unexpected);
  return failed == 0 && counts.unexpected == 0 ? kExitOk : kExitFinding;
}

}  // namespace

std::function<int()> add_sweep_command(CLI::App& app) {
  CLI::App* cmd = app.add_subcommand("sweep", "Work with the results of seed sweeps");
  cmd->require_subcommand(1);
  auto o = std::make_shared<MergeOptions>();
  CLI::App* merge = cmd->add_subcommand(
      "merge", "Merge the --results JSONL files of a sweep's shards into one (sorted by seed), "
               "and write JUnit XML: a failing result wins over a passing one for the same seed; "
               "duplicates are kept once; differing runs of a seed are a conflict and fail it");
  merge->add_option("files", o->inputs, "Result files (JSONL, from lockstep sim --results)")
      ->required()
      ->check(CLI::ExistingFile);
  merge->add_option("-o,--output", o->output, "Write the merged JSONL here (default: standard output)");
  merge->add_option("--junit", o->junit, "Write JUnit XML of the merged results, one test case per seed");
  merge->add_option("--expect-seeds", o->expect_seeds,
                    "A..B: every seed of the range must have a result (a missing one fails the "
                    "merge as a test case) and no other seed may appear");
  merge->footer(kExitStatusHelp);
  return [cmd, o]() { return cmd->parsed() ? run_merge(*o) : -1; };
}

}  // namespace ls::cli
