#include "sim/world.h"

#include "core/check.h"
#include "core/cpu_backend.h"
#include "core/serving_loop.h"
#include "sim/checkers.h"
#include "sim/oracle_drafter.h"
#include "sim/random.h"
#include "sim/workload.h"

#define XXH_STATIC_LINKING_ONLY  // XXH3_state_t on the stack
#include <xxhash.h>

#include <algorithm>
#include <memory>
#include <optional>
#include <set>

namespace ls::sim {

namespace {

constexpr uint32_t kFaultStream = 3;

// The simulated clock (step stats in a recorded trace): a step costs a fixed part and a part per
// token it computes, planning a fixed part, an idle tick its own; made-up magnitudes of a small
// GPU model, fixed so that a seed's times are a function of the seed alone.
constexpr int64_t kHostPlanNs = 20'000;
constexpr int64_t kStepBaseNs = 400'000;
constexpr int64_t kStepTokenNs = 2'000;
constexpr int64_t kIdleTickNs = 1'000'000;

int64_t step_cost_ns(const ForwardOp& op) {
  int64_t tokens = 0;
  for (const OpRow& row : op.rows) tokens += row.input_length;
  return kStepBaseNs + kStepTokenNs * tokens;
}

std::unique_ptr<Backend> make_world_backend(const SimParams& p, const ModelWeights& weights,
                                            const WorldOptions& options,
                                            const ExecutorConfig& config) {
  if (options.make_backend) return options.make_backend(p, weights, config);
  return std::make_unique<CpuBackend>(weights, config, nullptr, options.stub_model,
                                      make_sim_drafter(p, weights, options.stub_model),
                                      p.tp_degree);
}

struct InFlight {
  ForwardOp op;
  StepResult result;
};

class World {
 public:
  World(const SimParams& p, const ModelWeights& weights, const WorldOptions& options)
      : params_(p),
        options_(options),
        config_(executor_config_for(p)),
        backend_(make_world_backend(p, weights, options, config_)),
        executor_(config_, weights.config.vocab_size, *backend_, options.executor_options),
        scheduler_(scheduler_config_for(p)),
        workload_(generate_workload(p, weights.config.vocab_size)),
        faults_(p.seed, kFaultStream) {
    summary_.params = p;
    XXH3_64bits_reset(&hash_);
    int64_t work = 0;
    for (const SimRequest& q : workload_) {
      work += static_cast<int64_t>(q.spec.prompt.size()) + q.spec.max_new_tokens;
    }
    // Stated bound: every step makes progress on at least one token of some request, so no
    // request can take longer than all the work that exists plus slack for retraction churn.
    starvation_bound_ = 64 + 2 * work;
  }

  SimSummary run() {
    while (!finished()) {
      if (step_ > options_.max_steps) {
        fail("liveness", fmt::format("the run did not finish within {} steps", options_.max_steps));
        break;
      }
      run_one_step();
      if (!summary_.failures.empty()) break;
    }
    if (in_flight_) apply(*in_flight_), in_flight_.reset();
    if (summary_.failures.empty()) end_checks();
    summary_.steps_count = step_;
    summary_.fingerprint = XXH3_64bits_digest(&hash_);
    return summary_;
  }

 private:
  bool finished() const {
    return next_arrival_ == workload_.size() && !in_flight_ && scheduler_.done();
  }

  void run_one_step() {
    const int64_t step_before = step_;
    deliver_arrivals();
    // An idle stretch the clock jumped over (nothing live: straight to the next arrival).
    clock_.advance_ns((step_ - step_before) * kIdleTickNs + kHostPlanNs);
    client_aborts();
    if (enabled(FaultSite::kAbortMidPrefill) && faults_.chance(params_.fault_rate)) abort_mid_prefill();
    StepPlanOut plan = scheduler_.plan();
    observe_events(plan.events);
    if (in_flight_) apply(*in_flight_), in_flight_.reset();
    if (plan.op.rows.empty() && plan.cache_ops.empty()) {
      ++step_;  // an idle tick of the simulated clock: nothing runs
      clock_.advance_ns(kIdleTickNs);
      return;
    }
    for (const CacheOp& c : plan.cache_ops) executor_.copy_pages(c);
    plant_row_faults(plan.op);
    execute(plan);
    if (enabled(FaultSite::kLateResult) && params_.overlap && faults_.chance(params_.fault_rate)) {
      abort_in_flight(plan.op);
    }
    check_pages(step_, scheduler_, submitted_, summary_.failures);
    ++step_;
  }

