#include "trace/trace_observer.h"

#include "lockstep_commit.h"  // generated at build time: LOCKSTEP_BUILD_ID, LOCKSTEP_VERSION

#include <fmt/format.h>

#include <fstream>
#include <optional>

namespace ls::trace {

namespace {

// The trace event of a scheduler event; prefix hits are not recorded (their pages are scheduler
// state a replay does not need).
std::optional<TraceEvent> event_of(int64_t step, const SchedulerEvent& e) {
  TraceEvent t{.request_id = e.request_id, .step = step};
  switch (e.kind) {
    case SchedulerEvent::Kind::kArrive: t.kind = EventKind::kArrive; break;
    case SchedulerEvent::Kind::kFinish:
      t.kind = EventKind::kFinish;
      t.detail = std::string(to_string(e.finish_reason));
      break;
    case SchedulerEvent::Kind::kAbort:
      t.kind = EventKind::kAbort;
      t.detail = std::string(to_string(e.finish_reason));
      break;
    case SchedulerEvent::Kind::kRetract:
      t.kind = EventKind::kRetract;
      t.detail = e.retract_path == RetractPath::kSwap ? "swap" : "recompute";
      break;
    case SchedulerEvent::Kind::kRecover:
      t.kind = EventKind::kRecover;
      t.detail = e.retract_path == RetractPath::kSwap ? "swap" : "recompute";
      if (e.hist_token_length >= 0) t.hist_token_length = e.hist_token_length;
      break;
    case SchedulerEvent::Kind::kPrefixHit:
      return std::nullopt;
  }
  return t;
}

std::string cpu_name() {
  std::ifstream in("/proc/cpuinfo");
  for (std::string line; std::getline(in, line);) {
    if (line.rfind("model name", 0) == 0) {
      const size_t colon = line.find(':');
      if (colon != std::string::npos) return line.substr(colon + 2);
    }
  }
  return "unknown cpu";
}

}  // namespace

void TraceObserver::on_step_input(int64_t step, const ForwardOp& op,
                                  const std::vector<CacheOp>& cache_ops, const StepFaults& faults) {
  recorder_.record_input(step, op, cache_ops, faults);
}

void TraceObserver::on_step_output(int64_t step, const ForwardOp&, const StepResult& result,
                                   const StateSnapshot& state) {
  recorder_.record_output(step, result, state);
}

void TraceObserver::on_scheduler_events(int64_t step, const std::vector<SchedulerEvent>& events) {
  for (const SchedulerEvent& e : events) {
    if (std::optional<TraceEvent> t = event_of(step, e)) recorder_.record_event(std::move(*t));
  }
}

// Stats are recorded into a trace whose header names their clocks (generate and sim set them);
// one opened without (an embedding's own header) records its steps as before.
void TraceObserver::on_step_stats(const StepStats& stats) {
  if (!recorder_.header().step_clock.empty()) recorder_.record_stats(stats);
}

void TraceObserver::record_fault(int64_t step, RequestId request, const std::string& detail) {
  recorder_.record_event(
      TraceEvent{.kind = EventKind::kFaultFired, .request_id = request, .step = step, .detail = detail});
}

ExecutorOptions recording_executor_options(bool activations) {
  // The step computes what a record needs (digests, top-k, the rows' state) where the logits
  // are; nothing proportional to the vocabulary reaches the host.
  return ExecutorOptions{.capture_logits = false,
                         .want_logprobs = false,
                         .record = true,
                         .top_logits_count = kTopLogitsCountMax,
                         .activations = activations ? ActivationCapture::kDigests
                                                    : ActivationCapture::kOff};
}

std::string build_id() { return LOCKSTEP_BUILD_ID; }

std::string version() { return LOCKSTEP_VERSION; }

std::string determinism_mode_of(const std::string& backend, bool batch_invariant) {
  return backend == "cpu" || batch_invariant ? std::string(kBatchInvariantMode) : "default";
}

TraceHeader make_trace_header(const ModelWeights& weights, const WeightSource& source,
                              const ExecutorConfig& config, const std::string& backend,
                              const std::optional<MachineInfo>& machine) {
  return make_trace_header(weights, weights.digest(), source, config, backend, machine);
}

TraceHeader make_trace_header(const ModelWeights& weights, uint64_t weights_digest,
                              const WeightSource& source, const ExecutorConfig& config,
                              const std::string& backend,
                              const std::optional<MachineInfo>& machine) {
  TraceHeader h;
  h.build_id = build_id();
  h.model = weights.config;
  h.weights = source;
  h.weights_digest = weights_digest;
  h.weights_digest_form = kWeightsDigestFormRecorded;
  h.executor = config;
  h.executor_options = recording_executor_options();
  h.top_logits_count = kTopLogitsCountMax;
  // The recording step digests each row's working slot (StepResult::mamba_state_digests).
  h.mamba_state_digests = weights.config.has_recurrent_state();
  h.backend = backend;
  h.determinism_mode = determinism_mode_of(backend, false);
  if (machine) h.machine = *machine;
  h.machine.cpu_name = cpu_name();
  return h;
}

}  // namespace ls::trace
