// Record → replay on the CPU reference: bit-identical for simulated workloads, and a planted
// change in a copy of a trace is reported at exactly its step, request and field.
#include "core/check.h"
#include "core/model/weights.h"
#include "replay/replay.h"
#include "sim/sweep.h"
#include "sim/trace_recording.h"
#include "trace/reader.h"
#include "trace/recorder.h"
#include "trace/trace_observer.h"
#include "core/cpu_backend.h"
#include "core/serving_loop.h"
#include "tests/test_support.h"

#include <gtest/gtest.h>

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <functional>

namespace ls {
namespace {

namespace fs = std::filesystem;

using testing::kSimWeightsSeed;
using testing::sim_weights;

// One directory per process: ctest runs each test case as its own process, in parallel.
fs::path temp_path(const std::string& name) {
  const fs::path dir = fs::temp_directory_path() / fmt::format("lockstep-replay-test-{}", ::getpid());
  fs::create_directories(dir);
  return dir / name;
}

// Records simulator seed `seed` to `path`.
sim::SimSummary record_seed(uint64_t seed, const sim::SimOverrides& overrides, const fs::path& path) {
  const sim::SimParams params = sim::derive_params(seed, overrides);
  const WeightSource source{WeightSource::Kind::kSeed, kSimWeightsSeed, ""};
  const ModelWeights& weights = sim_weights(params.model);
  auto recorder = trace::Recorder::open(
      path, trace::make_trace_header(weights, source, sim::executor_config_for(params), "cpu"));
  sim::SimTraceObserver observer(*recorder);
  sim::WorldOptions world{.observer = &observer, .executor_options = trace::recording_executor_options()};
  const sim::SimSummary summary = sim::run_world(params, weights, world);
  recorder->close();
  return summary;
}

TEST(RecordReplay, FiftySimulatedWorkloadsReplayBitIdentical) {
  int64_t steps = 0;
  for (uint64_t seed = 1; seed <= 50; ++seed) {
    const fs::path path = temp_path("seed-" + std::to_string(seed) + ".trace");
    const sim::SimSummary s = record_seed(seed, {}, path);
    ASSERT_TRUE(s.passed()) << "seed " << seed;
    const replay::ReplayReport r = replay::replay_trace(path, {});
    ASSERT_FALSE(r.divergence) << "seed " << seed << ": " << r.divergence->describe();
    ASSERT_GT(r.steps_compared, 0);
    EXPECT_EQ(r.steps_compared, r.steps_replayed);
    EXPECT_FALSE(r.truncation);
    steps += r.steps_compared;
    fs::remove(path);
  }
  EXPECT_GT(steps, 500);
}

// Without faults: a planted out-of-vocab sample makes the recorded (clamped) token differ from the
// one the device kept, and teacher forcing feeds back the recorded one.
TEST(RecordReplay, TeacherForcedAgreesFullyOnItsOwnBackend) {
  const fs::path path = temp_path("teacher.trace");
  sim::SimOverrides no_faults;
  no_faults.faults_enabled = false;
  record_seed(11, no_faults, path);
  replay::ReplayOptions options;
  options.mode = replay::ReplayMode::kTeacherForced;
  const replay::ReplayReport r = replay::replay_trace(path, options);
  EXPECT_GT(r.tokens_count, 0);
  EXPECT_EQ(r.tokens_equal, r.tokens_count);
  EXPECT_EQ(r.logit_delta_max, 0.0f);
}

// Copies a trace record by record, letting `edit` change any record on the way.
void rewrite(const fs::path& from, const fs::path& to,
             const std::function<void(trace::TraceRecord&)>& edit) {
  trace::TraceReader reader = trace::TraceReader::open(from);
  auto recorder = trace::Recorder::open(to, reader.header());
  trace::TraceRecord record;
  while (reader.next(record)) {
    edit(record);
    if (auto* in = std::get_if<trace::StepInputRecord>(&record)) {
      recorder->record_input(std::move(*in));
    } else if (auto* out = std::get_if<trace::StepOutputRecord>(&record)) {
      recorder->record_output(std::move(*out));
    } else if (auto* e = std::get_if<trace::TraceEvent>(&record)) {
      recorder->record_event(std::move(*e));
    }
  }
  recorder->close();
}

struct Planted {
  int64_t step = -1;
  RequestId request = 0;
};

class PlantedDivergence : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    SimOverridesNone();
    record_seed(3, overrides_, original());
  }
  static void SimOverridesNone() { overrides_.faults_enabled = false; }
  static fs::path original() { return temp_path("planted-original.trace"); }
  static inline sim::SimOverrides overrides_;