  void execute(const StepPlanOut& plan) {
    const std::vector<int32_t> rows = pool_rows_of(plan.op);
    const StateSnapshot before = backend_->read_state(rows);
    if (options_.observer) {
      options_.observer->on_step_input(step_, plan.op, plan.cache_ops, executor_.pending_faults());
    }
    const int64_t submit_ns = clock_.now_ns();
    StepResult result = executor_.step(plan.op);
    clock_.advance_ns(step_cost_ns(plan.op));
    const int64_t done_ns = clock_.now_ns();
    const StateSnapshot after = backend_->read_state(rows);
    const InputSnapshot inputs = backend_->read_inputs();
    const StepObservation o{step_, &plan.op, &result, &before, &after, &inputs,
                            executor_.vocab_size(), &config_};
    check_step(o, scheduler_, summary_.failures);
    if (config_.verify_width > 1) count_accepted(plan.op, result);
    if (options_.observer) {
      options_.observer->on_step_output(step_, plan.op, result, after);
      // The simulated device is the clock: no device time of its own, no wait but the step.
      StepStats stats = plan_stats(step_, plan.events, scheduler_);
      time_stats(stats, submit_ns, done_ns, {});
      options_.observer->on_step_stats(stats);
    }
    fingerprint(plan.op, result);
    InFlight done{plan.op, std::move(result)};
    if (params_.overlap) {
      in_flight_ = std::move(done);
    } else {
      apply(done);
    }
  }

  void count_accepted(const ForwardOp& op, const StepResult& result) {
    for (int32_t row = op.prefill_rows_count(); row < op.rows_count(); ++row) {
      const int32_t a = result.accepted_lengths[row];
      if (a >= 0 && a < static_cast<int32_t>(summary_.decode_rows_by_accepted.size())) {
        ++summary_.decode_rows_by_accepted[static_cast<size_t>(a)];
      }
    }
  }

  void apply(const InFlight& f) {
    for (int32_t row = 0; row < f.op.rows_count(); ++row) {
      summary_.tokens_generated += f.result.accepted_lengths[row];
    }
    observe_events(scheduler_.apply_result(f.op, f.result));
  }

  void deliver_arrivals() {
    while (next_arrival_ < workload_.size() && workload_[next_arrival_].arrival_step <= step_) {
      const SimRequest& q = workload_[next_arrival_++];
      scheduler_.submit(q.spec, executor_.vocab_size());
      submitted_.push_back(q.spec.id);
      live_.insert(q.spec.id);
      arrival_step_[q.spec.id] = step_;
      if (q.abort_step >= 0) client_abort_at_[q.spec.id] = q.abort_step;
    }
    // Nothing live and nothing in flight: jump the clock to the next arrival.
    if (live_.empty() && !in_flight_ && next_arrival_ < workload_.size()) {
      step_ = std::max(step_, workload_[next_arrival_].arrival_step);
      if (workload_[next_arrival_].arrival_step <= step_) deliver_arrivals();
    }
  }

  void client_aborts() {
    for (auto it = client_abort_at_.begin(); it != client_abort_at_.end();) {
      if (it->second <= step_ && live_.count(it->first)) {
        request_abort(it->first);
        it = client_abort_at_.erase(it);
      } else {
        ++it;
      }
    }
  }

  void abort_mid_prefill() {
    for (RequestId id : live_) {
      if (scheduler_.state_of(id) == RequestState::kPrefilling && !abort_requested_.count(id)) {
        request_abort(id);
        fired(FaultSite::kAbortMidPrefill, id, "client abort while prefilling");
        return;
      }
    }
  }

  // A client abort of a request whose step is in flight: its result arrives late and must be
  // ignored by the scheduler.
  void abort_in_flight(const ForwardOp& op) {
    for (const OpRow& row : op.rows) {
      if (live_.count(row.request_id) && !abort_requested_.count(row.request_id) &&
          scheduler_.state_of(row.request_id) == RequestState::kDecoding) {
        request_abort(row.request_id);
        fired(FaultSite::kLateResult, row.request_id, "abort with a step in flight");
        return;
      }
    }
  }

  void request_abort(RequestId id) {
    if (!abort_requested_.insert(id).second) return;
    scheduler_.abort(id);
  }

  void plant_row_faults(const ForwardOp& op) {
    if (op.rows.empty()) return;
    if (enabled(FaultSite::kNanLogits) && faults_.chance(params_.fault_rate)) {
      const int32_t row = static_cast<int32_t>(faults_.range(0, op.rows_count() - 1));
      executor_.poison_next_step({row});
      fired(FaultSite::kNanLogits, op.rows[row].request_id, fmt::format("NaN logits in op row {}", row));
    }
    if (enabled(FaultSite::kOovSample) && faults_.chance(params_.fault_rate)) {
      const int32_t row = static_cast<int32_t>(faults_.range(0, op.rows_count() - 1));
      const int32_t id = executor_.vocab_size() + static_cast<int32_t>(faults_.range(0, 99));
      executor_.force_next_output(row, id);
      fired(FaultSite::kOovSample, op.rows[row].request_id, fmt::format("id {} in op row {}", id, row));
    }
  }

