// The production driving loop: the scheduler plans, the executor runs, results flow back with
// one-step overlap when the scheduler asks for it (plan k, then apply k−1, then run k).
#pragma once

#include "core/executor.h"
#include "core/scheduler.h"
#include "core/step_observer.h"

#include <cstdint>
#include <functional>

namespace ls {

struct ServingProgress {
  int64_t steps_count = 0;
  int64_t finished_count = 0;
  int64_t tokens_generated = 0;
};

struct ServingLoopOptions {
  StepObserver* observer = nullptr;
  std::function<void(const ServingProgress&)> on_step;  // e.g. a progress line
  int64_t idle_steps_max = 1000;  // consecutive IDLE plans with work left → ls::Error (stuck)
};

// Runs until every submitted request has finished. Returns the final progress.
ServingProgress run_serving_loop(Scheduler& scheduler, Executor& executor,
                                 const ServingLoopOptions& options = {});

// The pool rows of an op, in row order (what observers snapshot).
std::vector<int32_t> pool_rows_of(const ForwardOp& op);

}  // namespace ls