  // Replays the edited copy and checks the divergence names the planted step, request and field.
  void expect_divergence(const Planted& planted, const char* field, const fs::path& copy) {
    ASSERT_GE(planted.step, 0) << "nothing was planted";
    const replay::ReplayReport r = replay::replay_trace(copy, {});
    ASSERT_TRUE(r.divergence) << "the planted change went unnoticed";
    EXPECT_EQ(r.divergence->step, planted.step);
    EXPECT_EQ(r.divergence->request_id, planted.request);
    EXPECT_EQ(r.divergence->field, field);
  }
};

// The step input each output belongs to, so an edit of an output can name its request.
TEST_F(PlantedDivergence, OneTokenIsReportedAtItsStepRequestAndField) {
  Planted planted;
  const fs::path copy = temp_path("planted-token.trace");
  ForwardOp last_op;
  rewrite(original(), copy, [&](trace::TraceRecord& r) {
    if (auto* in = std::get_if<trace::StepInputRecord>(&r)) last_op = in->op;
    auto* out = std::get_if<trace::StepOutputRecord>(&r);
    if (!out || planted.step >= 0 || out->step < 20 || last_op.rows.size() < 2) return;
    out->result.tokens[1] = (out->result.tokens[1] + 1) % 512;
    planted = {out->step, last_op.rows[1].request_id};
  });
  expect_divergence(planted, "tokens", copy);
}

TEST_F(PlantedDivergence, OneVclIsReportedAtItsStepRequestAndField) {
  Planted planted;
  const fs::path copy = temp_path("planted-vcl.trace");
  ForwardOp last_op;
  rewrite(original(), copy, [&](trace::TraceRecord& r) {
    if (auto* in = std::get_if<trace::StepInputRecord>(&r)) last_op = in->op;
    auto* out = std::get_if<trace::StepOutputRecord>(&r);
    if (!out || planted.step >= 0 || out->step < 15) return;
    const size_t row = out->valid_cache_lengths.size() - 1;
    out->valid_cache_lengths[row] -= 1;
    planted = {out->step, last_op.rows[row].request_id};
  });
  expect_divergence(planted, "valid_cache_length", copy);
}

TEST_F(PlantedDivergence, OneLogitsDigestIsReportedAtItsStepRequestAndField) {
  Planted planted;
  const fs::path copy = temp_path("planted-logits.trace");
  ForwardOp last_op;
  rewrite(original(), copy, [&](trace::TraceRecord& r) {
    if (auto* in = std::get_if<trace::StepInputRecord>(&r)) last_op = in->op;
    auto* out = std::get_if<trace::StepOutputRecord>(&r);
    if (!out || planted.step >= 0 || out->step < 10) return;
    out->logits_digests[0] ^= 1;
    planted = {out->step, last_op.rows[0].request_id};
  });
  expect_divergence(planted, "logits_digest", copy);
}

// A hybrid's recorded run: its state digests replay bit for bit, and one changed digest is named
// at its step, request and field (the state of a working slot differs).
TEST(PlantedStateDivergence, OneMambaStateDigestIsReportedAtItsStepRequestAndField) {
  sim::SimOverrides hybrid;
  hybrid.model = "tiny-hybrid";
  hybrid.faults_enabled = false;
  const fs::path path = temp_path("hybrid.trace");
  ASSERT_TRUE(record_seed(5, hybrid, path).passed());
  EXPECT_TRUE(trace::TraceReader::open(path).header().mamba_state_digests);
  const replay::ReplayReport clean = replay::replay_trace(path, {});
  ASSERT_FALSE(clean.divergence) << clean.divergence->describe();
  ASSERT_GT(clean.steps_compared, 10);
  Planted planted;
  const fs::path copy = temp_path("hybrid-planted.trace");
  ForwardOp last_op;
  rewrite(path, copy, [&](trace::TraceRecord& r) {
    if (auto* in = std::get_if<trace::StepInputRecord>(&r)) last_op = in->op;
    auto* out = std::get_if<trace::StepOutputRecord>(&r);
    if (!out || planted.step >= 0 || out->step < 10 || last_op.rows.empty()) return;
    const size_t row = out->mamba_state_digests.size() - 1;
    out->mamba_state_digests[row] ^= uint64_t{1} << 40;
    planted = {out->step, last_op.rows[row].request_id};
  });
  ASSERT_GE(planted.step, 0);
  const replay::ReplayReport r = replay::replay_trace(copy, {});
  ASSERT_TRUE(r.divergence) << "the planted change went unnoticed";
  EXPECT_EQ(r.divergence->step, planted.step);
  EXPECT_EQ(r.divergence->request_id, planted.request);
  EXPECT_EQ(r.divergence->field, "mamba_state_digest");
}

