// Sees every step a serving loop runs — how a recorder taps the executor without the executor
// knowing about traces. All calls happen on the loop's thread, in step order.
#pragma once

#include "core/backend.h"
#include "core/cache_op.h"
#include "core/executor.h"
#include "core/forward_op.h"
#include "core/scheduler.h"
#include "core/step_result.h"
#include "core/step_stats.h"

#include <cstdint>
#include <string>
#include <vector>

namespace ls {

class StepObserver {
 public:
  virtual ~StepObserver() = default;
  // Before the step executes: its op, the cache ops that ran just before it, its planted faults.
  virtual void on_step_input(int64_t step, const ForwardOp& op, const std::vector<CacheOp>& cache_ops,
                             const StepFaults& faults) = 0;
  // After the step completed; `state` holds the op's pool rows (in op row order) after the step.
  virtual void on_step_output(int64_t step, const ForwardOp& op, const StepResult& result,
                              const StateSnapshot& state) = 0;
  virtual void on_scheduler_events(int64_t step, const std::vector<SchedulerEvent>& events) = 0;
  // After on_step_output, when the loop has a clock: when and how the step ran (core/step_stats.h).
  virtual void on_step_stats(const StepStats& /*stats*/) {}
  // The executor rejected the step's op (ls::Error); nothing of it ran.
  virtual void on_step_rejected(int64_t /*step*/, const std::string& /*message*/) {}
};

}  // namespace ls
