// Issue 12: a trace in which no corrupted byte goes unnoticed, and a killed recorder's trace that
// still replays. Each test records a real run (the serving loop over the CPU reference with the
// recorder on, as `lockstep generate --record`; the simulator with faults and retraction) and then
// damages its bytes:
//   - every byte of a generate trace XOR-ed with a seeded non-zero mask, one at a time, and a
//     seeded sample of >= 5,000 positions of a simulator trace: `check` must fail (exit != 0) on
//     every one; a seeded subset also goes through `replay`. No byte is exempt: the preamble,
//     every frame header and every message are covered by a checksum (trace/framing.h);
//   - the file cut at every byte offset: the complete prefix replays (exit 0), and the report says
//     where the trace ends, how many bytes were dropped and that the footer is missing;
//   - a corrupted record in the middle: exit 2, naming its offset, the step before it and how many
//     later records are intact;
//   - a trace of format version 1 (no framing) or 2 (another logits digest): refused, naming the
//     version.
// The exit codes are those of `lockstep replay` / `lockstep check` (cli/): an ls::Error is 2, a
// divergence or a violation is 1.
#include "core/scheduler.h"
#include "core/serving_loop.h"
#include "replay/replay.h"
#include "replay/trace_check.h"
#include "sim/trace_recording.h"
#include "sim/world.h"
#include "tests/test_support.h"
#include "trace/codec.h"
#include "trace/framing.h"
#include "trace/reader.h"
#include "trace/trace_observer.h"

#include <capnp/message.h>
#include <capnp/serialize.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>

