// The trace recorder (DESIGN.md "Trace"): the executor's thread hands records to a bounded queue;
// a writer thread checks, encodes and appends them to the file. When the bytes in flight would
// exceed the bound, the caller waits — a record is never dropped — and the wait is counted.
//
//   auto rec = trace::Recorder::open("run.trace", header);
//   rec->record_input(step, op);             // before executor.step(op)
//   StepResult r = executor.step(op);        // on ls::Error: rec->record_rejection(step, e.what())
//   rec->record_output(step, r, backend.read_state(pool rows of op, in op row order));
//   rec->record_event({.kind = EventKind::kFinish, .request_id = id, .step = step, .detail = "eos"});
//   rec->close();                            // footer, flush, fsync; the destructor also closes
//
// Every record is a whole checksummed frame appended with write(2) in batches, so a process
// killed at any moment leaves a complete prefix plus at most one partial frame (which the reader
// reports, with the missing footer). Nothing is allocated per record once the recycled items,
// the queue and the encoder's scratch segment have grown to the run's records.
#pragma once

#include "core/backend.h"
#include "core/forward_op.h"
#include "core/step_result.h"
#include "trace/records.h"

#include <chrono>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>

namespace ls::trace {

struct RecorderOptions {
  uint64_t max_in_flight_bytes = uint64_t{64} << 20;  // queued + being written
  uint64_t write_batch_bytes = uint64_t{1} << 20;     // write(2) at least this often
  // The writer wakes at least this often, or when write_batch_bytes (at most half the in-flight
  // bound) are queued: a killed process loses at most about this much of its last records.
  std::chrono::microseconds writer_period{2000};
  bool write_footer = true;
  bool fsync_on_close = true;
};

struct RecorderStats {
  int64_t records_written = 0;  // messages in the file, header and footer included
  uint64_t bytes_written = 0;
  int64_t writes_count = 0;       // write(2) batches
  int64_t waits = 0;              // record_* calls that had to wait for queue space
  int64_t wait_ns = 0;            // total time they waited (steady clock; statistics only)
  uint64_t in_flight_bytes_max = 0;
  int64_t rejected_ops = 0;       // inputs that failed validation, written as stepRejected events
};

class Recorder {
 public:
  // Creates (truncates) `path`, checks and writes the header synchronously; ls::Error on a bad
  // header or an unwritable path.
  static std::unique_ptr<Recorder> open(const std::filesystem::path& path, const TraceHeader& header,
                                        RecorderOptions options = {});
  ~Recorder();  // close(); an I/O error is printed to stderr because a destructor cannot throw
  Recorder(const Recorder&) = delete;
  Recorder& operator=(const Recorder&) = delete;

  // Before the step executes. The op is copied into recycled storage (no allocation once warm).
  // An op that fails ls::validate_forward_op is not written as an input: the writer records a
  // stepRejected event with the error instead (the executor will reject it the same way).
  void record_input(int64_t step, const ForwardOp& op);
  // The same with the cache ops that ran just before the step and the faults planted into it.
  void record_input(int64_t step, const ForwardOp& op, const std::vector<CacheOp>& cache_ops,
                    const StepFaults& faults);
  void record_input(StepInputRecord&& record);
  // After the step completed. `touched` is read_state() of the op's pool rows in op row order, or
  // empty. Digests and top-k pairs (header.top_logits_count) are computed on the writer thread.
  void record_output(int64_t step, const StepResult& result, const StateSnapshot& touched);
  void record_output(int64_t step, StepResult&& result, StateSnapshot&& touched);
  // A record built by the caller (e.g. with make_step_output).
  void record_output(StepOutputRecord&& record);
  void record_event(TraceEvent event);
  // After the step's output: when and how it ran (header.step_clock and device_timer set).
  void record_stats(const StepStatsRecord& stats);
  // The executor rejected the op of an open step: a stepRejected event closes it.
  void record_rejection(int64_t step, std::string message);

  // Drains the queue, writes the footer, flushes and fsyncs. Idempotent. ls::Error if any write
  // failed (then every later record_* call also throws).
  void close();
  RecorderStats stats() const;
  const TraceHeader& header() const;

 private:
  struct State;
  explicit Recorder(std::unique_ptr<State> state);
  std::unique_ptr<State> state_;
};

}  // namespace ls::trace
