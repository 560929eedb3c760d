#include "core/serving_loop.h"

#include "core/check.h"

#include <optional>
#include <utility>

namespace ls {

std::vector<int32_t> pool_rows_of(const ForwardOp& op) {
  std::vector<int32_t> rows;
  rows.reserve(op.rows.size());
  for (const OpRow& row : op.rows) rows.push_back(row.pool_row);
  return rows;
}

StepStats plan_stats(int64_t step, const std::vector<SchedulerEvent>& plan_events, const Scheduler& scheduler) {
  StepStats s{.step = step};
  s.pages_free = scheduler.free_pages_count();
  s.pages_used = scheduler.held_pages_count() + scheduler.cached_pages_count();
  s.running_count = scheduler.config().max_batch_rows - scheduler.free_pool_rows_count();
  s.queue_length = std::max(0, scheduler.live_requests_count() - s.running_count);
  for (const SchedulerEvent& e : plan_events) {
    if (e.kind == SchedulerEvent::Kind::kPrefixHit) s.prefix_hit_tokens += e.tokens;
  }
  return s;
}

void time_stats(StepStats& s, int64_t submit_ns, int64_t done_ns, const DeviceStepTime& device) {
  s.submit_ns = submit_ns;
  s.done_ns = done_ns;
  // A backend that measures nothing computed the step on this thread: the clock is its timer and
  // the whole step was a wait for the result.
  s.device_busy_ns = device.busy_ns >= 0 ? device.busy_ns : done_ns - submit_ns;
  s.wait_ns = device.wait_ns >= 0 ? device.wait_ns : done_ns - submit_ns;
  s.device_idle_before_ns = device.idle_before_ns;
}

namespace {

// A step run and not yet applied to the scheduler.
struct InFlight {
  ForwardOp op;
  StepResult result;
  int64_t step = 0;
};

// A step submitted to the executor and not yet collected (run-ahead order).
struct Submitted {
  ForwardOp op;
  int64_t step = 0;
  StepStats stats;  // as planned, with its submit time (when the loop has a clock)
};

class ServingLoop {
 public:
  ServingLoop(Scheduler& scheduler, Executor& executor, const ServingLoopOptions& options)
      : scheduler_(scheduler),
        executor_(executor),
        options_(options),
        hooks_(options.hooks),
        emitted_before_(scheduler.tokens_emitted_count()) {}

  ServingProgress run() {
    LS_REQUIRE(executor_.in_flight_count() == 0,
               "serving loop: the executor has {} steps in flight", executor_.in_flight_count());
    if (runs_ahead()) return run_ahead();
    int64_t idle = 0;
    while (!finished()) {
      if (hooks_ && !hooks_->before_plan()) break;
      StepPlanOut plan = scheduler_.plan();
      notify_events(plan.events);
      if (in_flight_) apply_in_flight();
      if (plan.op.rows.empty() && plan.cache_ops.empty()) {
        count_idle(idle);
        if (hooks_) hooks_->on_idle();
        continue;
      }
      idle = 0;
      run_step(std::move(plan));
    }
    if (in_flight_) apply_in_flight();  // the hooks stopped the loop with a step held back
    return progress_;
  }

 private:
  bool finished() const {
    return scheduler_.done() && !(hooks_ && hooks_->requests_to_come());
  }

  // Run ahead only when nothing reads live device state: an observer needs each step's state
  // after it, which a recording executor snapshots inside the step (StepResult::state); without
  // that, reading it with the next step in flight would show that step's effects too. Hooks
  // read and change state between steps. Without the scheduler's overlap there is no next step
  // to submit early.
  bool runs_ahead() const {
    return options_.run_ahead && hooks_ == nullptr && scheduler_.config().overlap &&
           executor_.runs_ahead() && (options_.observer == nullptr || executor_.options().record);
  }

  // Plan k, submit k, then collect and apply k − 1: the device runs step k while the host
  // unpacks k − 1, applies it and plans k + 1. The scheduler sees the same order as with
  // overlap (plan k before apply k − 1), so the ops, and so the tokens, are the same.
  ServingProgress run_ahead() {
    int64_t idle = 0;
    StepStats stats;
    while (!scheduler_.done()) {
      StepPlanOut plan = scheduler_.plan();
      notify_events(plan.events);
      if (plan.op.rows.empty() && plan.cache_ops.empty()) {
        collect_submitted();
        count_idle(idle);
        continue;
      }
      idle = 0;
      try {
        for (const CacheOp& c : plan.cache_ops) executor_.copy_pages(c);
        if (options_.observer) {
          options_.observer->on_step_input(step_, plan.op, plan.cache_ops,
                                           executor_.pending_faults());
        }
        stats = timed() ? plan_stats(step_, plan.events, scheduler_) : StepStats{};
        stats.submit_ns = timed() ? options_.clock->now_ns() : 0;
        executor_.submit(plan.op);
      } catch (const Error& e) {
        collect_submitted();  // as one step at a time: step k − 1 applied, step k rejected
        if (options_.observer) options_.observer->on_step_rejected(step_, e.what());
        throw;
      }
      collect_submitted();
      submitted_ = Submitted{std::move(plan.op), step_++, stats};
    }
    collect_submitted();
    return progress_;
  }

