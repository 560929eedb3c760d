// Checkers: the executor's invariants and the scheduler's accounting after every step, liveness
// and leaks at the end. Each failure names the step, the checker and what it saw.
#pragma once

#include "core/backend.h"
#include "core/executor.h"
#include "core/scheduler.h"
#include "sim/world.h"

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
};

void check_step(const StepObservation& o, const Scheduler& scheduler,
                std::vector<CheckFailure>& failures);

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
