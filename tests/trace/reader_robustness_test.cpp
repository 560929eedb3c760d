// The reader treats every file as untrusted: a trace cut at every byte offset, random byte flips,
// and hand-made bad records give a clear ls::Error or a readable complete prefix, never a crash.
// Expected record boundaries come from capnp's own reader, not from lockstep's.
#include "tests/trace/trace_test_support.h"
#include "replay/trace_check.h"
#include "trace/codec.h"

#include <capnp/message.h>
#include <capnp/serialize.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <random>

namespace ls::trace {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;
using testing::TempPath;

struct Boundary {
  uint64_t end = 0;               // byte offset just past the message
  schema::Record::Which which{};  // its kind
  int64_t step = -1;
};

// Frame boundaries and kinds by capnp's FlatArrayMessageReader, an independent path: after the
// preamble, each frame is a 16-byte header and a message whose end capnp finds itself.
std::vector<Boundary> boundaries_of(std::span<const std::byte> bytes) {
  std::vector<capnp::word> words(bytes.size() / 8);
  std::memcpy(words.data(), bytes.data(), words.size() * 8);
  std::vector<Boundary> out;
  kj::ArrayPtr<const capnp::word> rest(words.data() + framing::kPreambleBytes / 8,
                                       words.data() + words.size());
  while (rest.size() > 0) {
    rest = kj::ArrayPtr<const capnp::word>(rest.begin() + framing::kFrameHeaderBytes / 8, rest.end());
    capnp::FlatArrayMessageReader message(rest);
    const auto root = message.getRoot<schema::Record>();
    Boundary b{.which = root.which()};
    if (root.isStepInput()) b.step = root.getStepInput().getStep();
    if (root.isStepOutput()) b.step = root.getStepOutput().getStep();
    rest = kj::ArrayPtr<const capnp::word>(message.getEnd(), rest.end());
    b.end = static_cast<uint64_t>(rest.begin() - words.data()) * 8;
    out.push_back(b);
  }
  return out;
}

// Reads everything; returns the error message, or "" when the prefix was read to its end.
std::string read_all(std::span<const std::byte> bytes) {
  try {
    TraceReader reader = TraceReader::from_bytes(bytes);
    TraceRecord record;
    while (reader.next(record)) {
    }
    return "";
  } catch (const Error& e) {
    return e.what();
  }
}

TEST(ReaderRobustness, TruncationAtEveryByteGivesTheCompletePrefix) {
  TempPath file("truncate");
  testing::record_workload(file.path(), 3);
  const std::vector<std::byte> bytes = testing::read_bytes(file.path());
  const std::vector<Boundary> boundaries = boundaries_of(bytes);
  ASSERT_GE(boundaries.size(), 8u);
  ASSERT_EQ(boundaries.back().end, bytes.size());
  ASSERT_EQ(boundaries.back().which, schema::Record::FOOTER);
  std::printf("trace of %zu bytes, %zu records\n", bytes.size(), boundaries.size());
  for (size_t cut = 0; cut <= bytes.size(); ++cut) {
    const std::span<const std::byte> prefix(bytes.data(), cut);
    if (cut < boundaries[0].end) {
      EXPECT_THAT(read_all(prefix),
                  HasSubstr(cut == 0 ? "empty file"
                                     : cut < framing::kPreambleBytes ? "ends inside the preamble"
                                                                     : "ends inside the header"))
          << "cut " << cut;
      continue;
    }
    // Expected: records wholly inside the prefix; complete steps = outputs among them.
    int64_t complete = 0, open_step = -1;
    uint64_t whole_end = 0;
    for (const Boundary& b : boundaries) {
      if (b.end > cut) break;
      whole_end = b.end;
      if (b.which == schema::Record::STEP_INPUT) open_step = b.step;
      if (b.which == schema::Record::STEP_OUTPUT) ++complete, open_step = -1;
    }
    TraceReader reader = TraceReader::from_bytes(prefix);
    TraceRecord record;
    try {
      while (reader.next(record)) {
      }
    } catch (const Error& e) {
      FAIL() << "cut " << cut << ": " << e.what();
    }
    EXPECT_EQ(reader.complete_steps(), complete) << "cut " << cut;
    EXPECT_EQ(reader.offset(), whole_end) << "cut " << cut;
    // Every cut short of the whole file lost the footer, on a record boundary or not.
    const bool expect_truncation = cut != bytes.size();
    ASSERT_EQ(reader.truncation().has_value(), expect_truncation) << "cut " << cut;
    if (expect_truncation) {
      const TraceTruncation t = *reader.truncation();
      EXPECT_EQ(t.complete_steps, complete);
      EXPECT_EQ(t.trailing_bytes, cut - whole_end);
      EXPECT_EQ(t.complete_bytes, whole_end);
      EXPECT_TRUE(t.footer_missing);
      EXPECT_THAT(t.describe(), HasSubstr(fmt::format("ends at byte {} without its footer",
                                                      whole_end)));
      EXPECT_THAT(t.describe(), HasSubstr(fmt::format("{} complete steps", complete)));
      if (open_step >= 0) {
        EXPECT_EQ(t.open_step, std::optional<int64_t>(open_step));
        EXPECT_THAT(t.describe(), HasSubstr(fmt::format("step {} has no output", open_step)));
      }
    }
  }
}

TEST(ReaderRobustness, RandomByteFlipsGiveAnErrorOrAReadablePrefix) {
  TempPath file("flips");
  testing::record_workload(file.path(), 3);
  const std::vector<std::byte> original = testing::read_bytes(file.path());
  constexpr uint32_t kSeed = 20261129;
  std::mt19937_64 rng(kSeed);  // only the engine: its sequence is fixed by the standard
  int errors = 0, readable = 0;
  for (int mutation = 0; mutation < 2000; ++mutation) {
    std::vector<std::byte> bytes = original;
    const int flips = 1 + static_cast<int>(rng() % 4);
    for (int f = 0; f < flips; ++f) {
      const size_t at = static_cast<size_t>(rng() % bytes.size());
      bytes[at] ^= static_cast<std::byte>(1 + rng() % 255);
    }
    const std::string error = read_all(bytes);
    if (error.empty()) {
      ++readable;
    } else {
      ++errors;
      EXPECT_THAT(error, HasSubstr("record")) << "seed " << kSeed << " mutation " << mutation;
    }
  }
  std::printf("2000 mutations (seed %u): %d errors, %d readable\n", kSeed, errors, readable);
  // Every byte of the file is under a checksum (the preamble's, a frame header's or a message's):
  // no flip reads back as a trace.
  EXPECT_EQ(errors, 2000);
  EXPECT_EQ(readable, 0);
}

// A header-only trace followed by hand-encoded records (bypassing the recorder's checks).
class BadRecords : public ::testing::Test {
 protected:
  void SetUp() override {
    auto recorder = Recorder::open(file_.path(), header(), {.write_footer = false});
    recorder->close();
    bytes_ = testing::read_bytes(file_.path());
  }
  template <typename Record, typename Init>
  void append(const Record& record, Init init) {
    capnp::MallocMessageBuilder message;
    codec::encode(record, init(message.initRoot<schema::Record>()));
    testing::append_framed(bytes_, message);
  }
  virtual ExecutorConfig config() const { return ls::testing::small_config(); }
  virtual TraceHeader header() const { return testing::header_for(config()); }
  void append_input(int64_t step, const ForwardOp& op, std::vector<CacheOp> cache_ops = {}) {
    append(StepInputRecord{step, op, std::move(cache_ops)},
           [](schema::Record::Builder r) { return r.initStepInput(); });
  }
  void append_output(const StepOutputRecord& out) {
    append(out, [](schema::Record::Builder r) { return r.initStepOutput(); });
  }
  static ForwardOp decode_op(int32_t pool_row) {
    ForwardOp op;
    op.rows.push_back(ls::testing::decode_row(9, pool_row));
    return op;
  }
  static StepOutputRecord decode_output(int64_t step) {
    StepOutputRecord out;
    out.step = step;
    out.result = StepResult{.mode = ForwardMode::kDecode, .tokens = {3}, .accepted_lengths = {1},
                            .nan_flags = {0}, .oov_flags = {0}};
    return out;
  }
  std::string error() { return read_all(bytes_); }

