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

  // A fault site: every logits row of these op rows in the next step becomes `value` (NaN by
  // default) before the NaN guard runs.
  void poison_next_step(std::vector<int32_t> op_rows, float value = kNaN) {
    poison_rows_ = std::move(op_rows);
    poison_value_ = value;
  }
  static constexpr float kNaN = __builtin_nanf("");
  // A fault site: the next step emits `token` (any value, e.g. outside [0, V)) as the first output
  // of this op row, before the out-of-vocab flag and the clamp see it.
  void force_next_output(int32_t op_row, int32_t token) { forced_rows_.push_back({op_row, token}); }

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
  std::vector<int32_t> poisoned_logits_rows() const;
  void plan_forced_outputs();

  ExecutorConfig config_;
  int32_t vocab_size_;
  Backend& backend_;
  ExecutorOptions options_;
  ExecutorStats stats_;
  StepPlan plan_;  // reused every step: its vectors keep their capacity
  std::vector<int32_t> poison_rows_;
  float poison_value_ = kNaN;
  std::vector<std::pair<int32_t, int32_t>> forced_rows_;  // (op row, id) for the next step

  // Per pool row: which request last sat there and its resolved sampling (the seed's "flip").
  std::vector<RequestId> owner_;       // [pool rows]
  std::vector<uint8_t> owned_;         // [pool rows]
  std::vector<ResolvedSampling> sampling_;  // [pool rows]
};

}  // namespace ls
