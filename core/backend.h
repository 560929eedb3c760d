// The narrow interface between the executor's rules and a backend's arithmetic and memory.
// Each call is one rule of DESIGN.md's per-step sequence; the executor calls them in order.
// A backend owns the device-resident state (vcl, future_input_map, block table, KV pool) and the
// step's buffers, all sized once from the ExecutorConfig.
#pragma once

#include "core/activations.h"
#include "core/cache_op.h"
#include "core/check.h"
#include "core/step_plan.h"
#include "core/step_result.h"
#include "core/step_stats.h"

#include <cstdint>
#include <span>
#include <string>
#include <vector>

namespace ls {

// The inputs the last fill produced, for tests of the slot rule and scrubbing.
struct InputSnapshot {
  std::vector<int32_t> input_ids;   // [step_tokens_max]
  std::vector<int32_t> positions;   // [step_tokens_max]
  std::vector<int64_t> slots;       // [step_tokens_max]
  // A model with recurrent state: each token's working state slot, −1 past the step's tokens
  // (padding must never read or write a real slot: slot 0 is real). Empty otherwise.
  std::vector<int32_t> mamba_slots;  // [step_tokens_max]
};

class Backend {
 public:
  virtual ~Backend() = default;
  Backend() = default;
  Backend(const Backend&) = delete;
  Backend& operator=(const Backend&) = delete;

  virtual std::string name() const = 0;
  // Rule 1: write the (already clamped) block-table slices.
  virtual void apply_table_writes(const StepPlan& plan) = 0;
  // Rule 2: vcl resets for prefill rows and recovered decode rows.
  virtual void reset_lengths(const StepPlan& plan) = 0;
  // Rule 3: ids (prefill from the plan, decode from future_input_map or the override), positions,
  // slots by the slot rule, id clamp to [0, V), tail scrub.
  virtual void fill_inputs(const StepPlan& plan) = 0;
  // Whether the model carries per-request recurrent state (Mamba layers): rows then need working
  // slots (the executor's validator requires them).
  virtual bool has_recurrent_state() const { return false; }
  // Between rules 3 and 4, for a model with recurrent state: the plan's copy-on-write copies, then
  // its zeroing. Checkpoint snapshots run inside finish_step after the commit.
  virtual void apply_state_rules(const StepPlan& plan) {
    LS_ASSERT(plan.mamba_copies.empty() && plan.mamba_zeroes.empty() &&
                  plan.mamba_snapshots.empty(),
              "backend {} has no recurrent state", name());
  }
  // Rule 4: the model forward; leaves the plan's logits rows in the backend.
  virtual void forward(const StepPlan& plan) = 0;
  // A fault site: overwrite whole logits rows with `value` — NaN, or ±inf (simulator and tests).
  virtual void poison_logits(std::span<const int32_t> logits_rows, float value) = 0;
  // Rules 5–9: NaN guard, sample/verify, context clamp, commit, output clamp. Writes every field
  // of `result`, reusing its vectors' capacity, so a caller that keeps its result allocates
  // nothing once warmed up.
  virtual void finish_step(const StepPlan& plan, StepResult& result) = 0;

  // Running ahead (DESIGN.md rule 9: the host plans step k+1 before it reads step k). A backend
  // that can says so here and splits finish_step in two: enqueue_finish launches rules 5–9 and
  // returns without waiting; collect_finish waits for the oldest enqueued step and unpacks it.
  // Between the two the executor may run rules 1–4 and enqueue_finish of the next step (at most
  // two steps enqueued and not collected), copy_pages, read_state and read_inputs; steps are
  // collected in the order they were enqueued, each with the plan it was enqueued with (kept
  // alive and unchanged by the executor until then). A backend that cannot (one that computes
  // on the host) keeps the defaults: the executor then calls finish_step at submit time and
  // holds the result until it is collected.
  virtual bool can_run_ahead() const { return false; }
  virtual void enqueue_finish(const StepPlan& /*plan*/) {
    LS_ASSERT(false, "backend {} cannot run ahead: enqueue_finish", name());
  }
  // Writes into `result`, reusing its vectors' capacity.
  virtual void collect_finish(const StepPlan& /*plan*/, StepResult& /*result*/) {
    LS_ASSERT(false, "backend {} cannot run ahead: collect_finish", name());
  }

  // KV page copies between the device pool and the host pool (retraction by swap), and with
  // op.state_slot >= 0 (a backend with recurrent state only) that slot's state to or from the
  // host state of the op's first host page. Indices are validated by the executor.
  virtual void copy_pages(const CacheOp& op) = 0;

  // State after every step submitted so far: with a step in flight (enqueued, not collected)
  // they wait for it and see its effects, so an observer that needs one step's state must not
  // let the executor run ahead (the serving loop does not when it has an observer).
  virtual StateSnapshot read_state(std::span<const int32_t> pool_rows) const = 0;
  virtual InputSnapshot read_inputs() const = 0;
  // mamba_state_digest (core/logits_digest.h) of each of `slots` as the submitted steps left
  // them (like read_state, waiting for a step in flight). A backend without recurrent state
  // holds no slots.
  virtual std::vector<uint64_t> read_mamba_digests(std::span<const int32_t> slots) const {
    LS_ASSERT(slots.empty(), "backend {} has no recurrent state: {} slots asked", name(),
              slots.size());
    return {};
  }

  // Per-layer activations (core/activations.h; replay's localisation, --record-activations):
  // while on, every forward captures its step's tensors, and take_activations() hands over the
  // last forward's (called by the executor right after forward, before the next step's). Off by
  // default, costing nothing. A backend that cannot capture refuses with ls::Error naming why.
  virtual void capture_activations(ActivationCapture mode) {
    LS_REQUIRE(mode == ActivationCapture::kOff, "backend {} cannot capture per-layer activations",
               name());
  }
  virtual StepActivations take_activations() { return {}; }

  // What the device measured of the last collected step (step stats; a backend that computes on
  // the host measures nothing and keeps the default).
  virtual DeviceStepTime last_device_time() const { return {}; }
};

}  // namespace ls
