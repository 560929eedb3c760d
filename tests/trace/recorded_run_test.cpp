// A trace recorded while the real executor runs reads back with the ops it was given and the
// results it returned; the recorder's bounded queue waits instead of dropping.
#include "tests/trace/trace_test_support.h"
#include "trace/digests.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <xxhash.h>

namespace ls::trace {
namespace {

using ::testing::HasSubstr;
using testing::RecordedRun;
using testing::TempPath;

TEST(RecordedRun, ReadsBackIdenticalOpsResultsAndState) {
  TempPath file("run");
  const RecordedRun run = testing::record_workload(file.path(), 12);
  ASSERT_GE(run.inputs.size(), 10u);
  TraceReader reader = TraceReader::open(file.path());
  EXPECT_EQ(reader.header().weights_digest, ls::testing::tiny_weights().digest());
  size_t inputs = 0, outputs = 0, events = 0;
  int64_t mixed_steps = 0, tokens_total = 0;
  TraceRecord record;
  while (reader.next(record)) {
    if (const auto* in = std::get_if<StepInputRecord>(&record)) {
      ASSERT_LT(inputs, run.inputs.size());
      EXPECT_EQ(*in, run.inputs[inputs]) << "step " << in->step;
      mixed_steps += in->op.mode() == ForwardMode::kMixed ? 1 : 0;
      ++inputs;
    } else if (const auto* out = std::get_if<StepOutputRecord>(&record)) {
      ASSERT_LT(outputs, run.results.size());
      EXPECT_EQ(out->step, run.inputs[outputs].step);
      EXPECT_EQ(out->result, run.results[outputs]) << "step " << out->step;
      const StateSnapshot& s = run.snapshots[outputs];
      EXPECT_EQ(out->valid_cache_lengths, s.valid_cache_length);
      ASSERT_EQ(out->future_input_digests.size(), s.pool_rows.size());
      for (size_t r = 0; r < s.pool_rows.size(); ++r) {
        EXPECT_EQ(out->future_input_digests[r], XXH3_64bits(&s.future_inputs[r], 4));
      }
      // Logits were captured: one digest and 8 pairs per logits row.
      EXPECT_EQ(out->logits_digests.size(), out->result.tokens.size());
      EXPECT_EQ(out->top_logits.size(), 8 * out->result.tokens.size());
      tokens_total += static_cast<int64_t>(out->result.tokens.size());
      ++outputs;
    } else if (const auto* e = std::get_if<TraceEvent>(&record)) {
      ASSERT_LT(events, run.events.size());
      EXPECT_EQ(*e, run.events[events]);
      ++events;
    }
  }
  EXPECT_EQ(inputs, run.inputs.size());
  EXPECT_EQ(outputs, run.results.size());
  EXPECT_EQ(events, run.events.size());
  EXPECT_EQ(events, 24u);  // 12 arrivals and 12 finishes
  EXPECT_GT(mixed_steps, 0);
  EXPECT_GT(tokens_total, 0);
  EXPECT_EQ(reader.complete_steps(), static_cast<int64_t>(run.inputs.size()));
  ASSERT_TRUE(reader.footer().has_value());
  EXPECT_EQ(reader.footer()->steps_count, static_cast<int64_t>(run.inputs.size()));
  EXPECT_FALSE(reader.truncation().has_value());

  const TraceSummary summary = verify_trace(file.path());
  EXPECT_EQ(summary.complete_steps, static_cast<int64_t>(run.inputs.size()));
  EXPECT_EQ(summary.events_count, 24);
  EXPECT_TRUE(summary.has_footer);
}

TEST(Recorder, BoundedQueueWaitsInsteadOfDropping) {
  TempPath file("bounded");
  const ExecutorConfig config = ls::testing::small_config();
  auto recorder = Recorder::open(file.path(), testing::header_for(config),
                                 {.max_in_flight_bytes = 512, .write_batch_bytes = 64});
  constexpr int kEvents = 20000;
  for (int i = 0; i < kEvents; ++i) {
    // Each a new request arriving (an event must name a request the trace knows of).
    recorder->record_event({.kind = EventKind::kArrive, .request_id = static_cast<RequestId>(i),
                            .step = 0, .detail = "arrival " + std::to_string(i)});
  }
  recorder->close();
  const RecorderStats stats = recorder->stats();
  EXPECT_GT(stats.waits, 0);
  EXPECT_GT(stats.wait_ns, 0);
  EXPECT_LE(stats.in_flight_bytes_max, 512u + 256u);  // one record may exceed the bound alone
  EXPECT_EQ(stats.records_written, kEvents + 2);      // header and footer
  TraceReader reader = TraceReader::open(file.path());
  TraceRecord record;
  int i = 0;
  while (reader.next(record)) {
    if (const auto* e = std::get_if<TraceEvent>(&record)) {
      ASSERT_EQ(e->request_id, static_cast<RequestId>(i)) << "record lost or reordered";
      ++i;
    }
  }
  EXPECT_EQ(i, kEvents);
}

TEST(Recorder, AnInvalidOpBecomesAStepRejectedEvent) {
  TempPath file("rejected");
  const ExecutorConfig config = ls::testing::small_config();
  {
    auto recorder = Recorder::open(file.path(), testing::header_for(config));
    ForwardOp op;
    op.rows.push_back(ls::testing::decode_row(5, 99));  // pool row 99 > max_batch_rows 8
    recorder->record_input(0, op);
    recorder->close();
    EXPECT_EQ(recorder->stats().rejected_ops, 1);
  }
  TraceReader reader = TraceReader::open(file.path());
  TraceRecord record;
  ASSERT_TRUE(reader.next(record));
  const TraceEvent& e = std::get<TraceEvent>(record);
  EXPECT_EQ(e.kind, EventKind::kStepRejected);
  EXPECT_EQ(e.step, 0);
  EXPECT_THAT(e.detail, HasSubstr("pool_row"));
  EXPECT_EQ(reader.step_inputs_read(), 0);
}

TEST(Recorder, OverlappedStepsAndRejectionsCloseInOrder) {
  TempPath file("overlap");
  const ExecutorConfig config = ls::testing::small_config();
  ls::testing::Harness h(config);
  {
    auto recorder = Recorder::open(file.path(), testing::header_for(config, {.capture_logits = true}));
    ForwardOp first;
    first.rows.push_back(ls::testing::prefill_row(1, 1, 0, 4, 4));
    first.rows[0].refresh = {0, {1, 2}};
    first.rows[0].sampling = SamplingParams{};
    first.prefill_token_ids = {1, 2, 3, 4};
    ForwardOp second;  // no sampling for a request new to its row: the executor rejects it
    second.rows.push_back(ls::testing::prefill_row(2, 2, 0, 2, 2));
    second.prefill_token_ids = {5, 6};
    recorder->record_input(0, first);
    recorder->record_input(1, second);  // recorded before step 0's output: overlap depth 2
    const StepResult r = h.executor.step(first);
    recorder->record_output(0, r, {});
    EXPECT_THROW(h.executor.step(second), Error);
    recorder->record_rejection(1, "missing sampling parameters");
    recorder->close();
  }
  const TraceSummary summary = verify_trace(file.path());
  EXPECT_EQ(summary.step_inputs_count, 2);
  EXPECT_EQ(summary.step_outputs_count, 1);
  EXPECT_EQ(summary.complete_steps, 2);
  EXPECT_FALSE(summary.truncation.has_value());
}

TEST(Recorder, UnwritablePathIsAnError) {
  EXPECT_THAT(
      [] {
        Recorder::open("/nonexistent-dir/x.trace", testing::header_for(ls::testing::small_config()));
      },
      ::testing::ThrowsMessage<Error>(HasSubstr("cannot create trace file")));
}

}  // namespace
}  // namespace ls::trace