namespace ls {
namespace {

namespace fs = std::filesystem;
using Bytes = std::vector<std::byte>;

const ModelWeights& weights() { return ls::testing::sim_weights(); }

fs::path temp_path(const std::string& name) {
  const fs::path dir = fs::temp_directory_path() / fmt::format("lockstep-integrity-{}", ::getpid());
  fs::create_directories(dir);
  return dir / name;
}

Bytes read_file(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::vector<char> chars((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  Bytes bytes(chars.size());
  std::memcpy(bytes.data(), chars.data(), chars.size());
  return bytes;
}

// The serving loop over `scheduler` on `backend`, recorded as `generate --record` does; the
// trace's bytes (the file is removed).
Bytes record_serving(Scheduler& scheduler, Backend& backend, const ExecutorConfig& limits,
                     const std::string& name, bool activations = false) {
  Executor executor(limits, weights().config.vocab_size, backend,
                    trace::recording_executor_options(activations));
  const fs::path path = temp_path(name);
  {
    trace::TraceHeader header = trace::make_trace_header(
        weights(), WeightSource{WeightSource::Kind::kSeed, 0, ""}, limits, "cpu");
    header.activation_digests = activations;  // generate --record-activations
    auto recorder = trace::Recorder::open(path, header);
    trace::TraceObserver observer(*recorder);
    run_serving_loop(scheduler, executor, ServingLoopOptions{.observer = &observer});
    recorder->close();
  }
  Bytes bytes = read_file(path);
  fs::remove(path);
  return bytes;
}

// `lockstep generate --record` on tiny: the serving loop with the recorder on, greedy and
// seeded-sampling requests, batch 4.
Bytes record_generate(int32_t requests_count, int32_t max_new_tokens, bool activations = false) {
  const SchedulerConfig sc{{.max_batch_rows = 4, .context_length = 64, .page_size = 4,
                            .pages_count = 64, .verify_width = 1, .prefill_chunk_tokens = 32,
                            .host_pages_count = 0}};
  const ExecutorConfig limits = executor_config_for(sc);
  Scheduler scheduler(sc);
  for (int32_t i = 0; i < requests_count; ++i) {
    RequestSpec r{.id = static_cast<RequestId>(10 + i),
                  .prompt = ls::testing::prompt_for(10 + i, 3 + i % 7),
                  .max_new_tokens = max_new_tokens};
    if (i % 2 == 1) r.sampling = SamplingParams{.temperature = 0.8f, .top_k = 20, .seed = static_cast<uint64_t>(5 + i)};
    scheduler.submit(r, weights().config.vocab_size);
  }
  CpuBackend backend(weights(), limits);
  return record_serving(scheduler, backend, limits, "generate.trace", activations);
}


// A simulator seed with faults, retraction and events (`lockstep sim --record`), on tiny or (with
// overrides.model) tiny-hybrid.
Bytes record_sim(uint64_t seed, const sim::SimOverrides& overrides = {}) {
  const sim::SimParams params = sim::derive_params(seed, overrides);
  const ModelWeights& w = ls::testing::sim_weights(params.model);
  const fs::path path = temp_path("sim.trace");
  {
    auto recorder = trace::Recorder::open(
        path, trace::make_trace_header(w, WeightSource{WeightSource::Kind::kSeed, 0, ""},
                                       sim::executor_config_for(params), "cpu"));
    sim::SimTraceObserver observer(*recorder);
    sim::run_world(params, w,
                   sim::WorldOptions{.observer = &observer,
                                     .executor_options = trace::recording_executor_options()});
    recorder->close();
  }
  Bytes bytes = read_file(path);
  fs::remove(path);
  return bytes;
}

trace::TraceReader reader_of(const Bytes& bytes, bool validate_ops = true) {
  return trace::TraceReader::from_bytes(bytes, trace::TraceReaderOptions{.validate_ops = validate_ops},
                                        "damaged.trace");
}

// What `lockstep check` exits with, and its message.
struct Outcome {
  int exit = 0;
  std::string message;
  std::optional<trace::TraceTruncation> truncation;
};

Outcome check_bytes(const Bytes& bytes) {
  try {
    const replay::CheckReport r = replay::check_trace(reader_of(bytes, false));
    if (r.violation) return {1, r.violation->describe(), r.truncation};
    return {0, "", r.truncation};
  } catch (const Error& e) {
    return {2, e.what(), std::nullopt};
  }
}

// What `lockstep replay` (exact, CPU) exits with.
Outcome replay_bytes(const Bytes& bytes, int64_t* steps_compared = nullptr) {
  try {
    replay::ReplayOptions options;
    options.weights = &weights();
    const replay::ReplayReport r = replay::replay_trace(reader_of(bytes), options);
    if (steps_compared) *steps_compared = r.steps_compared;
    if (r.divergence) return {1, r.divergence->describe(), r.truncation};
    return {0, "", r.truncation};
  } catch (const Error& e) {
    return {2, e.what(), std::nullopt};
  }
}

Bytes xor_at(Bytes bytes, size_t at, uint8_t mask) {
  bytes[at] = static_cast<std::byte>(static_cast<uint8_t>(bytes[at]) ^ mask);
  return bytes;
}

TEST(TraceIntegrity, EveryByteOfAGenerateTraceFlippedIsDetected) {
  const Bytes trace = record_generate(6, 6);
  ASSERT_EQ(check_bytes(trace).exit, 0) << check_bytes(trace).message;
  int64_t steps = 0;
  ASSERT_EQ(replay_bytes(trace, &steps).exit, 0);
  ASSERT_GT(steps, 10);
  std::mt19937_64 rng(12);
  int64_t detected = 0, replayed = 0;
  for (size_t at = 0; at < trace.size(); ++at) {
    const uint8_t mask = static_cast<uint8_t>(1 + rng() % 255);
    const Bytes damaged = xor_at(trace, at, mask);
    const Outcome c = check_bytes(damaged);
    ASSERT_NE(c.exit, 0) << "byte " << at << " ^ " << int{mask} << " of " << trace.size()
                         << " went unnoticed by check";
    detected += 1;
    if (at % 97 == 0) {  // replay re-executes: a seeded subset
      const Outcome r = replay_bytes(damaged);
      ASSERT_NE(r.exit, 0) << "byte " << at << " went unnoticed by replay";
      ++replayed;
    }
  }
  std::printf("generate trace of %zu bytes: %lld of %zu flipped bytes detected by check (100%%), "
              "%lld of %lld by replay\n",
              trace.size(), static_cast<long long>(detected), trace.size(),
              static_cast<long long>(replayed), static_cast<long long>(replayed));
}

TEST(TraceIntegrity, FiveThousandSeededFlipsOfASimulatorTraceAreDetected) {
  const Bytes trace = record_sim(7);
  ASSERT_EQ(check_bytes(trace).exit, 0) << check_bytes(trace).message;
  ASSERT_GT(trace.size(), 5000u);
  std::mt19937_64 rng(2026);
  int64_t detected = 0, as_corruption = 0;
  constexpr int kFlips = 5000;
  for (int i = 0; i < kFlips; ++i) {
    const size_t at = rng() % trace.size();
    const uint8_t mask = static_cast<uint8_t>(1u << (rng() % 8));  // one bit
    const Outcome c = check_bytes(xor_at(trace, at, mask));
    ASSERT_NE(c.exit, 0) << "seed 2026 flip " << i << ": byte " << at << " bit mask " << int{mask};
    ++detected;
    as_corruption += c.exit == 2 ? 1 : 0;
  }
  EXPECT_EQ(as_corruption, detected);  // every one is a checksum failure: exit 2
  std::printf("simulator trace of %zu bytes: %lld of %d seeded single-bit flips detected (exit 2)\n",
              trace.size(), static_cast<long long>(detected), kFlips);
}

// A trace with per-layer activation digests (--record-activations, trace.capnp ACTIVATIONS): the
// digests are bytes under the same checks, every seeded flip is corruption (exit 2), and the trace
// replays identical.
TEST(TraceIntegrity, SeededFlipsOfATraceWithActivationDigestsAreDetected) {
  const Bytes plain = record_generate(4, 4);
  const Bytes trace = record_generate(4, 4, /*activations=*/true);
  ASSERT_EQ(check_bytes(trace).exit, 0) << check_bytes(trace).message;
  ASSERT_TRUE(reader_of(trace).header().activation_digests);
  trace::TraceReader reader = reader_of(trace);
  trace::TraceRecord record;
  size_t digests = 0;
  while (reader.next(record)) {
    if (auto* out = std::get_if<trace::StepOutputRecord>(&record)) {
      ASSERT_FALSE(out->activation_digests.empty()) << "step " << out->step;
      digests += out->activation_digests.size();
    }
  }
  ASSERT_GE(trace.size(), plain.size() + 8 * digests) << "the digests are not the trace's bytes";
  ASSERT_EQ(replay_bytes(trace).exit, 0);
  std::mt19937_64 rng(15);
  constexpr int kFlips = 3000;
  for (int i = 0; i < kFlips; ++i) {
    const size_t at = rng() % trace.size();
    const uint8_t mask = static_cast<uint8_t>(1u << (rng() % 8));
    const Outcome c = check_bytes(xor_at(trace, at, mask));
    ASSERT_EQ(c.exit, 2) << "seed 15 flip " << i << ": byte " << at << " bit mask " << int{mask};
  }
  std::printf("trace with activation digests, %zu bytes: %d of %d seeded single-bit flips "
              "detected (exit 2)\n", trace.size(), kFlips, kFlips);
}

// The recorder checks an output against its header as the reader will: one activation digest
// short is refused, naming the field (tests/trace/reader_robustness_test.cpp: the reader's side).
TEST(TraceIntegrity, TheRecorderRefusesAnOutputWithOneActivationDigestShort) {
  const Bytes trace = record_generate(2, 2, /*activations=*/true);
  trace::TraceReader reader = reader_of(trace);
  const fs::path path = temp_path("short-activations.trace");
  auto recorder = trace::Recorder::open(path, reader.header());
  trace::TraceRecord record;
  std::string error;
  while (error.empty() && reader.next(record)) {
    try {
      if (auto* in = std::get_if<trace::StepInputRecord>(&record)) {
        recorder->record_input(std::move(*in));
      } else if (auto* out = std::get_if<trace::StepOutputRecord>(&record)) {
        ASSERT_FALSE(out->activation_digests.empty());
        out->activation_digests.pop_back();
        recorder->record_output(std::move(*out));
        recorder->close();  // the output is checked as it is written
      }
    } catch (const Error& e) {
      error = e.what();
    }
  }
  fs::remove(path);
  EXPECT_NE(error.find("activation_digests holds"), std::string::npos) << error;
}

// A hybrid's trace (the state slots in the inputs, the state digests in the outputs) is under the
// same checks: every seeded flip is corruption (exit 2).
TEST(TraceIntegrity, SeededFlipsOfAHybridSimulatorTraceAreDetected) {
  sim::SimOverrides hybrid;
  hybrid.model = "tiny-hybrid";
  const Bytes trace = record_sim(11, hybrid);
  ASSERT_EQ(check_bytes(trace).exit, 0) << check_bytes(trace).message;
  ASSERT_TRUE(reader_of(trace).header().mamba_state_digests);
  std::mt19937_64 rng(19);
  constexpr int kFlips = 2000;
  for (int i = 0; i < kFlips; ++i) {
    const size_t at = rng() % trace.size();
    const uint8_t mask = static_cast<uint8_t>(1u << (rng() % 8));
    const Outcome c = check_bytes(xor_at(trace, at, mask));
    ASSERT_EQ(c.exit, 2) << "seed 19 flip " << i << ": byte " << at << " bit mask " << int{mask};
  }
  std::printf("hybrid simulator trace of %zu bytes: %d of %d seeded single-bit flips detected "
              "(exit 2)\n", trace.size(), kFlips, kFlips);
}

// The byte offsets where frames end: the complete prefixes a cut can leave.
std::vector<uint64_t> frame_ends(const Bytes& bytes) {
  std::vector<uint64_t> ends;
  const auto* data = reinterpret_cast<const unsigned char*>(bytes.data());
  uint64_t pos = trace::framing::kPreambleBytes;
  for (;;) {
    const auto f = trace::framing::read_frame(data, bytes.size(), pos, uint64_t{64} << 20);
    if (f.status != trace::framing::FrameStatus::kWhole) break;
    pos += trace::framing::kFrameHeaderBytes + f.payload_bytes;
    ends.push_back(pos);
  }
  return ends;
}

TEST(TraceIntegrity, ACutAtEveryByteReplaysTheCompletePrefixAndSaysWhereItEnds) {
  const Bytes trace = record_generate(3, 4);
  const std::vector<uint64_t> ends = frame_ends(trace);
  ASSERT_EQ(ends.back(), trace.size());
  const uint64_t header_end = ends.front();
  for (uint64_t cut = 0; cut < trace.size(); ++cut) {
    const Bytes prefix(trace.begin(), trace.begin() + static_cast<ptrdiff_t>(cut));
    const Outcome c = check_bytes(prefix);
    if (cut < header_end) {
      // Nothing to replay without the header: a clear error, never a misreading.
      ASSERT_EQ(c.exit, 2) << "cut " << cut;
      ASSERT_TRUE(c.message.find("ends inside the") != std::string::npos ||
                  c.message.find("empty file") != std::string::npos)
          << c.message;
      continue;
    }
    ASSERT_EQ(c.exit, 0) << "cut at " << cut << ": " << c.message;
    ASSERT_TRUE(c.truncation) << "cut at " << cut << ": no truncation reported";
    const uint64_t complete = *std::prev(std::upper_bound(ends.begin(), ends.end(), cut));
    ASSERT_EQ(c.truncation->complete_bytes, complete) << "cut " << cut;
    ASSERT_EQ(c.truncation->trailing_bytes, cut - complete) << "cut " << cut;
    ASSERT_TRUE(c.truncation->footer_missing);
    const std::string text = c.truncation->describe();
    ASSERT_NE(text.find(fmt::format("ends at byte {} without its footer", complete)),
              std::string::npos) << text;
    if (cut > complete) {
      ASSERT_NE(text.find(fmt::format("{} bytes of a partial record dropped", cut - complete)),
                std::string::npos) << text;
    }
  }
  // Replay of a few cuts: exit 0, every complete step compared.
  for (const uint64_t cut : {header_end + 5, trace.size() / 3, trace.size() / 2, trace.size() - 1}) {
    const Bytes prefix(trace.begin(), trace.begin() + static_cast<ptrdiff_t>(cut));
    int64_t compared = 0;
    const Outcome r = replay_bytes(prefix, &compared);
    ASSERT_EQ(r.exit, 0) << "cut " << cut << ": " << r.message;
    ASSERT_TRUE(r.truncation);
    EXPECT_EQ(compared, r.truncation->complete_steps) << "cut " << cut;
  }
  std::printf("cut at each of %zu offsets: header cuts refused, every other cut checked its "
              "complete prefix and reported the footer missing\n", trace.size());
}

TEST(TraceIntegrity, CorruptionInTheMiddleExitsTwoNamingOffsetStepAndIntactRecords) {
  const Bytes trace = record_generate(4, 5);
  const std::vector<uint64_t> ends = frame_ends(trace);
  ASSERT_GT(ends.size(), 20u);
  const uint64_t record_at = ends[10];  // the 12th record's frame
  const Bytes damaged = xor_at(trace, record_at + 20, 0x40);  // inside its message
  const Outcome c = check_bytes(damaged);
  EXPECT_EQ(c.exit, 2);
  EXPECT_NE(c.message.find(fmt::format("at byte offset {}", record_at)), std::string::npos) << c.message;
  EXPECT_NE(c.message.find("after step"), std::string::npos) << c.message;
  EXPECT_NE(c.message.find(fmt::format("{} later records are intact", ends.size() - 12)),
            std::string::npos) << c.message;
  EXPECT_NE(c.message.find("damaged inside, not cut off"), std::string::npos) << c.message;
  const Outcome r = replay_bytes(damaged);
  EXPECT_EQ(r.exit, 2);
  EXPECT_NE(r.message.find(fmt::format("at byte offset {}", record_at)), std::string::npos) << r.message;
  std::printf("%s\n", c.message.c_str());
}

// The CPU reference behind a backend that says it runs ahead (as CUDA does): each step computed
// at enqueue, handed out at collect, so the serving loop records input k+1 before output k.
class RunAheadCpu final : public testing::CpuBackendWrapper {
 public:
  explicit RunAheadCpu(const ExecutorConfig& config) : CpuBackendWrapper(weights(), config) {}
  std::string name() const override { return "cpu"; }
  bool can_run_ahead() const override { return true; }
  void enqueue_finish(const StepPlan& plan) override {
    inner_.finish_step(plan, queue_.emplace_back());
    in_flight_max = std::max(in_flight_max, static_cast<int32_t>(queue_.size()));
  }
  void collect_finish(const StepPlan&, StepResult& result) override {
    result = std::move(queue_.front());
    queue_.erase(queue_.begin());
  }
  int32_t in_flight_max = 0;

 private:
  std::vector<StepResult> queue_;
};

// Recording keeps run-ahead, and the overlapped records it writes (input k+1 before output k)
// check clean and replay: exact, and teacher-forced with every token equal (found on the H200:
// the checker and teacher forcing took input k+1 before output k).
TEST(TraceIntegrity, ARunAheadRecordingChecksAndReplaysExactAndTeacherForced) {
  const SchedulerConfig sc{{.max_batch_rows = 4, .context_length = 64, .page_size = 4,
                            .pages_count = 64, .verify_width = 1, .prefill_chunk_tokens = 32,
                            .host_pages_count = 0}};
  const ExecutorConfig limits = executor_config_for(sc);
  Scheduler scheduler(sc);
  for (int32_t i = 0; i < 6; ++i) {
    RequestSpec r{.id = static_cast<RequestId>(10 + i),
                  .prompt = ls::testing::prompt_for(10 + i, 3 + i % 7), .max_new_tokens = 7};
    if (i % 2 == 1) r.sampling = SamplingParams{.temperature = 0.8f, .top_k = 20, .seed = 9u};
    scheduler.submit(r, weights().config.vocab_size);
  }
  RunAheadCpu backend(limits);
  const Bytes trace = record_serving(scheduler, backend, limits, "run_ahead.trace");
  ASSERT_EQ(backend.in_flight_max, 2) << "the loop did not run ahead while recording";
  const Outcome c = check_bytes(trace);
  EXPECT_EQ(c.exit, 0) << c.message;
  int64_t compared = 0;
  const Outcome r = replay_bytes(trace, &compared);
  EXPECT_EQ(r.exit, 0) << r.message;
  EXPECT_GT(compared, 10);
  replay::ReplayOptions tf;
  tf.mode = replay::ReplayMode::kTeacherForced;
  tf.weights = &weights();
  const replay::ReplayReport report = replay::replay_trace(reader_of(trace), tf);
  EXPECT_GT(report.tokens_count, 20);
  EXPECT_EQ(report.tokens_equal, report.tokens_count);
  EXPECT_EQ(report.logit_delta_max, 0.0f);
  EXPECT_EQ(report.top1_equal, report.top1_count);
  std::printf("run-ahead recording: %lld steps compared exactly; teacher-forced %lld/%lld tokens, "
              "max |dlogit| %g\n", static_cast<long long>(compared),
              static_cast<long long>(report.tokens_equal), static_cast<long long>(report.tokens_count),
              static_cast<double>(report.logit_delta_max));
}

TEST(TraceIntegrity, ATraceOfFormatVersionOneIsRefusedNamingItsVersion) {
  // Version 1: the header message first, in plain stream framing, no preamble.
  trace::TraceHeader header = trace::make_trace_header(
      weights(), WeightSource{WeightSource::Kind::kSeed, 0, ""}, ls::testing::small_config(), "cpu");
  header.format_version = 1;
  capnp::MallocMessageBuilder message;
  trace::codec::encode(header, message.initRoot<trace::schema::Record>().initHeader());
  const kj::Array<capnp::word> words = capnp::messageToFlatArray(message);
  Bytes bytes(words.size() * sizeof(capnp::word));
  std::memcpy(bytes.data(), words.begin(), bytes.size());
  const Outcome c = check_bytes(bytes);
  EXPECT_EQ(c.exit, 2);
  EXPECT_NE(c.message.find("format version 1"), std::string::npos) << c.message;
  EXPECT_NE(c.message.find("reads versions 3 to 5"), std::string::npos) << c.message;
  EXPECT_EQ(replay_bytes(bytes).exit, 2);
  std::printf("%s\n", c.message.c_str());
}

TEST(TraceIntegrity, ATraceOfFormatVersionTwoIsRefusedNamingItsVersion) {
  // Version 2: this format's framing, whose logits digests follow the older definition. A
  // recorded trace with its preamble rewritten (and resealed) to say 2.
  Bytes bytes = record_generate(2, 4);
  trace::framing::write_preamble(reinterpret_cast<unsigned char*>(bytes.data()), 2);
  const Outcome c = check_bytes(bytes);
  EXPECT_EQ(c.exit, 2);
  EXPECT_NE(c.message.find("format version 2"), std::string::npos) << c.message;
  EXPECT_NE(c.message.find("reads versions 3 to 5"), std::string::npos) << c.message;
  EXPECT_EQ(replay_bytes(bytes).exit, 2);
  std::printf("%s\n", c.message.c_str());
}

// The fuzzer's seed corpus is in this build's format (fuzz/make_corpus.sh regenerates it when the
// format changes), so the fuzzer starts from what a reader of today decodes in full.
TEST(FuzzCorpus, EverySeedIsInThisBuildsFormat) {
  int32_t seeds = 0;
  for (const auto& entry :
       fs::directory_iterator(fs::path(LOCKSTEP_SOURCE_DIR) / "fuzz/corpus/trace_reader")) {
    const Bytes bytes = read_file(entry.path());
    ASSERT_GE(bytes.size(), trace::framing::kPreambleBytes) << entry.path();
    uint32_t version = 0;
    EXPECT_EQ(trace::framing::read_preamble(reinterpret_cast<const unsigned char*>(bytes.data()),
                                            version),
              trace::framing::PreambleStatus::kOk)
        << entry.path();
    EXPECT_EQ(version, trace::kFormatVersion) << entry.path() << ": run fuzz/make_corpus.sh";
    ++seeds;
  }
  EXPECT_EQ(seeds, 6);
}

}  // namespace
}  // namespace ls