// Records two requests through the production serving loop: 7 greedy, 8 sampling at T = 1.
fs::path record_sampling_run() {
  const fs::path path = temp_path("sampling.trace");
  SchedulerConfig sc{{.max_batch_rows = 4, .context_length = 128, .page_size = 8, .pages_count = 64,
                      .prefill_chunk_tokens = 32}};
  const ExecutorConfig limits = executor_config_for(sc);
  Scheduler scheduler(sc);
  scheduler.submit({.id = 7, .prompt = {5, 6, 7, 8, 9}, .max_new_tokens = 6}, 512);
  scheduler.submit({.id = 8, .prompt = {11, 12, 13}, .max_new_tokens = 6,
                    .sampling = {.temperature = 1.0f, .seed = 5}}, 512);
  CpuBackend backend(sim_weights(), limits);
  Executor executor(limits, 512, backend, trace::recording_executor_options());
  const WeightSource source{WeightSource::Kind::kSeed, kSimWeightsSeed, ""};
  auto recorder = trace::Recorder::open(path, trace::make_trace_header(sim_weights(), source, limits, "cpu"));
  trace::TraceObserver observer(*recorder);
  run_serving_loop(scheduler, executor, {.observer = &observer});
  recorder->close();
  return path;
}

// A changed seed in the input: the replay samples differently at exactly that step.
TEST_F(PlantedDivergence, OneSamplingSeedIsReportedAtItsStepRequestAndField) {
  Planted planted;
  const fs::path copy = temp_path("planted-seed.trace");
  rewrite(record_sampling_run(), copy, [&](trace::TraceRecord& r) {
    auto* in = std::get_if<trace::StepInputRecord>(&r);
    if (!in || planted.step >= 0) return;
    for (OpRow& row : in->op.rows) {
      if (row.request_id != 8 || !row.sampling) continue;
      // Seed 6 draws another first token than seed 5 for this prompt (the trace is fixed by its
      // inputs, so this holds on every run).
      row.sampling->seed = 6;
      planted = {in->step, row.request_id};
      return;
    }
  });
  expect_divergence(planted, "tokens", copy);
}

// ---- Retraction by swap on a hybrid: the state slot of a cache op (CacheOp::state_slot) ----

// Seed 14 of the hybrid world with every fault site on retracts three times by swap (its page
// pressure and host pages), each swap copying the request's working state with its pages.
sim::SimOverrides hybrid_with_every_fault() {
  sim::SimOverrides o;
  o.model = "tiny-hybrid";
  std::vector<sim::FaultSite> all;
  for (int i = 0; i < sim::kFaultSitesCount; ++i) all.push_back(static_cast<sim::FaultSite>(i));
  o.faults = all;
  return o;
}
constexpr uint64_t kHybridSwapSeed = 14;

// The cache ops of a trace, in order.
std::vector<CacheOp> cache_ops_of(const fs::path& path) {
  trace::TraceReader reader = trace::TraceReader::open(path);
  std::vector<CacheOp> ops;
  trace::TraceRecord record;
  while (reader.next(record)) {
    if (const auto* in = std::get_if<trace::StepInputRecord>(&record)) {
      ops.insert(ops.end(), in->cache_ops.begin(), in->cache_ops.end());
    }
  }
  return ops;
}

// Recorded with the swaps' state slots, the run replays IDENTICAL in exact mode; the same trace
// with the swap-ins' state slots dropped (-1: the state left behind) diverges, so replay does
// re-apply the recorded slot.
TEST(RecordReplay, AHybridRunThatSwapsItsStateReplaysIdentical) {
  const fs::path path = temp_path("hybrid-swap.trace");
  const sim::SimSummary summary = record_seed(kHybridSwapSeed, hybrid_with_every_fault(), path);
  ASSERT_TRUE(summary.passed());
  int32_t swap_outs = 0, swap_ins = 0;
  for (const CacheOp& c : cache_ops_of(path)) {
    EXPECT_GE(c.state_slot, 0) << "a hybrid's swap without its state";
    ++(c.kind == CacheOpKind::kSwapOut ? swap_outs : swap_ins);
  }
  ASSERT_GT(swap_outs, 0) << "seed " << kHybridSwapSeed << " no longer swaps";
  ASSERT_GT(swap_ins, 0);
  const replay::ReplayReport clean = replay::replay_trace(path, {});
  ASSERT_FALSE(clean.divergence) << clean.divergence->describe();
  EXPECT_EQ(clean.steps_compared, clean.steps_replayed);
  const fs::path copy = temp_path("hybrid-swap-no-state.trace");
  int64_t first_swap_in = -1;
  rewrite(path, copy, [&](trace::TraceRecord& r) {
    auto* in = std::get_if<trace::StepInputRecord>(&r);
    if (!in) return;
    for (CacheOp& c : in->cache_ops) {
      if (c.kind != CacheOpKind::kSwapIn) continue;
      c.state_slot = -1;
      if (first_swap_in < 0) first_swap_in = in->step;
    }
  });
  ASSERT_GE(first_swap_in, 0);
  const replay::ReplayReport dropped = replay::replay_trace(copy, {});
  ASSERT_TRUE(dropped.divergence) << "a swap-in without its state replayed identically";
  EXPECT_GE(dropped.divergence->step, first_swap_in);
}

