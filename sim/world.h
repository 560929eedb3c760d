// One simulated serving world: the seed's workload arrives on a simulated clock (one tick per
// step), and the production serving loop (core/serving_loop.h) runs it — the scheduler plans
// forward ops, the executor runs them on the CPU reference (or a stubbed model, or a backend the
// caller builds: `lockstep sim --backend cuda`) — while the world, through the loop's hooks,
// delivers arrivals, fires faults at named sites (sim/faults.h) and runs checkers after every step
// and at the end. Single-threaded and fully determined by the parameters.
#pragma once

#include "core/executor.h"
#include "core/model/weights.h"
#include "core/scheduler.h"
#include "core/step_observer.h"
#include "sim/params.h"

#include <array>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace ls::sim {

// Sees every step of a run (e.g. to record a trace) and every fault that fires.
class SimObserver : public StepObserver {
 public:
  virtual void on_fault(int64_t step, FaultSite site, RequestId request, const std::string& detail) = 0;
};

struct CheckFailure {
  int64_t step = -1;  // -1: an end-of-run check
  std::string checker;
  std::string detail;
};

struct SimSummary {
  SimParams params;
  int64_t steps_count = 0;
  int64_t requests_finished = 0;  // by length, stop or context
  int64_t requests_aborted = 0;   // by the client
  int64_t requests_numerical_errors = 0;  // NaN or out-of-vocab rows: aborted by the guard
  int64_t tokens_generated = 0;  // emitted into the requests' outputs
  int64_t prefix_hit_tokens = 0;
  int64_t retractions_swap = 0;
  int64_t retractions_recompute = 0;
  int64_t recoveries = 0;
  std::array<int64_t, kFaultSitesCount> faults_fired{};
  // Decode rows by accepted length a' (0..W) when W > 1: how far speculation got.
  std::array<int64_t, 17> decode_rows_by_accepted{};
  std::vector<CheckFailure> failures;
  uint64_t fingerprint = 0;

  bool passed() const { return failures.empty(); }
};

struct WorldOptions {
  bool stub_model = false;     // skip the model arithmetic (control-plane benchmarks)
  SimObserver* observer = nullptr;
  int64_t max_steps = 20000;   // a run past this is a liveness failure
  ExecutorOptions executor_options;  // recording captures logits for their digests
  // The backend the world runs on, built over the world's weights and limits; null: the CPU
  // reference with the seed's drafter at the params' TP degree (and the stub model when
  // stub_model). sim/ links no other
  // backend: the CLI passes CUDA's, which refuses (ls::Error) what it cannot run.
  std::function<std::unique_ptr<Backend>(const SimParams&, const ModelWeights&,
                                         const ExecutorConfig&)>
      make_backend;
};

// The executor limits a world runs with (also what a recorded trace's header carries) and its
// scheduler's configuration: the parts of SimParams that are those.
inline SchedulerConfig scheduler_config_for(const SimParams& params) { return params; }
inline ExecutorConfig executor_config_for(const SimParams& params) {
  return ls::executor_config_for(params);
}

SimSummary run_world(const SimParams& params, const ModelWeights& weights,
                     const WorldOptions& options = {});

}  // namespace ls::sim