namespace ls::trace {
namespace {

// An output that does not match its header (the header promises logits digests, the executor
// computed none) is the caller's error, reported by the next call, never an abort; what was
// written before it stays readable.
TEST(Recorder, AnOutputThatBreaksTheHeaderIsAnErrorForTheCaller) {
  TempPath file("mismatch");
  const ExecutorConfig config = ls::testing::small_config();
  ls::testing::Harness h(config, nullptr);
  ForwardOp op;
  op.rows.push_back(ls::testing::prefill_row(1, 1, 0, 4, 4));
  op.rows[0].refresh = {0, {1, 2}};
  op.rows[0].sampling = SamplingParams{};
  op.prefill_token_ids = {1, 2, 3, 4};
  auto recorder = Recorder::open(file.path(), testing::header_for(config, {.capture_logits = true}));
  recorder->record_input(0, op);
  StepResult r = h.executor.step(op);
  r.logits.clear();  // no digests can be made: the header says there are
  recorder->record_output(0, r, {});
  EXPECT_THAT([&] { recorder->close(); },
              ::testing::ThrowsMessage<Error>(::testing::AllOf(
                  ::testing::HasSubstr("step output 0 does not match the trace's header"),
                  ::testing::HasSubstr("logits_digests holds 0 digests, expected 1"))));
  TraceReader reader = TraceReader::open(file.path());
  TraceRecord record;
  ASSERT_TRUE(reader.next(record));
  EXPECT_TRUE(std::holds_alternative<StepInputRecord>(record));
  EXPECT_FALSE(reader.next(record));
  ASSERT_TRUE(reader.truncation());
  EXPECT_TRUE(reader.truncation()->footer_missing);
}

}  // namespace
}  // namespace ls::trace
