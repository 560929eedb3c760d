#include "cli/sim_command.h"

#include "backends/backend_factory.h"
#include "cli/exit_status.h"
#include "cli/model_options.h"
#include "cli/number_flags.h"
#include "cli/progress_line.h"
#include "cli/sweep_results.h"
#include "core/check.h"
#include "core/model/weights.h"
#include "core/tensor_parallel.h"
#include "sim/sweep.h"
#include "sim/trace_recording.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <chrono>
#include <memory>
#include <sstream>

namespace ls::cli {

namespace {

struct SimOptions {
  uint64_t seed = 1;
  std::string seeds;  // "A..B"
  int32_t requests = 0;
  std::string faults;  // "", "none", "all" or a comma list of sites
  std::string record;
  bool record_activations = false;  // --record-activations
  bool stub_model = false;
  bool no_twin = false;
  bool spec = false;
  std::string backend = "cpu";
  std::string determinism = "default";  // --determinism: "default" or "invariant"
  std::string drafter;  // "": the seed's
  std::string shard;    // "I/N": the seeds of --seeds whose index in the range is I mod N
  std::string results;  // JSONL, one line per seed
  std::string junit;    // JUnit XML
  int32_t tp_degree = 1;
  std::string model = "tiny";  // a named shape of sim::sim_model_names()
};

// Seeds A..B split over N shards: shard I runs the seeds whose index (seed − A) is I mod N, so
// a seed's shard is fixed by the range and N alone and its run does not depend on either.
struct Shard {
  uint64_t index = 0;
  uint64_t count = 1;
};

constexpr uint64_t kSimWeightsSeed = 0;

sim::SimOverrides overrides_of(const SimOptions& o) {
  sim::SimOverrides v;
  if (o.requests > 0) v.requests_count = o.requests;
  v.speculative = o.spec;
  v.tp_degree = o.tp_degree;
  v.model = o.model;
  if (!o.drafter.empty()) {
    LS_REQUIRE(o.spec, "--drafter {} needs --spec (speculative mode)", o.drafter);
    v.drafter = sim::sim_drafter_named(o.drafter);
    LS_REQUIRE(v.drafter.has_value(), "--drafter: unknown drafter '{}'; drafters are ngram, oracle-mix",
               o.drafter);
  }
  if (o.faults == "none") {
    v.faults_enabled = false;
  } else if (o.faults == "all") {
    std::vector<sim::FaultSite> all;
    for (int i = 0; i < sim::kFaultSitesCount; ++i) all.push_back(static_cast<sim::FaultSite>(i));
    v.faults = all;
  } else if (!o.faults.empty()) {
    std::vector<sim::FaultSite> sites;
    std::stringstream list(o.faults);
    for (std::string name; std::getline(list, name, ',');) {
      const auto site = sim::fault_site_named(name);
      LS_REQUIRE(site.has_value(),
                 "--faults: unknown fault site '{}'; sites are nan-logits, oov-sample, "
                 "page-pressure, abort-mid-prefill, context-limit, late-result (or none, all)",
                 name);
      sites.push_back(*site);
    }
    v.faults = sites;
  }
  return v;
}

// The world's backend: the CPU reference, or (--backend cuda) the CLI's backend with the seed's
// drafter over the same weights. What that backend cannot run is an error naming the seed: the
// oracle-mix drafter (it proposes the simulated run's reference continuations, a CPU-only
// simulator part) and the stub model. Every fault site runs on it (poisoned logits, forced
// outputs, swaps, and the scheduler's own sites), on the hybrid world too (its state rules,
// digests and swapped states on the device; read_inputs reports each token's working slot as the
// mixer's launches read it, for the mamba-padding check; what the CUDA backend refuses for a
// hybrid it refuses by name).
sim::WorldOptions world_options(const SimOptions& o) {
  sim::WorldOptions world{.stub_model = o.stub_model};
  if (o.backend == "cpu") return world;
  LS_REQUIRE(!o.stub_model,
             "--stub-model replaces the CPU reference's arithmetic; --backend {} has no stub "
             "model: drop one of the two",
             o.backend);
  world.make_backend = [name = o.backend, invariant = o.determinism == "invariant"](
                           const sim::SimParams& p, const ModelWeights& weights,
                           const ExecutorConfig& limits) {
    LS_REQUIRE(p.drafter != sim::SimDrafter::kOracleMix,
               "seed {} drew the oracle-mix drafter, which runs on the CPU reference only (it "
               "proposes the simulated run's reference continuations); --backend {} runs the "
               "n-gram drafter or none: add --drafter ngram, or drop --backend {} for this seed",
               p.seed, name, name);
    return make_backend(BackendSpec{.name = name,
                                    .drafter = p.drafter_name(),
                                    .tp_degree = p.tp_degree,
                                    .batch_invariant = invariant},
                        weights, limits);
  };
  return world;
}

std::string reproduce(const SimOptions& o, const sim::SimParams& params,
                      const sim::SimOverrides& overrides) {
  const std::string command = sim::reproduce_command(params, overrides);
  if (o.backend == "cpu") return command;
  return fmt::format("{} --backend {}{}", command, o.backend,
                     o.determinism == "invariant" ? " --determinism invariant" : "");
}

Shard parse_shard(const std::string& text) {
  if (text.empty()) return {};
  const size_t slash = text.find('/');
  const std::optional<uint64_t> index = parse_uint64(text.substr(0, std::min(slash, text.size())));
  const std::optional<uint64_t> count =
      slash == std::string::npos ? std::nullopt : parse_uint64(text.substr(slash + 1));
  LS_REQUIRE(index && count, "--shard '{}': expected I/N with 0 <= I < N, e.g. 2/7", text);
  const Shard shard{*index, *count};
  LS_REQUIRE(shard.count >= 1, "--shard '{}': the shard count N must be at least 1", text);
  LS_REQUIRE(shard.index < shard.count,
             "--shard '{}': the shard index I must be below the count N (shards are 0..{})", text,
             shard.count - 1);
  return shard;
}

// The seeds of shard `shard` in first..last, in order (the loop never overflows at the top of
// the range).
std::vector<uint64_t> shard_seeds(uint64_t first, uint64_t last, Shard shard) {
  std::vector<uint64_t> seeds;
  const uint64_t span = last - first;
  for (uint64_t index = shard.index; index <= span; index += shard.count) {
    seeds.push_back(first + index);
    if (span - index < shard.count) break;
  }
  return seeds;
}

// The optional result files of a run, opened before it starts so a bad path fails at once; the
// JSONL gets each seed's line as soon as it is known (a killed sweep keeps the seeds it ran).
class ResultFiles {
 public:
  ResultFiles(const SimOptions& o, std::string suite) : o_(o), suite_(std::move(suite)) {
    if (!o.results.empty()) results_ = open_output_file(o.results);
    if (!o.junit.empty()) junit_ = open_output_file(o.junit);
  }

