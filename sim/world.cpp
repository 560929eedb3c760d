#include "sim/world.h"

#include "core/check.h"
#include "core/cpu_backend.h"
#include "core/serving_loop.h"
#include "sim/checkers.h"
#include "sim/clients.h"
#include "sim/faults.h"
#include "sim/oracle_drafter.h"
#include "sim/workload.h"

#define XXH_STATIC_LINKING_ONLY  // XXH3_state_t on the stack
#include <xxhash.h>

#include <algorithm>
#include <limits>
#include <map>
#include <memory>

namespace ls::sim {

namespace {

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

// The world drives the production serving loop (core/serving_loop.h): as its hooks it delivers
// arrivals, ticks the simulated clock, plants faults and stops at the first failed check; as its
// observer it checks every step, hashes the fingerprint and passes the steps on to the caller's
// observer, numbered by the simulated clock (idle ticks and jumps to the next arrival count).
class World final : private ServingHooks, private StepObserver {
 public:
  World(const SimParams& p, const ModelWeights& weights, const WorldOptions& options)
      : params_(p),
        options_(options),
        config_(executor_config_for(p)),
        backend_(make_world_backend(p, weights, options, config_)),
        executor_(config_, weights.config.vocab_size, *backend_, options.executor_options),
        scheduler_(scheduler_config_for(p)),
        workload_(generate_workload(p, weights.config.vocab_size)),
        clients_(scheduler_),
        faults_(params_, executor_, scheduler_, clients_,
                [this](FaultSite site, RequestId id, const std::string& detail) {
                  fired(site, id, detail);
                }) {
    summary_.params = p;
    if (backend_->has_recurrent_state()) {
      for (int32_t slot = 0; slot < config_.mamba_slots_count; ++slot) all_mamba_slots_.push_back(slot);
    }
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
    // With hooks the loop runs one step at a time: the checkers read the state before each step.
    const ServingLoopOptions loop{.observer = this,
                                  // The world's own bound: options_.max_steps, idle ticks included.
                                  .idle_steps_max = std::numeric_limits<int64_t>::max(),
                                  .hooks = this};
    summary_.tokens_generated = run_serving_loop(scheduler_, executor_, loop).tokens_generated;
    if (summary_.failures.empty()) end_checks();
    summary_.steps_count = step_;
    summary_.fingerprint = XXH3_64bits_digest(&hash_);
    return summary_;
  }

 private:
  // ServingHooks.
  bool requests_to_come() const override { return next_arrival_ < workload_.size(); }

  bool before_plan() override {
    if (!summary_.failures.empty()) return false;  // stop at the first failure
    if (step_ > options_.max_steps) {
      fail("liveness", fmt::format("the run did not finish within {} steps", options_.max_steps));
      return false;
    }
    const int64_t step_before = step_;
    deliver_arrivals();
    // An idle stretch the clock jumped over (nothing live: straight to the next arrival).
    clock_.advance_ns((step_ - step_before) * kIdleTickNs + kHostPlanNs);
    client_aborts();
    faults_.before_plan();
    return true;
  }

  void on_idle() override {
    ++step_;  // an idle tick of the simulated clock: nothing runs
    clock_.advance_ns(kIdleTickNs);
  }

  void before_step(const StepPlanOut& plan) override {
    faults_.before_step(plan.op);
    before_ = backend_->read_state(pool_rows_of(plan.op));
    mamba_before_ = backend_->read_mamba_digests(all_mamba_slots_);
    // The scheduler stands as planned until the step is applied.
    if (options_.observer) planned_ = plan_stats(step_, plan.events, scheduler_);
  }

  void after_step(const ForwardOp& op) override {
    faults_.after_step(op);
    check_pages(step_, scheduler_, submitted_, summary_.failures);
    ++step_;
  }

  // StepObserver: the loop's step numbers are ignored; the simulated clock's stand instead.
  void on_step_input(int64_t /*step*/, const ForwardOp& op, const std::vector<CacheOp>& cache_ops,
                     const StepFaults& faults) override {
    if (options_.observer) options_.observer->on_step_input(step_, op, cache_ops, faults);
    faults_planted_ = faults;  // the executor takes them with the step
  }

