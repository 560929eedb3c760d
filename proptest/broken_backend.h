// Test doubles for the property tests' companions (issue 5 "Acceptance"): a Backend that delegates
// every rule to the CPU reference but breaks exactly one of them, so each property can be shown to
// catch a bug. Never used by production code.
#pragma once

#include "core/backend.h"
#include "core/cpu_backend.h"

#include <cstdint>
#include <deque>
#include <memory>
#include <string_view>

namespace ls::proptest {

enum class BackendBug : uint8_t {
  kNone,
  kSkipChunkReset,        // rule 2: prefill rows with a prefix > 0 keep their stale vcl
  kSkipRecoveryReset,     // rule 2: decode rows with hist_token_length keep their stale vcl
  kShiftedChunkSlots,     // rule 3: later prefill chunks start one position late (slot off by one)
  kPaddedRowLivePage,     // rule 3: a padded row on the sentinel reads a table row holding page 1
  kNoContextClamp,        // rule 7: a decode row at the context limit reports a' = 1, not 0
  kNanGuardMissesDecode,  // rule 5: NaN flags of decode rows are dropped
  kRngByPoolRow,          // sampling draws keyed by the pool row as well as the request seed
  kRngByBatchRow,         // sampling draws keyed by the row's index in the op
};

std::string_view to_string(BackendBug bug);

// Counts calls so a property can assert that a rejected op reached no backend rule.
class BrokenBackend final : public Backend {
 public:
  BrokenBackend(std::unique_ptr<CpuBackend> inner, BackendBug bug, const ExecutorConfig& config)
      : inner_(std::move(inner)), bug_(bug), config_(config) {}

  std::string name() const override { return inner_->name(); }
  void apply_table_writes(const StepPlan& plan) override;
  void reset_lengths(const StepPlan& plan) override;
  void fill_inputs(const StepPlan& plan) override;
  void forward(const StepPlan& plan) override {
    ++calls_;
    inner_->forward(plan);
  }
  void poison_logits(std::span<const int32_t> logits_rows, float value) override {
    ++calls_;
    inner_->poison_logits(logits_rows, value);
  }
  void finish_step(const StepPlan& plan, StepResult& result) override;
  void copy_pages(const CacheOp& op) override { inner_->copy_pages(op); }
  StateSnapshot read_state(std::span<const int32_t> pool_rows) const override {
    return inner_->read_state(pool_rows);
  }
  InputSnapshot read_inputs() const override { return inner_->read_inputs(); }

  int64_t rule_calls() const { return calls_; }
  BackendBug bug() const { return bug_; }

 private:
  std::unique_ptr<CpuBackend> inner_;
  BackendBug bug_;
  ExecutorConfig config_;
  int64_t calls_ = 0;
};

// A backend that runs ahead (Backend::can_run_ahead) over the CPU reference: each step is computed
// when its finish is enqueued and handed out when it is collected, as the CUDA backend's stream
// order does. `single_result_slot` plants the bug its double-buffered pinned results avoid: every
// enqueued step's result lands in one slot, so with two steps in flight collecting the older one
// returns the newer one's result.
class RunAheadBackend final : public Backend {
 public:
  RunAheadBackend(std::unique_ptr<CpuBackend> inner, bool single_result_slot)
      : inner_(std::move(inner)), single_result_slot_(single_result_slot) {}

  std::string name() const override { return inner_->name(); }
  void apply_table_writes(const StepPlan& plan) override { inner_->apply_table_writes(plan); }
  void reset_lengths(const StepPlan& plan) override { inner_->reset_lengths(plan); }
  void fill_inputs(const StepPlan& plan) override { inner_->fill_inputs(plan); }
  void forward(const StepPlan& plan) override { inner_->forward(plan); }
  void poison_logits(std::span<const int32_t> logits_rows, float value) override {
    inner_->poison_logits(logits_rows, value);
  }
  void finish_step(const StepPlan& plan, StepResult& result) override {
    inner_->finish_step(plan, result);
  }
  bool can_run_ahead() const override { return true; }
  void enqueue_finish(const StepPlan& plan) override;
  void collect_finish(const StepPlan& plan, StepResult& result) override;
  void copy_pages(const CacheOp& op) override { inner_->copy_pages(op); }
  StateSnapshot read_state(std::span<const int32_t> pool_rows) const override {
    return inner_->read_state(pool_rows);
  }
  InputSnapshot read_inputs() const override { return inner_->read_inputs(); }

  int64_t steps_enqueued() const { return enqueued_; }
  int32_t max_in_flight() const { return max_in_flight_; }

 private:
  std::unique_ptr<CpuBackend> inner_;
  bool single_result_slot_;
  std::deque<StepResult> pending_;
  int64_t enqueued_ = 0;
  int32_t max_in_flight_ = 0;
};

}  // namespace ls::proptest
