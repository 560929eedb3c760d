// The production driving loop: the scheduler plans, the executor runs, results flow back with
// one-step overlap when the scheduler asks for it (plan k, then apply k−1, then run k), and with
// the device running ahead of the host where the backend can (plan k, submit k, then collect and
// apply k−1: see ServingLoopOptions::run_ahead).
#pragma once

#include "core/clock.h"
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
  // Sees every step, with the state of the step's rows after it: the step's own snapshot when
  // the executor records (ExecutorOptions::record; the loop still runs ahead), else read from the
  // backend after the step (then the loop runs one step at a time, so the state is exact).
  StepObserver* observer = nullptr;
  // With an observer: the clock its step stats are read from (StepObserver::on_step_stats);
  // null, no stats.
  const Clock* clock = nullptr;
  // With the scheduler's overlap on, a backend that can run ahead and no observer that reads
  // device state (see `observer`): plan k,
  // submit k, collect and apply k − 1, so the device never waits for the host's planning.
  // Off, or when any of those is missing: plan k, apply k − 1, run k to completion.
  bool run_ahead = true;
  std::function<void(const ServingProgress&)> on_step;  // e.g. a progress line
  int64_t idle_steps_max = 1000;  // consecutive IDLE plans with work left → ls::Error (stuck)
};

// Runs until every submitted request has finished. Returns the final progress.
ServingProgress run_serving_loop(Scheduler& scheduler, Executor& executor,
                                 const ServingLoopOptions& options = {});

// A step's stats as the scheduler stands after planning it (`plan_events`: that plan's events,
// for its prefix hits); the times are filled in by time_stats once it has run.
StepStats plan_stats(int64_t step, const std::vector<SchedulerEvent>& plan_events, const Scheduler& scheduler);
// The times of a step that ran from submit_ns to done_ns on the loop's clock; `device` is the
// backend's own measure (-1 fields: none, the clock stands in).
void time_stats(StepStats& stats, int64_t submit_ns, int64_t done_ns, const DeviceStepTime& device);

// The pool rows of an op, in row order (what observers snapshot).
std::vector<int32_t> pool_rows_of(const ForwardOp& op);

}  // namespace ls
