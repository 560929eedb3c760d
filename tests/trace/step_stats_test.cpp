// Step stats records (issue 17): written after their step's output, read back field by field,
// and refused when out of order or out of the header's limits — by the reader, naming the field.
#include "tests/trace/trace_test_support.h"
#include "trace/checks.h"

#include <gtest/gtest.h>

namespace ls::trace {
namespace {

using testing::TempPath;

ForwardOp one_prefill_row() {
  ForwardOp op;
  op.rows.push_back(OpRow{.kind = RowKind::kPrefill, .request_id = 3, .pool_row = 1,
                          .input_length = 2, .prefix_length = 0, .prompt_length = 2,
                          .refresh = {0, {1}}, .sampling = SamplingParams{}});
  op.prefill_token_ids = {5, 6};
  return op;
}

StepOutputRecord output_of_step(int64_t step) {
  StepOutputRecord out;
  out.step = step;
  out.result.mode = ForwardMode::kExtend;
  out.result.prefill_rows_count = 1;
  out.result.tokens = {9};
  out.result.accepted_lengths = {1};
  out.result.nan_flags = {0};
  out.result.oov_flags = {0};
  out.valid_cache_lengths = {2};
  out.future_input_digests = {0};
  return out;
}

TraceHeader stats_header() {
  TraceHeader h = testing::header_for(ls::testing::small_config());
  h.step_clock = "steady";
  h.device_timer = "host-clock";
  return h;
}

StepStatsRecord stats_of_step(int64_t step) {
  return StepStatsRecord{.step = step, .submit_ns = 1000, .done_ns = 4500, .wait_ns = 3000,
                         .device_busy_ns = 3400, .device_idle_before_ns = 120, .pages_used = 7,
                         .pages_free = 150, .prefix_hit_tokens = 4, .queue_length = 2,
                         .running_count = 1};
}

TEST(TraceStepStats, ReadBackFieldByFieldAfterTheirStepsOutput) {
  TempPath file("stats");
  const StepStatsRecord stats = stats_of_step(0);
  {
    auto recorder = Recorder::open(file.path(), stats_header());
    recorder->record_input(0, one_prefill_row());
    recorder->record_output(output_of_step(0));
    recorder->record_stats(stats);
    recorder->close();
  }
  TraceReader reader = TraceReader::open(file.path());
  EXPECT_EQ(reader.header().step_clock, "steady");
  EXPECT_EQ(reader.header().device_timer, "host-clock");
  TraceRecord record;
  ASSERT_TRUE(reader.next(record));
  ASSERT_TRUE(reader.next(record));
  ASSERT_TRUE(reader.next(record));
  ASSERT_TRUE(std::holds_alternative<StepStatsRecord>(record));
  const StepStatsRecord& got = std::get<StepStatsRecord>(record);
  EXPECT_EQ(got.submit_ns, 1000);
  EXPECT_EQ(got.done_ns, 4500);
  EXPECT_EQ(got.wait_ns, 3000);
  EXPECT_EQ(got.device_busy_ns, 3400);
  EXPECT_EQ(got.device_idle_before_ns, 120);
  EXPECT_EQ(got.pages_used, 7);
  EXPECT_EQ(got.pages_free, 150);
  EXPECT_EQ(got.prefix_hit_tokens, 4);
  EXPECT_EQ(got.queue_length, 2);
  EXPECT_EQ(got.running_count, 1);
  EXPECT_EQ(got, stats);
  ASSERT_TRUE(reader.next(record));
  EXPECT_TRUE(std::holds_alternative<TraceFooter>(record)) << "the footer does not count stats";
}

// The sequence and value checks the reader runs (the recorder runs the same before it writes).
TEST(TraceStepStats, OutOfOrderOrOutOfLimitsIsRefusedNamingTheField) {
  const TraceHeader h = stats_header();
  const auto sequence_after_output = [&h] {
    TraceSequence s(h);
    StepInputRecord in{.step = 0, .op = one_prefill_row()};
    s.on_input(in);
    s.on_output(output_of_step(0));
    return s;
  };
  {
    TraceSequence s(h);
    EXPECT_THROW(s.on_stats(stats_of_step(0)), Error) << "stats before their step's output";
  }
  {
    TraceSequence s = sequence_after_output();
    s.on_stats(stats_of_step(0));
    EXPECT_THROW(s.on_stats(stats_of_step(0)), Error) << "a second stats record for one step";
  }
  const auto refused = [&h](StepStatsRecord s, const std::string& field) {
    try {
      check_step_stats(s, h);
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(field), std::string::npos) << e.what();
      return;
    }
    ADD_FAILURE() << "accepted stats with a bad " << field;
  };
  StepStatsRecord s = stats_of_step(0);
  s.done_ns = s.submit_ns - 1;
  refused(s, "done_ns");
  s = stats_of_step(0);
  s.pages_free = h.executor.pages_count;
  refused(s, "pages_free");
  s = stats_of_step(0);
  s.running_count = h.executor.max_batch_rows + 1;
  refused(s, "running_count");
  s = stats_of_step(0);
  s.device_idle_before_ns = -2;
  refused(s, "device_idle_before_ns");
  TraceHeader no_clock = h;
  no_clock.step_clock.clear();
  EXPECT_THROW(check_step_stats(stats_of_step(0), no_clock), Error);
}

}  // namespace
}  // namespace ls::trace
