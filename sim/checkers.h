// Checkers: the executor's invariants and the scheduler's accounting after every step, liveness
// and leaks at the end. Each failure names the step, the checker and what it saw.
#pragma once

#include "core/backend.h"
#include "core/executor.h"
#include "core/scheduler.h"
#include "sim/world.h"

#include <map>
#include <set>
#include <vector>

namespace ls::sim {

struct StepObservation {
  int64_t step = 0;
  const ForwardOp* op = nullptr;
  const StepResult* result = nullptr;
  const StateSnapshot* before = nullptr;  // state of the op's pool rows before the step (after resets are not yet applied)
  const StateSnapshot* after = nullptr;
  const InputSnapshot* inputs = nullptr;
  int32_t vocab_size = 0;
  const ExecutorConfig* config = nullptr;
  const StepFaults* faults = nullptr;  // what the step injected
  // A model with recurrent state: the step's plan (its state rules), and the digest of every
  // state slot 0..mamba_slots_count − 1 before and after the step. Null otherwise.
  const StepPlan* plan = nullptr;
  const std::vector<uint64_t>* mamba_before = nullptr;
  const std::vector<uint64_t>* mamba_after = nullptr;
};

void check_step(const StepObservation& o, const Scheduler& scheduler,
                std::vector<CheckFailure>& failures);

// Who holds each working state slot across steps (the mamba-slot-owner checker's memory).
struct MambaSlotOwners {
  std::map<int32_t, RequestId> of_slot;
  std::map<RequestId, int32_t> of_request;
};

// The recurrent-state invariants of one step (issue 19), on a model with Mamba layers:
//   mamba-slot-owner   no two live requests share a working slot: a slot changes hands only once
//                      the request that held it is no longer prefilling or decoding;
//   mamba-padding      the backend's token buffer gives each of the step's tokens its row's
//                      working slot and every padded token −1, never a real slot (slot 0 is real);
//   mamba-state-owner  only the slots the step's rows own (working, checkpoint) change state;
//                      padding and other requests' slots keep their bits (digests);
//   mamba-first-chunk  a prefill row that starts its request from nothing (prefix 0) is planned
//                      to zero its working slot before the forward — the first chunk, and again
//                      after a retraction by recompute; a prefix hit's first chunk (cow_src) to
//                      copy the checkpoint into it.
void check_mamba_step(const StepObservation& o, const Scheduler& scheduler, MambaSlotOwners& owners,
                      std::vector<CheckFailure>& failures);
// mamba-slot-owner alone, from the op and the scheduler (no model needed: the slot property of
// tests/mamba_slot_properties.h runs it over fake results).
void check_mamba_slot_owners(int64_t step, const ForwardOp& op, const Scheduler& scheduler,
                             MambaSlotOwners& owners, std::vector<CheckFailure>& failures);

// Page accounting: every device page is free, held by a request (finished requests keep theirs
// until their last in-flight step is applied), or held only by the prefix cache — exactly once.
// Also runs the scheduler's own accounting check.
void check_pages(int64_t step, const Scheduler& scheduler, const std::vector<RequestId>& submitted,
                 std::vector<CheckFailure>& failures);

struct EndState {
  const std::vector<RequestId>* submitted = nullptr;
  const std::map<RequestId, int64_t>* arrival_step = nullptr;
  const std::map<RequestId, int64_t>* finish_step = nullptr;
  int64_t starvation_bound_steps = 0;
};

void check_end(const EndState& end, const Scheduler& scheduler, std::vector<CheckFailure>& failures);

}  // namespace ls::sim
