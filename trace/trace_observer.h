// Connects a serving loop (or the simulator) to a Recorder: every step's input before it runs,
// its output after, and scheduler events and faults as event records.
#pragma once

#include "core/step_observer.h"
#include "trace/recorder.h"

#include <optional>
#include <string>

namespace ls::trace {

class TraceObserver : public StepObserver {
 public:
  explicit TraceObserver(Recorder& recorder) : recorder_(recorder) {}

  void on_step_input(int64_t step, const ForwardOp& op, const std::vector<CacheOp>& cache_ops,
                     const StepFaults& faults) override;
  void on_step_output(int64_t step, const ForwardOp& op, const StepResult& result,
                      const StateSnapshot& state) override;
  void on_scheduler_events(int64_t step, const std::vector<SchedulerEvent>& events) override;
  void on_step_stats(const StepStats& stats) override;
  void on_step_rejected(int64_t step, const std::string& message) override {
    recorder_.record_rejection(step, message);
  }
  void record_fault(int64_t step, RequestId request, const std::string& detail);

 private:
  Recorder& recorder_;
};

// The header of a trace recorded from this executor. Recording executors compute logits digests
// and the top-8 (id, logit) pairs inside each step (recording_executor_options), which replay
// compares.
// `machine`: what the backend knows of its device (GPU name, SM count, driver, CUDA and cuBLAS
// versions) when it runs on one; the CPU's name is filled in either way.
TraceHeader make_trace_header(const ModelWeights& weights, const WeightSource& source,
                              const ExecutorConfig& config, const std::string& backend,
                              const std::optional<MachineInfo>& machine = std::nullopt);
// The same with the weights' digest already computed, in the recorded form
// (kWeightsDigestFormRecorded: ModelWeights::digest() and digest_in_background() by default): a
// pass over every fp32 weight, which a caller may run beside the backend's start.
TraceHeader make_trace_header(const ModelWeights& weights, uint64_t weights_digest,
                              const WeightSource& source, const ExecutorConfig& config,
                              const std::string& backend,
                              const std::optional<MachineInfo>& machine = std::nullopt);
// `activations`: also every step's per-layer activations, whose digests the outputs then carry
// (TraceHeader::activation_digests, --record-activations).
ExecutorOptions recording_executor_options(bool activations = false);

// "lockstep 0.1.0 (git abc1234)", fixed at build time.
std::string build_id();
// "0.1.0", the project's version.
std::string version();

// TraceHeader::determinism_mode of a run on `backend`: kBatchInvariantMode for the CPU reference
// (always) and for CUDA in batch-invariant mode, "default" otherwise — the only modes whose
// traces `replay --isolate` may reproduce one request of are the batch-invariant ones.
inline constexpr const char* kBatchInvariantMode = "batch-invariant";
std::string determinism_mode_of(const std::string& backend, bool batch_invariant);

}  // namespace ls::trace
