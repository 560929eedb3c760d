// The executor: turns one forward op into a step result by running DESIGN.md's per-step rules
// 1–9 on a backend, in order. It owns the rules and the host-side per-pool-row sampling state;
// the backend owns arithmetic and device memory.
#pragma once

#include "core/backend.h"
#include "core/config.h"
#include "core/forward_op.h"
#include "core/step_plan.h"
#include "core/step_result.h"

#include <cstdint>
#include <vector>

namespace ls {

struct ExecutorOptions {
  bool capture_logits = false;  // return every logits row in StepResult::logits
  bool want_logprobs = false;
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
  // `backend` is borrowed and must outlive the executor.
  Executor(const ExecutorConfig& config, int32_t vocab_size, Backend& backend,
           ExecutorOptions options = {});

  // Validates the op (ls::Error on any malformed field; nothing changes then), plans and runs it.
  StepResult step(const ForwardOp& op);

  // Executes KV page copies (retraction by swap). Throws ls::Error on an index out of range.
  void copy_pages(const CacheOp& op);

  // Fault sites (simulator, tests, replay): what the next step injects. Cleared by each step;
  // recorded with the step's input so a replay injects the same.
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
  int32_t vocab_size() const { return vocab_size_; }
  Backend& backend() { return backend_; }
  // The plan of the last step, for recorders and tests.
  const StepPlan& last_plan() const { return plan_; }

 private:
  void plan_step(const ForwardOp& op);
  void plan_rows(const ForwardOp& op);
  void plan_sampling(const ForwardOp& op);
  void commit_sampling(const ForwardOp& op);
  std::vector<int32_t> poisoned_logits_rows(const StepFaults& faults) const;
  void plan_forced_outputs(const StepFaults& faults);

  ExecutorConfig config_;
  int32_t vocab_size_;
  Backend& backend_;
  ExecutorOptions options_;
  ExecutorStats stats_;
  StepPlan plan_;  // reused every step: its vectors keep their capacity
  StepFaults faults_;  // for the next step

  // Per pool row: which request last sat there and its resolved sampling (the seed's "flip").
  std::vector<RequestId> owner_;       // [pool rows]
  std::vector<uint8_t> owned_;         // [pool rows]
  std::vector<ResolvedSampling> sampling_;  // [pool rows]
};

}  // namespace ls