  void collect_submitted() {
    if (!submitted_) return;
    executor_.collect(result_);
    Submitted s = std::exchange(submitted_, std::nullopt).value();
    if (options_.observer) options_.observer->on_step_output(s.step, s.op, result_, result_.state);
    if (timed()) {
      time_stats(s.stats, s.stats.submit_ns, options_.clock->now_ns(), executor_.backend().last_device_time());
      options_.observer->on_step_stats(s.stats);
    }
    apply(s.op, result_, s.step);
  }

  // Step stats go to the observer when the loop has a clock.
  bool timed() const { return options_.observer != nullptr && options_.clock != nullptr; }

  void count_idle(int64_t& idle) const {
    LS_REQUIRE(++idle <= options_.idle_steps_max || scheduler_.done(),
               "serving loop: {} idle plans in a row with requests unfinished", idle);
  }

  void run_step(StepPlanOut plan) {
    for (const CacheOp& c : plan.cache_ops) executor_.copy_pages(c);
    if (hooks_) hooks_->before_step(plan);
    if (options_.observer) {
      options_.observer->on_step_input(step_, plan.op, plan.cache_ops, executor_.pending_faults());
    }
    StepResult& result = result_;  // the applied step's buffers, reused
    StepStats stats = timed() ? plan_stats(step_, plan.events, scheduler_) : StepStats{};
    const int64_t submit_ns = timed() ? options_.clock->now_ns() : 0;
    try {
      executor_.step(plan.op, result);
    } catch (const Error& e) {
      if (options_.observer) options_.observer->on_step_rejected(step_, e.what());
      throw;
    }
    if (timed()) time_stats(stats, submit_ns, options_.clock->now_ns(), executor_.backend().last_device_time());
    if (options_.observer && executor_.options().record) {
      options_.observer->on_step_output(step_, plan.op, result, result.state);
    } else if (options_.observer) {
      options_.observer->on_step_output(step_, plan.op, result,
                                        executor_.backend().read_state(pool_rows_of(plan.op)));
    }
    if (timed()) options_.observer->on_step_stats(stats);
    if (scheduler_.config().overlap) {
      in_flight_ = InFlight{std::move(plan.op), std::move(result), step_++};
      if (hooks_) hooks_->after_step(in_flight_->op);
    } else {
      apply(plan.op, result, step_++);
      if (hooks_) hooks_->after_step(plan.op);
    }
  }

  // Applies the step held back by the overlap, and takes its result's buffers back for the next.
  void apply_in_flight() {
    InFlight f = std::exchange(in_flight_, std::nullopt).value();
    apply(f.op, f.result, f.step);
    result_ = std::move(f.result);
  }

  void apply(const ForwardOp& op, const StepResult& result, int64_t step) {
    const std::vector<SchedulerEvent> events = scheduler_.apply_result(op, result);
    progress_.tokens_generated = scheduler_.tokens_emitted_count() - emitted_before_;
    notify_events(events);
    progress_.steps_count = step + 1;
    if (options_.on_step) options_.on_step(progress_);
  }

  void notify_events(const std::vector<SchedulerEvent>& events) {
    for (const SchedulerEvent& e : events) {
      if (e.kind == SchedulerEvent::Kind::kFinish || e.kind == SchedulerEvent::Kind::kAbort) {
        ++progress_.finished_count;
      }
    }
    if (options_.observer && !events.empty()) options_.observer->on_scheduler_events(step_, events);
  }

  Scheduler& scheduler_;
  Executor& executor_;
  const ServingLoopOptions& options_;
  ServingHooks* const hooks_;
  const int64_t emitted_before_;  // the scheduler's tokens emitted before this loop
  std::optional<InFlight> in_flight_;
  std::optional<Submitted> submitted_;
  StepResult result_;  // reused by every collect and step
  ServingProgress progress_;
  int64_t step_ = 0;
};

}  // namespace

ServingProgress run_serving_loop(Scheduler& scheduler, Executor& executor,
                                 const ServingLoopOptions& options) {
  ServingLoop loop(scheduler, executor, options);
  return loop.run();
}

}  // namespace ls