  TempPath file_{"bad"};
  std::vector<std::byte> bytes_;
};

// A header that records activation digests (trace.capnp ACTIVATIONS): tiny has 2 layers, so a
// one-token decode step carries 2·6·1 + 2·1 = 14.
class BadActivationRecords : public BadRecords {
 protected:
  TraceHeader header() const override {
    TraceHeader h = BadRecords::header();
    h.activation_digests = true;
    return h;
  }
};

TEST_F(BadActivationRecords, TheDigestCountMustFitTheStep) {
  append_input(0, decode_op(1));
  StepOutputRecord out = decode_output(0);
  out.activation_digests.assign(14, 7);
  append_output(out);
  EXPECT_EQ(error(), "");
  append_input(1, decode_op(1));
  StepOutputRecord short_one = decode_output(1);
  short_one.activation_digests.assign(13, 7);
  append_output(short_one);
  EXPECT_THAT(error(), AllOf(HasSubstr("step 1 output"),
                             HasSubstr("activation_digests holds 13 digests, expected 14")));
}

TEST_F(BadRecords, ActivationDigestsTheHeaderDoesNotRecordAreRefused) {
  append_input(0, decode_op(1));
  StepOutputRecord out = decode_output(0);
  out.activation_digests.assign(14, 7);
  append_output(out);
  EXPECT_THAT(error(), HasSubstr("activation_digests holds 14 digests, expected 0 (the header does "
                                 "not record them)"));
}

TEST_F(BadRecords, PoolRowOutOfRangeNamesStepRecordAndField) {
  append_input(0, decode_op(1));
  append_output(decode_output(0));
  append_input(1, decode_op(99));
  EXPECT_THAT(error(), AllOf(HasSubstr("record 3"), HasSubstr("step 1 input"),
                             HasSubstr("rows[0].pool_row = 99"), HasSubstr("max_batch_rows = 8")));
}

TEST_F(BadRecords, PageAndTokenOutOfRangeNameTheirFields) {
  ForwardOp op = decode_op(1);
  op.rows[0].refresh = {0, {5, 200}};  // pages_count = 200
  append_input(0, op);
  EXPECT_THAT(error(), HasSubstr("rows[0].refresh.pages[1] = 200"));
  bytes_.resize(testing::read_bytes(file_.path()).size());
  ForwardOp prefill;
  prefill.rows.push_back(ls::testing::prefill_row(1, 1, 0, 2, 2));
  prefill.rows[0].sampling = SamplingParams{};
  prefill.prefill_token_ids = {4, 512};  // vocab 512
  append_input(0, prefill);
  EXPECT_THAT(error(), HasSubstr("prefill_token_ids[1] = 512"));
}

TEST_F(BadRecords, ValidateForwardOpRunsOnDecodedOps) {
  ForwardOp op = decode_op(1);
  op.rows.push_back(ls::testing::decode_row(10, 1));  // the same pool row twice
  append_input(0, op);
  EXPECT_THAT(error(), AllOf(HasSubstr("step 0 input"), HasSubstr("pool_row 1 is used by an "
                                                                  "earlier row")));
}

TEST_F(BadRecords, StepsMustIncreaseAndOutputsMatchTheirInput) {
  append_input(4, decode_op(1));
  append_output(decode_output(4));
  append_input(4, decode_op(1));
  EXPECT_THAT(error(), HasSubstr("steps must increase"));
  bytes_.resize(testing::read_bytes(file_.path()).size());
  append_input(0, decode_op(1));
  append_output(decode_output(1));
  EXPECT_THAT(error(), HasSubstr("does not match the oldest open step input 0"));
  bytes_.resize(testing::read_bytes(file_.path()).size());
  append_input(0, decode_op(1));
  StepOutputRecord out = decode_output(0);
  out.result.tokens = {3, 4};
  append_output(out);
  EXPECT_THAT(error(), AllOf(HasSubstr("step 0 output"), HasSubstr("tokens holds 2 ids")));
}

// `lockstep check` exits 2 for a record the reader refuses (unusable input), not 1 (a broken
// invariant): check_trace throws, naming the record, instead of reporting a violation.
TEST_F(BadRecords, CheckTraceRefusesARecordTheReaderRefusesAsUnusableInput) {
  append_output(decode_output(0));  // an output with no step input before it
  testing::write_bytes(file_.path(), bytes_);
  EXPECT_THAT([&] { replay::check_trace(file_.path()); },
              ::testing::ThrowsMessage<Error>(AllOf(HasSubstr("the record after step 0 is unusable"),
                                                    HasSubstr("has no open step input"))));
}

TEST_F(BadRecords, OutputWithoutInputAndTooManyOpenSteps) {
  append_output(decode_output(0));
  EXPECT_THAT(error(), HasSubstr("has no open step input"));
  bytes_.resize(testing::read_bytes(file_.path()).size());
  append_input(0, decode_op(1));
  append_input(1, decode_op(1));
  append_input(2, decode_op(1));
  EXPECT_THAT(error(), HasSubstr("at most 2 may be open"));
}

// Issue 19: a cache op's state slot (CacheOp.stateSlot) is checked like its pages — -1, or a slot
// of the pool, and only on an op with pages (the state travels with the first host page).
class BadStateSlots : public BadRecords {
 protected:
  ExecutorConfig config() const override {
    ExecutorConfig c = ls::testing::small_config();
    c.host_pages_count = 4, c.mamba_slots_count = 3;
    return c;
  }
  static CacheOp swap_in(int32_t state_slot) {
    return {.kind = CacheOpKind::kSwapIn, .device_pages = {7, 8}, .host_pages = {2, 0},
            .state_slot = state_slot};
  }
};

TEST_F(BadStateSlots, ASlotOutsideThePoolOrWithoutPagesIsRefusedNamingTheField) {
  const size_t clean = bytes_.size();
  append_input(0, decode_op(1), {swap_in(-1), swap_in(2)});
  EXPECT_EQ(error(), "");
  const auto refused = [&](CacheOp op, const std::string& message) {
    bytes_.resize(clean);
    append_input(0, decode_op(1), {swap_in(0), std::move(op)});
    EXPECT_THAT(error(), AllOf(HasSubstr("step 0 input"), HasSubstr(message)));
  };
  refused(swap_in(3), "cache_ops[1].state_slot = 3 is outside [-1, mamba_slots_count = 3)");
  refused(swap_in(-2), "cache_ops[1].state_slot = -2 is outside [-1, mamba_slots_count = 3)");
  refused(CacheOp{.kind = CacheOpKind::kSwapOut, .state_slot = 1},
          "cache_ops[1].state_slot = 1 with no pages: the state travels with the first host page");
}

TEST(ReaderErrors, NotATraceAndEmptyFile) {
  const std::string text = "hello, this is not a trace at all........";
  EXPECT_THAT(read_all(std::as_bytes(std::span(text))), HasSubstr("record 0"));
  EXPECT_THAT(read_all({}), HasSubstr("empty file"));
  EXPECT_THAT([] { TraceReader::open("/nonexistent/file.trace"); },
              ::testing::ThrowsMessage<Error>(HasSubstr("cannot open trace")));
}

TEST(ReaderErrors, AReaderThatFailedKeepsFailing) {
  TempPath file("fail_twice");
  testing::record_workload(file.path(), 1);
  std::vector<std::byte> bytes = testing::read_bytes(file.path());
  const std::vector<Boundary> boundaries = boundaries_of(bytes);
  bytes[boundaries[0].end] = std::byte{0xff};  // the second frame's length: its check fails
  bytes[boundaries[0].end + 1] = std::byte{0xff};
  TraceReader reader = TraceReader::from_bytes(bytes);
  TraceRecord record;
  EXPECT_THROW(reader.next(record), Error);
  EXPECT_THAT([&] { reader.next(record); },
              ::testing::ThrowsMessage<Error>(HasSubstr("already failed")));
}

}  // namespace
}  // namespace ls::trace