// tests/fixtures/trace/format3-tiny-swap-no-state-slot.trace was recorded by the build before
// CacheOp.stateSlot existed (2cbf2ac: `lockstep sim --seed 11 --faults page-pressure --requests 6
// --no-twin --record …`): its cache ops lack the field, read -1, and it still replays IDENTICAL.
TEST(ReplayCompatibility, ATraceFromBeforeTheStateSlotStillReplays) {
  const fs::path fixture =
      fs::path(LOCKSTEP_SOURCE_DIR) / "tests/fixtures/trace/format3-tiny-swap-no-state-slot.trace";
  const std::vector<CacheOp> ops = cache_ops_of(fixture);
  ASSERT_GE(ops.size(), 2u) << "the fixture's swap out and back in";
  // Its weights digest is of the stream form (the only one before format version 5): replay
  // checks the weights it makes in that form.
  EXPECT_EQ(trace::TraceReader::open(fixture).header().weights_digest_form,
            WeightsDigestForm::kStream);
  for (const CacheOp& c : ops) EXPECT_EQ(c.state_slot, -1);
  const replay::ReplayReport r = replay::replay_trace(fixture, {});
  ASSERT_FALSE(r.divergence) << r.divergence->describe();
  EXPECT_EQ(r.steps_compared, 55);
}

// A verdict on another build's trace says so (the fixture above was written by 2cbf2ac); this
// build's traces and a foreign executor's carry no such note.
TEST(ReplayVerdict, ATraceFromAnotherBuildIsNamedAsSuch) {
  const fs::path fixture =
      fs::path(LOCKSTEP_SOURCE_DIR) / "tests/fixtures/trace/format3-tiny-swap-no-state-slot.trace";
  trace::TraceHeader header = trace::TraceReader::open(fixture).header();
  const std::optional<std::string> note = replay::other_build_note(header, trace::build_id());
  ASSERT_TRUE(note.has_value());
  EXPECT_NE(note->find("recorded by lockstep 0.1.0 (git 2cbf2accc536)"), std::string::npos)
      << *note;
  EXPECT_NE(note->find("replayed by " + trace::build_id()), std::string::npos) << *note;
  header.build_id = trace::build_id();
  EXPECT_FALSE(replay::other_build_note(header, trace::build_id()).has_value());
  header.build_id = "sglang 0.5";
  header.foreign_executor = "sglang";
  EXPECT_FALSE(replay::other_build_note(header, trace::build_id()).has_value());
}

TEST(ReplayRefuses, WeightsWithAnotherDigestNamingBoth) {
  const fs::path path = temp_path("digest.trace");
  record_seed(4, {}, path);
  trace::TraceReader reader = trace::TraceReader::open(path);
  trace::TraceHeader header = reader.header();
  header.weights_digest ^= 0xff;
  try {
    replay::weights_for(header, std::nullopt);
    FAIL() << "accepted weights with another digest";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(fmt::format("{:016x}", header.weights_digest)), std::string::npos);
    EXPECT_NE(std::string(e.what()).find(fmt::format("{:016x}", sim_weights().digest())), std::string::npos);
  }
}

// Replay digests the weights in the form the header names: the stream form's value under the
// stream form is accepted, and the recorded (blocks) value under the stream form is refused with
// the form named.
TEST(ReplayRefuses, ADigestUnderAFormItWasNotComputedIn) {
  const fs::path path = temp_path("digest-form.trace");
  record_seed(4, {}, path);
  trace::TraceHeader header = trace::TraceReader::open(path).header();
  ASSERT_EQ(header.weights_digest_form, WeightsDigestForm::kBlocks);
  ASSERT_EQ(header.weights_digest, sim_weights().digest(WeightsDigestForm::kBlocks));
  header.weights_digest_form = WeightsDigestForm::kStream;
  try {
    replay::weights_for(header, std::nullopt);
    FAIL() << "accepted a blocks digest as a stream digest";
  } catch (const Error& e) {
    const std::string named = fmt::format("{:016x} (stream form)", header.weights_digest);
    EXPECT_NE(std::string(e.what()).find(named), std::string::npos)
        << e.what();
  }
  header.weights_digest = sim_weights().digest(WeightsDigestForm::kStream);
  EXPECT_EQ(replay::weights_for(header, std::nullopt).digest(WeightsDigestForm::kStream),
            header.weights_digest);
}

