#include "proptest/properties.h"

#include "core/check.h"
#include "core/cpu_backend.h"
#include "core/serving_loop.h"
#include "proptest/generators.h"
#include "proptest/state_models.h"
#include "replay/replay.h"
#include "replay/trace_check.h"
#include "sim/sweep.h"
#include "sim/trace_recording.h"
#include "trace/reader.h"
#include "trace/recorder.h"
#include "trace/trace_observer.h"

#include <fmt/format.h>
#include <unistd.h>

#include <functional>
#include <map>

namespace ls::proptest {

namespace {

std::string property_id(const std::string& name, const PropertyConfig& c) {
  if (c.bug != BackendBug::kNone) {
    std::string slug(to_string(c.bug));
    for (char& ch : slug) ch = ch == ' ' ? '_' : ch;
    return name + "/planted_" + slug;
  }
  return c.planted ? name + "/planted" : name;
}

// A scratch trace for one case (overwritten by the next case).
std::filesystem::path scratch_trace(const std::string& tag) {
  std::filesystem::create_directories(failure_directory());
  return failure_directory() / fmt::format("scratch-{}-{}.trace", tag, getpid());
}

using ScriptBody = std::function<std::string(const Script&, const PropertyConfig&)>;
using ScriptRecord = std::function<std::string(const Script&, const PropertyConfig&, const std::filesystem::path&)>;

// The default recording: the script's run on the (possibly broken) backend, invariants on, so the
// trace ends at the step that broke one.
std::string record_run(const Script& s, const PropertyConfig& c, const std::filesystem::path& path) {
  RunOptions o{.bug = c.bug, .trace_path = path};
  const RunResult r = run_script(s, o);
  return r.failure ? fmt::format("the recorded run stops at {}", *r.failure) : std::string();
}

Outcome script_property(const std::string& name, const PropertyConfig& config, const ScriptShape& shape,
                        const ScriptBody& body, const ScriptRecord& record = record_run) {
  const std::string id = property_id(name, config);
  LastFailure<std::pair<Script, std::string>> last;
  Outcome outcome = check_property(id, config, [&] {
    const Script s = *gen_script(shape);
    const std::string failure = body(s, config);
    if (!failure.empty()) {
      last.set({s, failure});
      RC_FAIL(failure + "\n" + describe(s));
    }
  });
  if (!outcome.passed && last.get() && config.record_failure) {
    const auto& [script, failure] = *last.get();
    const std::filesystem::path path = failure_trace_path(id, fnv1a(describe(script) + failure));
    attach_trace(outcome, path, record(script, config, path));
  }
  return outcome;
}

RunOptions quiet(const PropertyConfig& c) {
  return RunOptions{.bug = c.bug, .check_invariants = false, .faults = false};
}

ScriptShape metamorphic_shape() {
  ScriptShape s;
  s.widths = {1};
  s.faults = false;
  s.retract = false;
  return s;
}

// Records the base and the variant of a metamorphic pair: `<path>` is the variant.
ScriptRecord record_pair(std::function<Script(const Script&)> base_of) {
  return [base_of](const Script& s, const PropertyConfig& c, const std::filesystem::path& path) {
    RunOptions o = quiet(c);
    o.trace_path = path;
    run_script(s, o);
    std::filesystem::path base_path = path;
    base_path.replace_extension(".base.trace");
    o.trace_path = base_path;
    run_script(base_of(s), o);
    return fmt::format("the run it is compared with is {}; `lockstep replay --isolate REQUEST` "
                       "replays one request alone", base_path.string());
  };
}

}  // namespace

// ------------------------------------------------------------------------- invariants, contract

Outcome prop_executor_invariants(const PropertyConfig& config) {
  ScriptShape shape;
  return script_property("executor_invariants", config, shape, [](const Script& s, const PropertyConfig& c) {
    const RunResult r = run_script(s, RunOptions{.bug = c.bug});
    return r.failure.value_or("");
  });
}

Outcome prop_op_contract(const PropertyConfig& config) {
  ScriptShape shape;
  shape.invalid_rate = 1;
  shape.steps_max = 16;
  return script_property("op_contract", config, shape, [](const Script& s, const PropertyConfig& c) {
    RunOptions o{.bug = c.bug, .check_invariants = false};
    o.lenient_front = c.planted;
    const RunResult r = run_script(s, o);
    return r.failure.value_or("");
  });
}

// ------------------------------------------------------------------------- metamorphic

Outcome prop_co_batch_invariance(const PropertyConfig& config) {
  ScriptShape shape = metamorphic_shape();
  shape.requests_min = 2;
  auto alone = [](const Script& s, size_t k) {
    Script solo = s;
    solo.requests = {s.requests[k]};
    return solo;
  };
  return script_property(
      "co_batch_invariance", config, shape,
      [alone](const Script& s, const PropertyConfig& c) {
        const RunResult together = run_script(s, quiet(c));
        for (size_t k = 0; k < s.requests.size() && k < 3; ++k) {
          const RunResult solo = run_script(alone(s, k), quiet(c));
          const std::string diff = compare_outputs(together.outputs, solo.outputs, "co-batched", "alone");
          if (!diff.empty()) return diff;
        }
        return std::string();
      },
      record_pair([alone](const Script& s) { return alone(s, 0); }));
}

namespace {
Script one_chunk(const Script& s) {
  Script v = s;
  for (StepChoice& c : v.steps) c.chunk_tokens = 64;
  return v;
}
Script first_rows(const Script& s) {
  Script v = s;
  for (StepChoice& c : v.steps) c.pool_row_pick = 0;
  return v;
}
Script no_retraction(const Script& s) {
  Script v = s;
  for (StepChoice& c : v.steps) c.retract = -1;
  return v;
}

ScriptBody compare_with(std::function<Script(const Script&)> base_of, std::string base_name,
                        std::string variant_name) {
  return [=](const Script& s, const PropertyConfig& c) {
    const RunResult variant = run_script(s, quiet(c));
    const RunResult base = run_script(base_of(s), quiet(c));
    if (variant.failure) return *variant.failure;
    return compare_outputs(base.outputs, variant.outputs, base_name, variant_name);
  };
}
}  // namespace

Outcome prop_chunking_invariance(const PropertyConfig& config) {
  return script_property("chunking_invariance", config, metamorphic_shape(),
                         compare_with(one_chunk, "one chunk", "chunked"), record_pair(one_chunk));
}

Outcome prop_pool_row_invariance(const PropertyConfig& config) {
  return script_property("pool_row_invariance", config, metamorphic_shape(),
                         compare_with(first_rows, "lowest free rows", "other rows"), record_pair(first_rows));
}

Outcome prop_retraction_invariance(const PropertyConfig& config) {
  ScriptShape shape = metamorphic_shape();
  shape.retract = true;
  return script_property("retraction_invariance", config, shape,
                         compare_with(no_retraction, "uninterrupted", "retracted and recovered"),
                         record_pair(no_retraction));
}

// ------------------------------------------------------------------------- overlap (scheduler)

namespace {

struct ServingCase {
  SchedulerConfig config;
  std::vector<RequestSpec> requests;
};

std::map<RequestId, std::vector<int32_t>> serve(const ServingCase& sc, BackendBug bug,
                                                const std::optional<std::filesystem::path>& trace_path) {
  Scheduler scheduler(sc.config);
  const ExecutorConfig ec = executor_config_for(sc.config);
  BrokenBackend backend(std::make_unique<CpuBackend>(tiny_weights(), ec), bug, ec);
  Executor executor(ec, tiny_vocab(), backend, trace::recording_executor_options());
  for (const RequestSpec& r : sc.requests) scheduler.submit(r, tiny_vocab());
  std::unique_ptr<trace::Recorder> recorder;
  std::optional<trace::TraceObserver> observer;
  ServingLoopOptions options;
  if (trace_path) {
    recorder = trace::Recorder::open(
        *trace_path, trace::make_trace_header(tiny_weights(), WeightSource{.seed = kWeightsSeed}, ec, "cpu"),
        trace::RecorderOptions{.fsync_on_close = false});
    observer.emplace(*recorder);
    options.observer = &*observer;
  }
  run_serving_loop(scheduler, executor, options);
  if (recorder) recorder->close();
  std::map<RequestId, std::vector<int32_t>> out;
  for (const auto& [id, outcome] : scheduler.outcomes()) out[id] = outcome.tokens;
  return out;
}

rc::Gen<ServingCase> gen_serving_case(bool tight_pages) {
  return rc::gen::exec([tight_pages] {
    ServingCase sc;
    sc.config.max_batch_rows = *rc::gen::inRange(2, 7);
    sc.config.prefill_chunk_tokens = *rc::gen::inRange(8, 65);
    sc.config.page_size = 4;
    sc.config.context_length = 48;
    sc.config.verify_width = 1;
    sc.config.pages_count = tight_pages ? *rc::gen::inRange(16, 40) : 200;
    sc.config.host_pages_count = tight_pages && *rc::gen::arbitrary<bool>() ? 24 : 0;
    sc.config.mixed_batches = *rc::gen::inRange(0, 4) != 3;
    sc.config.prefix_cache = *rc::gen::inRange(0, 4) != 3;
    sc.requests = *gen_request_specs(5, false);
    return sc;
  });
}

std::string compare_tokens(const std::map<RequestId, std::vector<int32_t>>& a,
                           const std::map<RequestId, std::vector<int32_t>>& b, const char* a_name,
                           const char* b_name) {
  for (const auto& [id, tokens] : a) {
    const auto it = b.find(id);
    if (it == b.end()) return fmt::format("request {} finished {} but not {}", id, a_name, b_name);
    if (tokens != it->second) {
      size_t k = 0;
      while (k < tokens.size() && k < it->second.size() && tokens[k] == it->second[k]) ++k;
      return fmt::format("request {} differs at token {}: {} has {} tokens, {} has {}", id, k, a_name,
                         tokens.size(), b_name, it->second.size());
    }
  }
  return {};
}

}  // namespace

Outcome prop_overlap_invariance(const PropertyConfig& config) {
  const std::string id = property_id("overlap_invariance", config);
  LastFailure<ServingCase> last;
  Outcome outcome = check_property(id, config, [&] {
    ServingCase sc = *gen_serving_case(true);
    sc.config.overlap = true;
    const auto on = serve(sc, config.bug, std::nullopt);
    ServingCase off_case = sc;
    off_case.config.overlap = false;
    const auto off = serve(off_case, config.bug, std::nullopt);
    const std::string diff = compare_tokens(off, on, "overlap off", "overlap on");
    if (!diff.empty()) {
      last.set(sc);
      RC_FAIL(diff);
    }
  });
  if (!outcome.passed && last.get() && config.record_failure) {
    ServingCase sc = *last.get();
    const auto path = failure_trace_path(id, fnv1a(fmt::format("{}", sc.requests.size())));
    serve(sc, config.bug, path);
    std::filesystem::path off_path = path;
    off_path.replace_extension(".overlap-off.trace");
    sc.config.overlap = false;
    serve(sc, config.bug, off_path);
    attach_trace(outcome, path, "overlap on; the overlap-off run is " + off_path.string());
  }
  return outcome;
}

// ------------------------------------------------------------------------- run-ahead (executor)

namespace {

struct RunAheadServed {
  std::map<RequestId, std::vector<int32_t>> tokens;
  int64_t steps = 0;
  int32_t max_in_flight = 0;
};

// The serving loop with overlap on over a backend that runs ahead: plan k, submit k, collect and
// apply k − 1 (`single_result_slot`: the planted bug, results of steps in flight share a slot).
RunAheadServed serve_run_ahead(const ServingCase& sc, bool single_result_slot) {
  Scheduler scheduler(sc.config);
  const ExecutorConfig ec = executor_config_for(sc.config);
  RunAheadBackend backend(std::make_unique<CpuBackend>(tiny_weights(), ec), single_result_slot);
  Executor executor(ec, tiny_vocab(), backend, trace::recording_executor_options());
  for (const RequestSpec& r : sc.requests) scheduler.submit(r, tiny_vocab());
  run_serving_loop(scheduler, executor, ServingLoopOptions{});
  RunAheadServed out;
  for (const auto& [id, outcome] : scheduler.outcomes()) out.tokens[id] = outcome.tokens;
  out.steps = backend.steps_enqueued();
  out.max_in_flight = backend.max_in_flight();
  return out;
}

}  // namespace

// Running ahead changes nothing a request sees: the serving loop over a backend that runs ahead
// (two steps in flight) gives every request the tokens of the same workload run one step at a
// time on the CPU reference, under page pressure, swap and recompute retraction, mixed batches
// and prefix hits. `config.planted`: a backend whose steps in flight share one result slot.
Outcome prop_run_ahead_invariance(const PropertyConfig& config) {
  const std::string id = property_id("run_ahead_invariance", config);
  return check_property(id, config, [&] {
    ServingCase sc = *gen_serving_case(true);
    sc.config.overlap = true;  // run-ahead needs the scheduler's overlap
    const auto one_at_a_time = serve(sc, BackendBug::kNone, std::nullopt);
    const RunAheadServed ahead = serve_run_ahead(sc, config.planted);
    // Not vacuous: every step after the first was submitted before its predecessor was collected.
    RC_ASSERT(ahead.steps < 2 || ahead.max_in_flight == 2);
    const std::string diff =
        compare_tokens(one_at_a_time, ahead.tokens, "one step at a time", "running ahead");
    if (!diff.empty()) RC_FAIL(diff);
    RC_ASSERT(one_at_a_time.size() == ahead.tokens.size());
  });
}

// ------------------------------------------------------------------------- traces

Outcome prop_record_replay_identical(const PropertyConfig& config) {
  ScriptShape shape;
  shape.invalid_rate = 8;
  return script_property("record_replay_identical", config, shape, [](const Script& s, const PropertyConfig& c) {
    const std::filesystem::path path = scratch_trace("replay");
    RunOptions o{.bug = c.bug, .check_invariants = false, .trace_path = path};
    run_script(s, o);
    const replay::ReplayReport report = replay::replay_trace(path, {});
    std::filesystem::remove(path);
    if (report.identical()) return std::string();
    return report.divergence ? "replay diverges: " + report.divergence->describe()
                             : std::string("replay is not identical");
  }, [](const Script& s, const PropertyConfig& c, const std::filesystem::path& path) {
    run_script(s, RunOptions{.bug = c.bug, .check_invariants = false, .trace_path = path});
    return std::string("recorded on the backend under test; replay re-executes it on the CPU reference");
  });
}

Outcome prop_trace_check_clean(const PropertyConfig& config) {
  ScriptShape shape;
  shape.invalid_rate = 8;
  return script_property("trace_check_clean", config, shape, [](const Script& s, const PropertyConfig& c) {
    const std::filesystem::path path = scratch_trace("check");
    run_script(s, RunOptions{.bug = c.bug, .check_invariants = false, .trace_path = path});
    const replay::CheckReport report = replay::check_trace(path);
    std::filesystem::remove(path);
    return report.violation ? "lockstep check: " + report.violation->describe() : std::string();
  }, [](const Script& s, const PropertyConfig& c, const std::filesystem::path& path) {
    run_script(s, RunOptions{.bug = c.bug, .check_invariants = false, .trace_path = path});
    return std::string();
  });
}

Outcome prop_sim_fingerprint(const PropertyConfig& config) {
  const std::string id = property_id("sim_fingerprint", config);
  LastFailure<uint64_t> last;
  Outcome outcome = check_property(id, config, [&] {
    const uint64_t seed = *rc::gen::inRange<uint64_t>(1, 1'000'000);
    sim::SimOverrides overrides;
    overrides.requests_count = 4;
    const sim::SimParams params = sim::derive_params(seed, overrides);
    const sim::SeedVerdict a = sim::run_seed(params, tiny_weights(), {}, /*twin=*/false);
    // The twin: the same seed again — or, planted, a world whose model differs (the stub model).
    const sim::SeedVerdict b =
        sim::run_seed(params, tiny_weights(), sim::WorldOptions{.stub_model = config.planted}, false);
    if (a.summary.fingerprint != b.summary.fingerprint || !a.summary.passed()) {
      last.set(seed);
      RC_FAIL(fmt::format("seed {}: fingerprints {:016x} and {:016x}{}; reproduce: {}", seed,
                          a.summary.fingerprint, b.summary.fingerprint,
                          a.summary.passed() ? "" : ", checker " + a.summary.failures[0].checker,
                          sim::reproduce_command(params, overrides)));
    }
  });
  if (!outcome.passed && last.get() && config.record_failure) {
    sim::SimOverrides overrides;
    overrides.requests_count = 4;
    const sim::SimParams params = sim::derive_params(*last.get(), overrides);
    const auto path = failure_trace_path(id, *last.get());
    const ExecutorConfig ec = sim::executor_config_for(params);
    auto recorder = trace::Recorder::open(
        path, trace::make_trace_header(tiny_weights(), WeightSource{.seed = kWeightsSeed}, ec, "cpu"),
        trace::RecorderOptions{.fsync_on_close = false});
    sim::SimTraceObserver observer(*recorder);
    sim::run_world(params, tiny_weights(), sim::WorldOptions{.observer = &observer,
                                                             .executor_options = trace::recording_executor_options()});
    recorder->close();
    attach_trace(outcome, path, "the first run of the seed");
  }
  return outcome;
}

Outcome prop_sim_trace_check_clean(const PropertyConfig& config) {
  const std::string id = property_id("sim_trace_check_clean", config);
  return check_property(id, config, [&] {
    const uint64_t seed = *rc::gen::inRange<uint64_t>(1, 1'000'000);
    sim::SimOverrides overrides;
    overrides.requests_count = 6;
    const sim::SimParams params = sim::derive_params(seed, overrides);
    const std::filesystem::path path = failure_trace_path(id, seed);
    const ExecutorConfig ec = sim::executor_config_for(params);
    {
      auto recorder = trace::Recorder::open(
          path, trace::make_trace_header(tiny_weights(), WeightSource{.seed = kWeightsSeed}, ec, "cpu"),
          trace::RecorderOptions{.fsync_on_close = false});
      sim::SimTraceObserver observer(*recorder);
      sim::run_world(params, tiny_weights(),
                     sim::WorldOptions{.observer = &observer, .executor_options = trace::recording_executor_options()});
      recorder->close();
    }
    const replay::CheckReport report = replay::check_trace(path);
    if (report.violation) {
      RC_FAIL(fmt::format("{}\nsimulator seed {} ({}); the trace is kept: lockstep check {}",
                          report.violation->describe(), seed, sim::reproduce_command(params, overrides),
                          path.string()));
    }
    std::filesystem::remove(path);
  });
}

// Traces as input: record a serving-loop run of generated traffic, read the trace back, rebuild
// each request (prompt, sampling, tokens) from its records, then re-execute the same requests
// under generated re-chunking, re-batching, pool-row moves and retraction, and compare tokens and
// logits digests with the recording.
namespace {

struct RecordedRequest {
  RequestScript script;
  RequestOutput output;
};

std::map<RequestId, RecordedRequest> read_requests(const std::filesystem::path& path) {
  trace::TraceReader reader = trace::TraceReader::open(path);
  std::map<RequestId, RecordedRequest> requests;
  std::deque<ForwardOp> open;
  trace::TraceRecord record;
  while (reader.next(record)) {
    if (auto* in = std::get_if<trace::StepInputRecord>(&record)) {
      int32_t offset = 0;
      for (const OpRow& row : in->op.rows) {
        RecordedRequest& r = requests[row.request_id];
        r.script.id = row.request_id;
        if (row.sampling && r.script.prompt.empty()) r.script.sampling = *row.sampling;
        if (row.kind == RowKind::kPrefill) {
          if (static_cast<int32_t>(r.script.prompt.size()) == row.prefix_length) {
            r.script.prompt.insert(r.script.prompt.end(), in->op.prefill_token_ids.begin() + offset,
                                   in->op.prefill_token_ids.begin() + offset + row.input_length);
          }
          offset += row.input_length;
        }
      }
      open.push_back(std::move(in->op));
    } else if (auto* out = std::get_if<trace::StepOutputRecord>(&record)) {
      const ForwardOp op = std::move(open.front());
      open.pop_front();
      const int32_t ne = op.prefill_rows_count();
      const int32_t w = out->result.verify_width;
      for (int32_t i = 0; i < op.rows_count(); ++i) {
        const OpRow& row = op.rows[i];
        RecordedRequest& r = requests[row.request_id];
        if (i < ne && row.prefix_length + row.input_length != row.prompt_length) continue;
        const int32_t first = i < ne ? i : ne + (i - ne) * w;
        for (int32_t j = 0; j < out->result.accepted_lengths[i]; ++j) {
          r.output.tokens.push_back(out->result.tokens[first + j]);
          r.output.logits_digests.push_back(out->logits_digests[first + j]);
        }
      }
    }
  }
  for (auto& [id, r] : requests) r.script.max_new_tokens = static_cast<int32_t>(r.output.tokens.size());
  return requests;
}

}  // namespace

Outcome prop_trace_mutation(const PropertyConfig& config) {
  const std::string id = property_id("trace_mutation", config);
  LastFailure<Script> last;
  Outcome outcome = check_property(id, config, [&] {
    ServingCase sc = *gen_serving_case(false);
    sc.config.overlap = false;
    sc.config.prefix_cache = false;  // a prefix hit's tokens are not in the trace
    const std::filesystem::path path = scratch_trace("mutation");
    serve(sc, BackendBug::kNone, path);
    const std::map<RequestId, RecordedRequest> recorded = read_requests(path);
    std::filesystem::remove(path);
    // The same requests under generated chunking, batching, pool rows and retraction.
    Script s;
    s.config = script_config(sc.config.max_batch_rows, 1);
    std::map<RequestId, RequestOutput> expected;
    for (const auto& [rid, r] : recorded) {
      RC_ASSERT(!r.script.prompt.empty());
      RC_ASSERT(r.script.max_new_tokens >= 1);
      s.requests.push_back(r.script);
      expected[rid] = r.output;
    }
    ScriptShape shape = metamorphic_shape();
    shape.retract = true;
    const int32_t steps = *rc::gen::inRange(0, 24);
    s.steps = *rc::gen::container<std::vector<StepChoice>>(static_cast<size_t>(steps), gen_choice(shape));
    const RunResult mutated = run_script(s, quiet(config));
    const std::string diff = mutated.failure.value_or(compare_outputs(expected, mutated.outputs, "recorded", "mutated"));
    if (!diff.empty()) {
      last.set(s);
      RC_FAIL(diff);
    }
  });
  if (!outcome.passed && last.get() && config.record_failure) {
    const auto path = failure_trace_path(id, fnv1a(describe(*last.get())));
    RunOptions o = quiet(config);
    o.trace_path = path;
    run_script(*last.get(), o);
    attach_trace(outcome, path, "the mutated re-execution");
  }
  return outcome;
}

// ------------------------------------------------------------------------- the suite

const std::vector<PropertyEntry>& all_properties() {
  static const std::vector<PropertyEntry> entries = {
      {"allocator_model", prop_allocator_model, 1600},
      {"scheduler_model", prop_scheduler_model, 800},
      {"executor_invariants", prop_executor_invariants, 1600},
      {"op_contract", prop_op_contract, 800},
      {"co_batch_invariance", prop_co_batch_invariance, 480},
      {"chunking_invariance", prop_chunking_invariance, 600},
      {"pool_row_invariance", prop_pool_row_invariance, 600},
      {"retraction_invariance", prop_retraction_invariance, 800},
      {"overlap_invariance", prop_overlap_invariance, 480},
      {"run_ahead_invariance", prop_run_ahead_invariance, 300},
      {"record_replay_identical", prop_record_replay_identical, 400},
      {"trace_check_clean", prop_trace_check_clean, 600},
      {"sim_fingerprint", prop_sim_fingerprint, 80},
      {"trace_mutation", prop_trace_mutation, 400},
      {"sim_trace_check_clean", prop_sim_trace_check_clean, 80},
  };
  return entries;
}

}  // namespace ls::proptest
