// Records a simulated run to a trace: steps and scheduler events through trace::TraceObserver,
// and every fault that fires as a faultFired event naming its site.
#pragma once

#include "sim/world.h"
#include "trace/trace_observer.h"

namespace ls::sim {

class SimTraceObserver final : public SimObserver {
 public:
  explicit SimTraceObserver(trace::Recorder& recorder) : trace_(recorder) {}

  void on_step_input(int64_t step, const ForwardOp& op, const std::vector<CacheOp>& cache_ops,
                     const StepFaults& faults) override {
    trace_.on_step_input(step, op, cache_ops, faults);
  }
  void on_step_output(int64_t step, const ForwardOp& op, const StepResult& result,
                      const StateSnapshot& state) override {
    trace_.on_step_output(step, op, result, state);
  }
  void on_scheduler_events(int64_t step, const std::vector<SchedulerEvent>& events) override {
    trace_.on_scheduler_events(step, events);
  }
  void on_step_stats(const StepStats& stats) override { trace_.on_step_stats(stats); }
  void on_step_rejected(int64_t step, const std::string& message) override {
    trace_.on_step_rejected(step, message);
  }
  void on_fault(int64_t step, FaultSite site, RequestId request, const std::string& detail) override {
    trace_.record_fault(step, request, std::string(to_string(site)) + ": " + detail);
  }

 private:
  trace::TraceObserver trace_;
};

}  // namespace ls::sim