// The digest is checked on another thread while the backend is built: weights that are not the
// recorded ones are still refused by name before any step, even where the build fails too, and a
// build that fails beside weights that match gives its own error.
TEST(ReplayRefuses, WeightsWithAnotherDigestWhileTheBackendIsBuilt) {
  const fs::path path = temp_path("digest-backend.trace");
  record_seed(4, {}, path);
  const ModelWeights other = weights_from_seed(sim_weights().config, kSimWeightsSeed + 1);
  const std::string other_digest = fmt::format("{:016x}", other.digest());
  int32_t builds = 0;
  bool build_fails = false;
  replay::ReplayOptions options;
  options.make_backend = [&](const ModelWeights& weights, const ExecutorConfig& config,
                             const std::string& drafter,
                             int32_t tp_degree) -> std::unique_ptr<Backend> {
    ++builds;
    if (build_fails) throw Error("the test's backend could not start");
    return std::make_unique<CpuBackend>(weights, config, nullptr, false, make_drafter(drafter),
                                        tp_degree);
  };
  const auto refusal = [&] {
    try {
      replay::replay_trace(path, options);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  options.weights = &other;
  EXPECT_NE(refusal().find(other_digest), std::string::npos);
  build_fails = true;
  EXPECT_NE(refusal().find(other_digest), std::string::npos);
  options.weights = &sim_weights();
  EXPECT_EQ(refusal(), "the test's backend could not start");
  EXPECT_EQ(builds, 3);  // the refusals came after the builds, not instead of them
  build_fails = false;
  EXPECT_TRUE(replay::replay_trace(path, options).identical());
}

// The simulator's weights, already generated: thousands of replays need not regenerate them.
replay::ReplayOptions in_memory() {
  replay::ReplayOptions options;
  options.weights = &sim_weights();
  return options;
}

// Every prefix of a small trace either replays its complete steps identically or is refused with
// a clear error — never a crash or a hang.
TEST(ReplayRobustness, TruncationAtEveryByteOffset) {
  std::ifstream in(record_sampling_run(), std::ios::binary);
  const std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  ASSERT_GT(bytes.size(), 1000u);
  int64_t errors = 0, replayed = 0;
  for (size_t n = 0; n <= bytes.size(); n += 1) {
    const std::span<const std::byte> prefix(reinterpret_cast<const std::byte*>(bytes.data()), n);
    try {
      const replay::ReplayReport r =
          replay::replay_trace(trace::TraceReader::from_bytes(prefix, {}, "cut"), in_memory());
      ASSERT_FALSE(r.divergence) << "cut at " << n << ": " << r.divergence->describe();
      ++replayed;
    } catch (const Error&) {
      ++errors;
    }
  }
  EXPECT_GT(errors, 0);    // cut inside the header
  EXPECT_GT(replayed, 0);  // cut after it: the complete prefix replays
}

TEST(ReplayRobustness, RandomByteFlipsNeverCrash) {
  const fs::path path = temp_path("flip.trace");
  sim::SimOverrides small;
  small.requests_count = 3;
  record_seed(10, small, path);
  std::ifstream in(path, std::ios::binary);
  const std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  uint64_t state = 20261129;
  int64_t outcomes = 0;
  for (int trial = 0; trial < 400; ++trial) {
    std::string copy = bytes;
    for (int k = 0; k < 3; ++k) {
      state = state * 6364136223846793005ULL + 1442695040888963407ULL;
      copy[(state >> 33) % copy.size()] ^= static_cast<char>(1 + (state >> 25) % 255);
    }
    const std::span<const std::byte> view(reinterpret_cast<const std::byte*>(copy.data()), copy.size());
    try {
      // Identical or diverged are both fine; a clear ls::Error is fine; a crash is not.
      (void)replay::replay_trace(trace::TraceReader::from_bytes(view, {}, "flipped"), in_memory());
    } catch (const Error&) {
    }
    ++outcomes;
  }
  EXPECT_EQ(outcomes, 400);
}

}  // namespace
}  // namespace ls
