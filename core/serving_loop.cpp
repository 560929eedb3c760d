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

namespace {

struct InFlight {
  ForwardOp op;
  StepResult result;
};

class ServingLoop {
 public:
  ServingLoop(Scheduler& scheduler, Executor& executor, const ServingLoopOptions& options)
      : scheduler_(scheduler), executor_(executor), options_(options) {}

  ServingProgress run() {
    int64_t idle = 0;
    while (!scheduler_.done()) {
      StepPlanOut plan = scheduler_.plan();
      notify_events(plan.events);
      if (in_flight_) apply(std::exchange(in_flight_, std::nullopt).value());
      if (plan.op.rows.empty() && plan.cache_ops.empty()) {
        LS_REQUIRE(++idle <= options_.idle_steps_max || scheduler_.done(),
                   "serving loop: {} idle plans in a row with requests unfinished", idle);
        continue;
      }
      idle = 0;
      run_step(plan);
    }
    return progress_;
  }

 private:
  void run_step(const StepPlanOut& plan) {
    for (const CacheOp& c : plan.cache_ops) executor_.copy_pages(c);
    if (options_.observer) {
      options_.observer->on_step_input(step_, plan.op, plan.cache_ops, executor_.pending_faults());
    }
    StepResult result;
    try {
      result = executor_.step(plan.op);
    } catch (const Error& e) {
      if (options_.observer) options_.observer->on_step_rejected(step_, e.what());
      throw;
    }
    if (options_.observer) {
      options_.observer->on_step_output(step_, plan.op, result,
                                        executor_.backend().read_state(pool_rows_of(plan.op)));
    }
    ++step_;
    InFlight done{plan.op, std::move(result)};
    if (scheduler_.config().overlap) {
      in_flight_ = std::move(done);
    } else {
      apply(done);
    }
  }

  void apply(const InFlight& f) {
    for (int32_t a : f.result.accepted_lengths) progress_.tokens_generated += a;
    const std::vector<SchedulerEvent> events = scheduler_.apply_result(f.op, f.result);
    notify_events(events);
    progress_.steps_count = step_;
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
  std::optional<InFlight> in_flight_;
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