  void observe_events(const std::vector<SchedulerEvent>& events) {
    if (events.empty()) return;
    if (options_.observer) options_.observer->on_scheduler_events(step_, events);
    for (const SchedulerEvent& e : events) {
      XXH3_64bits_update(&hash_, &e.kind, sizeof(e.kind));
      XXH3_64bits_update(&hash_, &e.request_id, sizeof(e.request_id));
      switch (e.kind) {
        case SchedulerEvent::Kind::kFinish:
        case SchedulerEvent::Kind::kAbort:
          ended(e);
          break;
        case SchedulerEvent::Kind::kRetract:
          ++(e.retract_path == RetractPath::kSwap ? summary_.retractions_swap
                                                  : summary_.retractions_recompute);
          break;
        case SchedulerEvent::Kind::kRecover: ++summary_.recoveries; break;
        case SchedulerEvent::Kind::kPrefixHit: summary_.prefix_hit_tokens += e.tokens; break;
        case SchedulerEvent::Kind::kArrive: break;
      }
    }
  }

  void ended(const SchedulerEvent& e) {
    if (!live_.erase(e.request_id)) return;
    finish_step_[e.request_id] = step_;
    if (e.finish_reason == FinishReason::kNumericalError) {
      ++summary_.requests_numerical_errors;
    } else if (e.kind == SchedulerEvent::Kind::kAbort || e.finish_reason == FinishReason::kAbort) {
      ++summary_.requests_aborted;
    } else {
      ++summary_.requests_finished;
    }
  }

  void fingerprint(const ForwardOp& op, const StepResult& r) {
    XXH3_64bits_update(&hash_, &step_, sizeof(step_));
    for (const OpRow& row : op.rows) {
      XXH3_64bits_update(&hash_, &row.request_id, sizeof(row.request_id));
      XXH3_64bits_update(&hash_, &row.pool_row, sizeof(row.pool_row));
      XXH3_64bits_update(&hash_, &row.input_length, sizeof(row.input_length));
    }
    XXH3_64bits_update(&hash_, r.tokens.data(), r.tokens.size() * sizeof(int32_t));
    XXH3_64bits_update(&hash_, r.accepted_lengths.data(), r.accepted_lengths.size() * sizeof(int32_t));
    XXH3_64bits_update(&hash_, r.nan_flags.data(), r.nan_flags.size());
    XXH3_64bits_update(&hash_, r.oov_flags.data(), r.oov_flags.size());
  }

  void end_checks() {
    const EndState end{&submitted_, &arrival_step_, &finish_step_, starvation_bound_};
    check_end(end, scheduler_, summary_.failures);
    for (const auto& [id, outcome] : scheduler_.outcomes()) {
      XXH3_64bits_update(&hash_, &id, sizeof(id));
      XXH3_64bits_update(&hash_, outcome.tokens.data(), outcome.tokens.size() * sizeof(int32_t));
      XXH3_64bits_update(&hash_, &outcome.reason, sizeof(outcome.reason));
    }
  }

  bool enabled(FaultSite site) const {
    return std::find(params_.faults.begin(), params_.faults.end(), site) != params_.faults.end();
  }

  void fired(FaultSite site, RequestId id, const std::string& detail) {
    ++summary_.faults_fired[static_cast<size_t>(site)];
    if (options_.observer) options_.observer->on_fault(step_, site, id, detail);
  }

  void fail(const char* checker, std::string detail) {
    summary_.failures.push_back({step_, checker, std::move(detail)});
  }


  SimParams params_;
  WorldOptions options_;
  ManualClock clock_;  // simulated time (step stats): advanced by the world, never by the host
  ExecutorConfig config_;
  std::unique_ptr<Backend> backend_;
  Executor executor_;
  Scheduler scheduler_;
  std::vector<SimRequest> workload_;
  SimRandom faults_;
  SimSummary summary_;
  XXH3_state_t hash_;

  int64_t step_ = 0;
  size_t next_arrival_ = 0;
  std::optional<InFlight> in_flight_;
  std::vector<RequestId> submitted_;
  std::set<RequestId> live_;
  std::map<RequestId, int64_t> arrival_step_;
  std::map<RequestId, int64_t> finish_step_;
  std::map<RequestId, int64_t> client_abort_at_;
  std::set<RequestId> abort_requested_;
  int64_t starvation_bound_ = 0;
};

}  // namespace

SimSummary run_world(const SimParams& params, const ModelWeights& weights,
                     const WorldOptions& options) {
  World world(params, weights, options);
  return world.run();
}

}  // namespace ls::sim