  void add(SeedResult result) {
    if (results_.is_open()) write_results(results_, {result}, o_.results);
    all_.push_back(std::move(result));
  }

  void close() {
    if (junit_.is_open()) write_junit(junit_, all_, suite_, o_.junit);
  }

 private:
  const SimOptions& o_;
  std::string suite_;
  std::ofstream results_;
  std::ofstream junit_;
  std::vector<SeedResult> all_;
};

double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

void print_summary(const sim::SeedVerdict& v) {
  const sim::SimSummary& s = v.summary;
  std::vector<std::string> fired;
  for (int i = 0; i < sim::kFaultSitesCount; ++i) {
    if (s.faults_fired[i] > 0) {
      fired.push_back(fmt::format("{} {}", sim::to_string(static_cast<sim::FaultSite>(i)), s.faults_fired[i]));
    }
  }
  fmt::print("summary\n");
  fmt::print("  requests: {} finished, {} aborted by the client, {} numerical errors\n",
             s.requests_finished, s.requests_aborted, s.requests_numerical_errors);
  fmt::print("  steps {}, tokens generated {}, prefix-cache hit tokens {}\n", s.steps_count,
             s.tokens_generated, s.prefix_hit_tokens);
  fmt::print("  retractions: {} swap, {} recompute; {} recoveries\n", s.retractions_swap,
             s.retractions_recompute, s.recoveries);
  fmt::print("  faults fired: {}\n", fired.empty() ? "none" : fmt::format("{}", fmt::join(fired, ", ")));
  fmt::print("  checkers: {}\n", s.passed() ? "all passed" : fmt::format("{} FAILED", s.failures.size()));
  for (const sim::CheckFailure& f : s.failures) {
    fmt::print("    {} at {}: {}\n", f.checker, f.step < 0 ? "the end" : fmt::format("step {}", f.step), f.detail);
  }
  if (v.twin_checked) {
    fmt::print("  twin run: {}\n", v.twin_ok() ? "same fingerprint"
                                               : fmt::format("DIFFERENT fingerprint {:016x}", v.twin_fingerprint));
  }
  fmt::print("fingerprint {:016x}\n", s.fingerprint);
}

int run_single(const SimOptions& o, const ModelWeights& weights) {
  prepare_backend_environment(o.backend, o.tp_degree);  // before CUDA starts
  const sim::SimOverrides overrides = overrides_of(o);
  const sim::SimParams params = sim::derive_params(o.seed, overrides);
  fmt::print("reproduce: {}\n", reproduce(o, params, overrides));
  fmt::print("{}\n", params.describe());
  if (o.backend != "cpu") fmt::print("backend: {}\n", o.backend);
  sim::WorldOptions world = world_options(o);
  ResultFiles files(o, fmt::format("lockstep sim seed {}", o.seed));
  std::unique_ptr<trace::Recorder> recorder;
  std::unique_ptr<sim::SimTraceObserver> observer;
  if (!o.record.empty()) {
    LS_REQUIRE(!o.stub_model, "--record replays the real model: drop --stub-model");
    const WeightSource source{WeightSource::Kind::kSeed, kSimWeightsSeed, ""};
    trace::TraceHeader header =
        trace::make_trace_header(weights, source, sim::executor_config_for(params), o.backend,
                                 machine_info_for(o.backend));
    header.drafter = params.drafter_name();
    header.determinism_mode = trace::determinism_mode_of(o.backend, o.determinism == "invariant");
    header.activation_digests = o.record_activations;
    header.tp_degree = params.tp_degree;
    describe_collectives(o.backend, params.tp_degree, header);
    header.step_clock = "simulated";  // the world's clock: a recorded seed's trace is deterministic
    header.device_timer = "simulated";
    recorder = trace::Recorder::open(o.record, header);
    observer = std::make_unique<sim::SimTraceObserver>(*recorder);
    world.observer = observer.get();
    world.executor_options = trace::recording_executor_options(o.record_activations);
  }
  const auto start = std::chrono::steady_clock::now();
  const sim::SeedVerdict v = sim::run_seed(params, weights, world, !o.no_twin);
  files.add(seed_result_of(params, v, reproduce(o, params, overrides), seconds_since(start)));
  files.close();
  if (recorder) {
    recorder->close();
    fmt::print("recorded {} step records to {} (replay: lockstep replay {})\n",
               recorder->stats().records_written, o.record, o.record);
  }
  print_summary(v);
  return v.passed() ? kExitOk : kExitFinding;
}

std::string failure_line(const SeedResult& r) {
  const std::string why = fmt::format("{}: {}", r.failures[0].checker, r.failures[0].detail);
  return fmt::format("seed {}: {}\n    reproduce: {}", r.seed, why, r.reproduce);
}

int run_sweep(const SimOptions& o, const ModelWeights& weights) {
  prepare_backend_environment(o.backend, o.tp_degree);  // before CUDA starts
  const auto [first, last] = parse_seed_range(o.seeds, "--seeds");
  const Shard shard = parse_shard(o.shard);
  const sim::SimOverrides overrides = overrides_of(o);
  const sim::WorldOptions world = world_options(o);
  const std::string range = fmt::format("{}..{}", first, last);
  const std::string label = o.shard.empty() ? range : fmt::format("{} shard {}/{}", range, shard.index, shard.count);
  ResultFiles files(o, "lockstep sim " + label);
  const std::vector<uint64_t> seeds = shard_seeds(first, last, shard);
  std::vector<std::string> failed;
  int64_t steps = 0, tokens = 0, retractions = 0, faults = 0;
  const auto start = std::chrono::steady_clock::now();
  ProgressLine progress;
  for (size_t done = 0; done < seeds.size(); ++done) {
    const sim::SimParams params = sim::derive_params(seeds[done], overrides);
    const auto seed_start = std::chrono::steady_clock::now();
    const sim::SeedVerdict v = sim::run_seed(params, weights, world, !o.no_twin);
    SeedResult result = seed_result_of(params, v, reproduce(o, params, overrides), seconds_since(seed_start));
    steps += v.summary.steps_count;
    tokens += v.summary.tokens_generated;
    retractions += v.summary.retractions_swap + v.summary.retractions_recompute;
    for (int64_t n : v.summary.faults_fired) faults += n;
    if (!result.passed()) failed.push_back(failure_line(result));
    files.add(std::move(result));
    progress.show(fmt::format("sim: [{:<30}] {}/{} seeds, {} failed",
                              std::string(30 * (done + 1) / seeds.size(), '#'), done + 1,
                              seeds.size(), failed.size()),
                  static_cast<double>(done + 1) / static_cast<double>(seeds.size()));
  }
  files.close();
  const double seconds = seconds_since(start);
  progress.finish(/*keep=*/true);
  fmt::print("{:<10} {:>8} {:>10} {:>10} {:>12} {:>8} {:>9} {:>8}\n", "seeds", "failed", "steps", "tokens",
             "retractions", "faults", "seconds", "run");
  fmt::print("{:<10} {:>8} {:>10} {:>10} {:>12} {:>8} {:>9.1f} {:>8}\n", label, failed.size(), steps, tokens,
             retractions, faults, seconds, seeds.size());
  for (const std::string& f : failed) fmt::print("FAILED {}\n", f);
  return failed.empty() ? kExitOk : kExitFinding;
}

}  // namespace

std::function<int()> add_sim_command(CLI::App& app) {
  auto o = std::make_shared<SimOptions>();
  CLI::App* cmd = app.add_subcommand(
      "sim", "Run a deterministic simulated serving world (scheduler + executor on the CPU "
             "reference, or --backend) from a seed, with checkers after every step and a "
             "twin-run check");
  CLI::Option* seed = cmd->add_option("--seed", o->seed, "The seed that derives every parameter of the world")
                          ->check(unsigned_64())
                          ->capture_default_str();
  cmd->add_option("--seeds", o->seeds, "A sweep over seeds A..B (inclusive) with a summary table");
  cmd->add_option("--requests", o->requests, "Requests in the world (default: derived from the seed)")
      ->check(integer_in(1, 100000, "requests"));
  cmd->add_option("--faults", o->faults,
                  "Fault sites: none, all, or a comma list of nan-logits, oov-sample, "
                  "page-pressure, abort-mid-prefill, context-limit, late-result (default: the "
                  "seed switches each on with probability 1/2)");
  cmd->add_option("--record", o->record, "Record the run (single seed) to this trace file");
  cmd->add_flag("--record-activations", o->record_activations, kRecordActivationsHelp);
  cmd->add_option("--shard", o->shard,
                  "With --seeds A..B: run shard I of N (I/N, 0 <= I < N), the seeds whose index "
                  "seed - A is I mod N; a seed's result does not depend on N");
  cmd->add_option("--results", o->results,
                  "Write one JSON line per seed: seed, verdict, failures, fingerprints, the "
                  "reproduce command, wall time, derived parameters, summary");
  cmd->add_option("--junit", o->junit, "Write JUnit XML, one test case per seed");
  cmd->add_flag("--stub-model", o->stub_model,
                "Replace the model arithmetic with cheap deterministic logits (control plane only)");
  cmd->add_flag("--no-twin", o->no_twin, "Skip the twin run that re-runs each seed and compares fingerprints");
  cmd->add_flag("--spec", o->spec,
                "Speculative decoding: the seed draws W in 2..8 and a drafter (n-gram or oracle-mix)");
  cmd->add_option("--drafter", o->drafter,
                  "With --spec: use this drafter (ngram, oracle-mix) instead of the seed's; W and "
                  "the oracle-mix acceptance stay the seed's (--backend cuda needs ngram)");
  cmd->add_option("--backend", o->backend,
                  fmt::format("Backend the world runs on ({}); cuda: bf16 with CUDA graphs, the "
                              "same weights, every fault site, the n-gram drafter (not "
                              "oracle-mix, not --stub-model)",
                              fmt::join(backend_names(), ", ")))
      ->check(backend_validator())
      ->capture_default_str();
  cmd->add_option("--determinism", o->determinism, kDeterminismHelp)
      ->check(CLI::IsMember({std::string("default"), std::string("invariant")}))
      ->capture_default_str();
  cmd->add_option("--tp", o->tp_degree,
                  "Tensor-parallel degree: the CPU reference simulates N ranks (Megatron sharding, "
                  "fixed-order all-reduce); --backend cuda runs N CUDA ranks (one per GPU over "
                  "NCCL, or all on GPU 0); the model (tiny) must shard N ways")
      ->check(CLI::Range(1, kTpDegreeMax))
      ->capture_default_str();
  cmd->add_option("--model", o->model,
                  fmt::format("The model the world runs, random weights from seed {}: {} (tiny-hybrid: "
                              "Mamba2 + attention, TP 1)", kSimWeightsSeed, fmt::join(sim::sim_model_names(), ", ")))
      ->check(CLI::IsMember(sim::sim_model_names()))
      ->capture_default_str();
  cmd->footer(kExitStatusHelp);
  return [cmd, o, seed]() {
    if (!cmd->parsed()) return -1;
    LS_REQUIRE(seed->count() == 0 || o->seeds.empty(), "--seed {} and --seeds {}: give one of the two",
               o->seed, o->seeds);
    // The overrides refuse what the model cannot run (--tp on a hybrid) before a seed runs.
    sim::derive_params(o->seed, overrides_of(*o));
    const ModelWeights weights = weights_from_seed(model_config_named(o->model), kSimWeightsSeed);
    LS_REQUIRE(o->seeds.empty() || o->record.empty(), "--record takes a single --seed, not --seeds");
    LS_REQUIRE(!o->record_activations || !o->record.empty(),
               "--record-activations records into a trace: add --record FILE");
    LS_REQUIRE(o->shard.empty() || !o->seeds.empty(), "--shard {} splits a --seeds range: add --seeds A..B",
               o->shard);
    return o->seeds.empty() ? run_single(*o, weights) : run_sweep(*o, weights);
  };
}

}  // namespace ls::cli
