// The scheduler production runs (seed spec §8): continuous batching under a per-step token budget
// and a row cap, chunked prefill, a page allocator, a prefix cache over full pages, retraction by
// swap or recompute, and one-step overlap. It plans forward ops; it never touches the device.
#pragma once

#include "core/cache_op.h"
#include "core/config.h"
#include "core/finish_reason.h"
#include "core/forward_op.h"
#include "core/sampling_params.h"
#include "core/step_result.h"

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace ls {

// The limits it plans within (prefill_chunk_tokens is its per-step token budget: prefill tokens
// plus W per decode row) and how it plans.
struct SchedulerConfig : Limits {
  bool mixed_batches = true;        // decode rows may join a step that carries prefill rows
  bool prefix_cache = true;
  bool overlap = true;              // plan step k before step k−1's result is applied
  // The model has Mamba layers: every row carries its request's working state slot, which is its
  // pool row − 1 (one per live request, freed with the row; needs mamba_slots_count >= B). With
  // the prefix cache, slots [B, mamba_slots_count) are its checkpoints (core/state_checkpoints.h;
  // at least one needed): a prompt's chunks end on page boundaries, rows that end a page snapshot
  // the state into a checkpoint slot, and a hit stops at the deepest cached page with one, whose
  // state the hit's first chunk copies in. Retraction by swap (host_pages_count > 0) copies the
  // working state out with the pages and back in. Speculative decoding (verify_width > 1) runs
  // with the prefix cache (verify-state slots, core/limits.h), not with swap (refused by name).
  bool recurrent_state = false;
};

struct RequestSpec {
  RequestId id = 0;
  std::vector<int32_t> prompt;
  int32_t max_new_tokens = 16;  // capped at L − prompt length
  SamplingParams sampling;
  std::vector<int32_t> stop_ids;
};

enum class RequestState : uint8_t {
  kWaiting,     // submitted, no pool row yet
  kPrefilling,  // some prompt chunks scheduled
  kDecoding,
  kRetracted,   // pool row freed; pages swapped to host or dropped
  kFinished,
};

std::string_view to_string(RequestState state);

enum class RetractPath : uint8_t { kSwap, kRecompute };

// What happened inside the scheduler during one plan or one result, for the trace and checkers.
struct SchedulerEvent {
  enum class Kind : uint8_t { kArrive, kFinish, kAbort, kRetract, kRecover, kPrefixHit } kind;
  RequestId request_id = 0;
  FinishReason finish_reason = FinishReason::kLength;  // kFinish / kAbort
  RetractPath retract_path = RetractPath::kSwap;       // kRetract / kRecover
  int32_t hist_token_length = -1;                      // kRecover (swap path)
  int32_t tokens = 0;                                  // kPrefixHit: matched tokens
};

struct StepPlanOut {
  ForwardOp op;                       // may be IDLE (no rows)
  std::vector<CacheOp> cache_ops;     // run BEFORE the op (swap-outs of retracted, swap-ins)
  std::vector<SchedulerEvent> events;
};

struct RequestOutcome {
  RequestId id = 0;
  std::vector<int32_t> tokens;  // generated tokens, in order
  FinishReason reason = FinishReason::kLength;
};

// The driving loop. With overlap, step k is planned before step k−1's result is applied, so at
// most one step is in flight when plan() runs (plan() throws otherwise); cache ops of a plan run
// after the previous step and before the plan's own op:
//
//   std::optional<std::pair<ForwardOp, StepResult>> in_flight;
//   while (!scheduler.done()) {
//     StepPlanOut plan = scheduler.plan();                                   // step k
//     if (in_flight) scheduler.apply_result(in_flight->first, in_flight->second);  // step k−1
//     in_flight.reset();
//     for (const CacheOp& op : plan.cache_ops) executor.copy_pages(op);
//     if (plan.op.rows.empty()) continue;  // IDLE: nothing to run, nothing to apply
//     StepResult result = executor.step(plan.op);
//     in_flight.emplace(std::move(plan.op), std::move(result));
//   }
//
// Without overlap: plan → copy_pages → step → apply_result, one step at a time.
class Scheduler {
 public:
  explicit Scheduler(const SchedulerConfig& config);

  // Throws ls::Error for a bad request (duplicate id, empty or over-limit prompt, bad ids given
  // vocab_size, bad sampling parameters).
  void submit(const RequestSpec& request, int32_t vocab_size);
  // A client abort; takes effect at the next plan. Unknown or finished ids → ls::Error.
  void abort(RequestId id);

  // Plans the next step. With overlap on, it is called before the previous step's result is
  // applied, so its view of committed tokens lags by one step.
  StepPlanOut plan();
  // Applies the result of the step that `op` planned. Results for requests that finished (or
  // were aborted or retracted) since are ignored. Returns the events it caused (finishes).
  std::vector<SchedulerEvent> apply_result(const ForwardOp& op, const StepResult& result);

  bool done() const;  // every request finished and no step in flight
  const std::map<RequestId, RequestOutcome>& outcomes() const;

  // Introspection for checkers and tests.
  int32_t free_pages_count() const;
  int32_t free_host_pages_count() const;
  int32_t cached_pages_count() const;      // pages held only by the prefix cache
  int32_t held_pages_count() const;        // pages at least one request references
  int32_t free_pool_rows_count() const;
  int32_t steps_in_flight_count() const;   // planned steps whose result is not applied yet
  int32_t live_requests_count() const;     // submitted and not finished
  // Tokens taken into the requests' outputs so far, all requests together: not a step's
  // accepted lengths, which also count a mid-prompt chunk's sample and results ignored.
  int64_t tokens_emitted_count() const;
  std::optional<RequestState> state_of(RequestId id) const;
  // Pages a live request holds, in table order (empty when it holds none).
  std::vector<int32_t> pages_of(RequestId id) const;
  // Tokens a request has generated so far (its outcome's tokens once finished).
  std::vector<int32_t> generated_of(RequestId id) const;
  // Empty when page, host-page and pool-row accounting agree with what the requests hold (free +
  // held + cached == pages_count − 1, reference counts match, no row or page owned twice); else
  // a description of the first disagreement. For checkers: it never throws or aborts.
  std::string check_accounting() const;
  const SchedulerConfig& config() const;

  ~Scheduler();
  Scheduler(Scheduler&&) noexcept;
  Scheduler& operator=(Scheduler&&) noexcept;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// The scheduler for a model under `limits`: a model with Mamba layers gets recurrent_state on, and
// the prefix cache only when the state pool has checkpoint slots past the B working ones (see
// SchedulerConfig::recurrent_state).
inline SchedulerConfig scheduler_config_for_model(const Limits& limits, const ModelConfig& model) {
  SchedulerConfig config{limits};
  config.recurrent_state = model.has_recurrent_state();
  config.prefix_cache =
      !config.recurrent_state || limits.mamba_slots_count > limits.max_batch_rows;
  return config;
}

// The executor that matches a scheduler runs under the same limits.
inline ExecutorConfig executor_config_for(const SchedulerConfig& config) {
  return ExecutorConfig{config};
}

}  // namespace ls