  void on_step_output(int64_t /*step*/, const ForwardOp& op, const StepResult& result,
                      const StateSnapshot& after) override {
    const int64_t submit_ns = clock_.now_ns();
    clock_.advance_ns(step_cost_ns(op));
    const InputSnapshot inputs = backend_->read_inputs();
    const StepObservation o{step_,  &op,    &result, &before_, &after, &inputs, executor_.vocab_size(),
                            &config_, &faults_planted_};
    check_step(o, scheduler_, summary_.failures);
    if (!all_mamba_slots_.empty() && !op.rows.empty()) {
      mamba_after_ = backend_->read_mamba_digests(all_mamba_slots_);
      StepObservation mamba = o;
      mamba.plan = &executor_.last_plan();
      mamba.mamba_before = &mamba_before_;
      mamba.mamba_after = &mamba_after_;
      check_mamba_step(mamba, scheduler_, mamba_owners_, summary_.failures);
    }
    if (config_.verify_width > 1) count_accepted(op, result);
    if (options_.observer) {
      options_.observer->on_step_output(step_, op, result, after);
      // The simulated device is the clock: no device time of its own, no wait but the step.
      time_stats(planned_, submit_ns, clock_.now_ns(), {});
      options_.observer->on_step_stats(planned_);
    }
    fingerprint(op, result);
  }

  void on_scheduler_events(int64_t /*step*/, const std::vector<SchedulerEvent>& events) override {
    observe_events(events);
  }

  void on_step_rejected(int64_t /*step*/, const std::string& message) override {
    if (options_.observer) options_.observer->on_step_rejected(step_, message);
  }

  void count_accepted(const ForwardOp& op, const StepResult& result) {
    for (int32_t row = op.prefill_rows_count(); row < op.rows_count(); ++row) {
      const int32_t a = result.accepted_lengths[row];
      if (a >= 0 && a < static_cast<int32_t>(summary_.decode_rows_by_accepted.size())) {
        ++summary_.decode_rows_by_accepted[static_cast<size_t>(a)];
      }
    }
  }

  void deliver_arrivals() {
    while (next_arrival_ < workload_.size() && workload_[next_arrival_].arrival_step <= step_) {
      const SimRequest& q = workload_[next_arrival_++];
      scheduler_.submit(q.spec, executor_.vocab_size());
      submitted_.push_back(q.spec.id);
      clients_.arrived(q.spec.id);
      arrival_step_[q.spec.id] = step_;
      if (q.abort_step >= 0) client_abort_at_[q.spec.id] = q.abort_step;
    }
    // Nothing live and nothing in flight: jump the clock to the next arrival.
    if (clients_.live().empty() && scheduler_.steps_in_flight_count() == 0 &&
        next_arrival_ < workload_.size()) {
      step_ = std::max(step_, workload_[next_arrival_].arrival_step);
      if (workload_[next_arrival_].arrival_step <= step_) deliver_arrivals();
    }
  }

  void client_aborts() {
    for (auto it = client_abort_at_.begin(); it != client_abort_at_.end();) {
      if (it->second <= step_ && clients_.is_live(it->first)) {
        clients_.abort(it->first);
        it = client_abort_at_.erase(it);
      } else {
        ++it;
      }
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
    if (!clients_.ended(e.request_id)) return;
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
    // A hybrid's recurrent state after the step (empty, hashing nothing, without Mamba layers).
    XXH3_64bits_update(&hash_, mamba_after_.data(), mamba_after_.size() * sizeof(uint64_t));
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
  Clients clients_;
  FaultInjector faults_;
  SimSummary summary_;
  XXH3_state_t hash_;

  int64_t step_ = 0;  // the simulated clock's tick
  size_t next_arrival_ = 0;
  std::vector<RequestId> submitted_;
  std::map<RequestId, int64_t> arrival_step_;
  std::map<RequestId, int64_t> finish_step_;
  std::map<RequestId, int64_t> client_abort_at_;
  int64_t starvation_bound_ = 0;
  // The step under way: its rows' state before it, its faults, its stats as planned.
  StateSnapshot before_;
  StepFaults faults_planted_;
  // A model with recurrent state: every slot (the mamba checkers read all), their digests before
  // the step under way, and who holds each working slot.
  std::vector<int32_t> all_mamba_slots_;
  std::vector<uint64_t> mamba_before_;
  std::vector<uint64_t> mamba_after_;  // the last step's: in the fingerprint
  MambaSlotOwners mamba_owners_;
  StepStats planned_;
};

}  // namespace

SimSummary run_world(const SimParams& params, const ModelWeights& weights,
                     const WorldOptions& options) {
  World world(params, weights, options);
  return world.run();
}

}  // namespace ls::sim
