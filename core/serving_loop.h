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
  int64_t tokens_generated = 0;  // emitted into the requests' outputs (Scheduler::tokens_emitted_count)
};

// What a driver adds around the loop's steps: the simulator's clock and arrivals, its planted
// faults, its checks and its stop at the first failure (sim/world.cpp). All calls happen on the
// loop's thread; with hooks the loop runs one step at a time, since they read and change the
// scheduler and the device between steps. Production passes none: one predictable branch per
// call site, no virtual call per step.
class ServingHooks {
 public:
  virtual ~ServingHooks() = default;
  // Whether requests are still to arrive: the loop goes on while the scheduler is done.
  virtual bool requests_to_come() const = 0;
  // Before each plan (may submit and abort requests). false: the loop stops there, the step
  // held back by the overlap applied first, with requests unfinished.
  virtual bool before_plan() = 0;
  // A plan with nothing to run.
  virtual void on_idle() = 0;
  // After the plan's cache ops ran, before its op reaches the observer and the executor:
  // faults planted on the executor here go into this step.
  virtual void before_step(const StepPlanOut& plan) = 0;
  // After the step ran and its result was applied, or held back by the overlap.
  virtual void after_step(const ForwardOp& op) = 0;
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
  ServingHooks* hooks = nullptr;  // null: none (then the loop may run ahead)
};

// Runs until every submitted request has finished and the hooks have no more to come, or the
// hooks stop it. Returns the final progress.
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
