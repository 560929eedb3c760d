// The checks a trace must pass, shared by both ends (STYLE.md §10): the recorder runs them before
// it writes a record (a failure there is a bug, or — for an op — a rejected step), the reader runs
// them again after it decodes one. Each throws ls::Error naming the field and the limit; callers
// add the record number and step.
#pragma once

#include "trace/records.h"

#include <cstdint>
#include <span>
#include <array>
#include <unordered_set>
#include <vector>

namespace ls::trace {

// Header: magic/version are checked by the reader itself; this checks that every limit is in its
// declared range (ModelConfig/ExecutorConfig::validate) and the recorded options are sane.
void check_header(const TraceHeader& header);

// Every index of the op against the header's limits, then (when `full`) ls::validate_forward_op.
void check_step_input(const StepInputRecord& record, const TraceHeader& header, bool full = true);

// The shape of an open step, remembered between its input and output records.
struct OpenStep {
  int64_t step = 0;
  int32_t rows_count = 0;
  int32_t prefill_rows_count = 0;
  int32_t tokens_count = 0;  // the op's tokens: prefill tokens, then W per decode row
};

// Counts against the open step's op and values against the header's limits.
void check_step_output(const StepOutputRecord& record, const OpenStep& open,
                       const TraceHeader& header);

void check_event(const TraceEvent& event, const TraceHeader& header);

// Whether the header says the steps recorded logits digests and top-k logits.
bool header_records_logits(const TraceHeader& header);
// One step's top-k pairs, [logits rows, k]: ids in range and distinct within a row (the order
// implies it), finite logits in rank order.
void check_top_logits(std::span<const TopLogit> top, int32_t k, int32_t vocab);
// Times in order, counts within the header's limits, and a header that names its clocks.
void check_step_stats(const StepStatsRecord& stats, const TraceHeader& header);

// The footer's step index, compared in O(1) memory: a count and a running hash of the offsets.
struct OffsetsDigest {
  int64_t count = 0;
  uint64_t hash = 0;
  void add(uint64_t offset);
  bool operator==(const OffsetsDigest&) const = default;
};

// The ordering rules of trace/trace.capnp, as a small state machine over the records. It holds
// the open steps, and the requests a later event may name (those arrived or run and not yet
// finished or aborted): its memory follows the requests in flight, not the trace's length.
class TraceSequence {
 public:
  explicit TraceSequence(const TraceHeader& header) : header_(&header) {}

  // Each throws ls::Error when the record breaks an ordering rule; the values are checked by
  // the check_* functions above, which these call.
  void on_input(const StepInputRecord& record, bool full_op_check = true);
  void on_output(const StepOutputRecord& record);
  // A stepRejected event for the oldest open step closes it.
  void on_event(const TraceEvent& event);
  // A stepStats record follows its step's output: the last completed step, once.
  void on_stats(const StepStatsRecord& stats);
  // `seen`: the byte offsets of step input records 0, stride, 2·stride, … as read.
  void on_footer(const TraceFooter& footer, const OffsetsDigest& seen);

  int64_t inputs_count() const { return inputs_count_; }
  int64_t outputs_count() const { return outputs_count_; }
  int64_t events_count() const { return events_count_; }
  int64_t complete_steps() const { return complete_steps_; }
  bool has_open_step() const { return open_count_ > 0; }
  const OpenStep& oldest_open() const { return open_[open_first_]; }
  int64_t last_input_step() const { return last_input_step_; }
  bool footer_seen() const { return footer_seen_; }

 private:
  void check_event_order(const TraceEvent& event) const;
  void check_event_request(const TraceEvent& event) const;
  void track_requests(const TraceEvent& event);
  void pop_open();

  const TraceHeader* header_;
  std::array<OpenStep, kOpenStepsMax> open_{};  // a ring: no allocation per step
  int32_t open_first_ = 0;
  int32_t open_count_ = 0;
  int64_t last_input_step_ = -1;
  int64_t last_event_step_ = -1;
  std::unordered_set<RequestId> live_;  // arrived or run, not finished or aborted
  // Finished or aborted at these event steps: a step planned before the finish was known may
  // still carry them (overlap) without making them live again.
  std::vector<std::pair<RequestId, int64_t>> recently_ended_;
  std::vector<RequestId> last_input_requests_;  // a fault event may name a row of the last step
  int64_t last_output_step_ = -1;
  int64_t last_stats_step_ = -1;
  int64_t inputs_count_ = 0;
  int64_t outputs_count_ = 0;
  int64_t events_count_ = 0;
  int64_t complete_steps_ = 0;
  bool footer_seen_ = false;
};

}  // namespace ls::trace
