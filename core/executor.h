// The executor: turns one forward op into a step result by running DESIGN.md's per-step rules
// 1–9 on a backend, in order. It owns the rules and the host-side per-pool-row sampling state;
// the backend owns arithmetic and device memory. submit() enqueues a step and collect() returns
// the oldest step's result, so the host can plan and submit step k+1 while the device runs step
// k; step() is the two back to back.
#pragma once

#include "core/backend.h"
#include "core/config.h"
#include "core/forward_op.h"
#include "core/step_plan.h"
#include "core/step_result.h"

#include <array>
#include <cstdint>
#include <vector>

namespace ls {

struct ExecutorOptions {
  bool capture_logits = false;  // return every logits row in StepResult::logits (tests)
  bool want_logprobs = false;
  // Fill StepResult's trace data (logits digests, the top `top_logits_count` logits of each
  // logits row, the state of the step's rows) inside the step: what a recorder needs.
  bool record = false;
  int32_t top_logits_count = 0;  // 0..kTopLogitsCountMax
  // Capture every step's per-layer activations (core/activations.h) into
  // StepResult::activations — their digests (--record-activations) or their values. The backend
  // must support it (Backend::capture_activations refuses otherwise).
  ActivationCapture activations = ActivationCapture::kOff;
};

// Faults planted into one step. Rows are op rows.
struct StepFaults {
  static constexpr float kNaN = __builtin_nanf("");
  std::vector<int32_t> poisoned_rows;  // every logits row of these rows becomes poison_value
  float poison_value = kNaN;           // NaN (flagged) or ±inf (sanitised, not flagged)
  std::vector<std::pair<int32_t, int32_t>> forced_outputs;  // (row, id) emitted before the clamp

  bool empty() const { return poisoned_rows.empty() && forced_outputs.empty(); }
  bool operator==(const StepFaults& o) const {
    // NaN != NaN: compare the poison value's bits.
    return poisoned_rows == o.poisoned_rows && forced_outputs == o.forced_outputs &&
           __builtin_memcmp(&poison_value, &o.poison_value, sizeof(float)) == 0;
  }
};

struct ExecutorStats {
  int64_t steps_count = 0;
  int64_t table_slices_clamped = 0;  // refresh slices cut at the table width (past-context rows)
};

class Executor {
 public:
  // Steps submitted and not yet collected, at most: step k+1 may be submitted before step k is
  // collected, never step k+2.
  static constexpr int32_t kInFlightMax = 2;

  // `backend` is borrowed and must outlive the executor.
  Executor(const ExecutorConfig& config, int32_t vocab_size, Backend& backend,
           ExecutorOptions options = {});

  // Validates the op (ls::Error on any malformed field; nothing changes then), plans it and
  // enqueues rules 1–9 on the backend with the faults planted before this call. A backend that
  // can run ahead returns at once; one that cannot completes the step here and the result waits
  // for collect(). ls::Error, changing nothing, when kInFlightMax steps are in flight.
  void submit(const ForwardOp& op);
  // The result of the oldest submitted step, waiting for it, into `result`, reusing its
  // vectors' capacity (a caller's loop allocates nothing). ls::Error when none is in flight.
  void collect(StepResult& result);
  // submit + collect: one step at a time. ls::Error when a step is in flight.
  void step(const ForwardOp& op, StepResult& result);
  // By value, a fresh StepResult each: for tests and bindings, never a serving loop.
  StepResult collect();
  StepResult step(const ForwardOp& op);

  // Executes KV page copies (retraction by swap), with the recurrent state of op.state_slot on a
  // model with Mamba layers. Throws ls::Error on an index out of range.
  // Ordered after every submitted step and before the next one.
  void copy_pages(const CacheOp& op);

  int32_t in_flight_count() const {
    return static_cast<int32_t>(submitted_count_ - collected_count_);
  }
  // Whether submit returns before the step completed (the backend can run ahead).
  bool runs_ahead() const { return backend_.can_run_ahead(); }

  // Fault sites (simulator, tests, replay): what the next submitted step injects. Taken by that
  // submit, even when it rejects the op; recorded with the step's input so a replay injects the
  // same.
  void poison_next_step(std::vector<int32_t> op_rows, float value = StepFaults::kNaN) {
    faults_.poisoned_rows = std::move(op_rows);
    faults_.poison_value = value;
  }
  void force_next_output(int32_t op_row, int32_t token) {
    faults_.forced_outputs.push_back({op_row, token});
  }
  void inject_next_step(StepFaults faults) { faults_ = std::move(faults); }
  const StepFaults& pending_faults() const { return faults_; }

  const ExecutorConfig& config() const { return config_; }
  const ExecutorStats& stats() const { return stats_; }
  const ExecutorOptions& options() const { return options_; }
  int32_t vocab_size() const { return vocab_size_; }
  Backend& backend() { return backend_; }
  // The plan of the last submitted step, for recorders and tests.
  const StepPlan& last_plan() const {
    const int64_t last = submitted_count_ + kInFlightMax - 1;
    return in_flight_[static_cast<size_t>(last % kInFlightMax)].plan;
  }

 private:
  // One submitted step: its plan stays alive and unchanged until the step is collected (the
  // backend unpacks against it), so plans are double-buffered; vectors keep their capacity.
  struct InFlight {
    StepPlan plan;
    StepResult result;     // held here when the backend completed the step at submit
    bool deferred = false;  // true: the backend holds the step until collect_finish
    StepActivations activations;  // ExecutorOptions::activations: taken right after the forward
  };

  void validate_state_copy(const CacheOp& op) const;
  int32_t plan_step(const ForwardOp& op, StepPlan& plan) const;
  int32_t plan_rows(const ForwardOp& op, StepPlan& plan) const;
  static void plan_mamba_row(const OpRow& row, int32_t row_index, ForwardMode mode,
                             int32_t verify_base, StepPlan& p);
  void plan_sampling(const ForwardOp& op, StepPlan& plan) const;
  void commit_sampling(const ForwardOp& op, const StepPlan& plan);
  void plan_poisoned_rows(const StepFaults& faults, const StepPlan& plan);
  static void plan_forced_outputs(const StepFaults& faults, StepPlan& plan);

  ExecutorConfig config_;
  int32_t vocab_size_;
  Backend& backend_;
  ExecutorOptions options_;
  ForwardOpValidator validator_;  // after config_: sized from its validated limits
  ExecutorStats stats_;
  std::array<InFlight, kInFlightMax> in_flight_;  // step k in [k % kInFlightMax]
  int64_t submitted_count_ = 0;
  int64_t collected_count_ = 0;
  StepFaults faults_;  // for the next step
  std::vector<int32_t> poisoned_logits_rows_;  // the submitting step's, reused

  // Per pool row: which request last sat there and its resolved sampling (the seed's "flip").
  std::vector<RequestId> owner_;       // [pool rows]
  std::vector<uint8_t> owned_;         // [pool rows]
  std::vector<ResolvedSampling> sampling_;  // [pool rows]
};

}  // namespace ls
