// The executor's per-step invariants as pure checks over (op, result, the state before and after,
// the limits). The simulator's checkers (sim/checkers.cpp), `lockstep check` over a recorded trace
// (replay/trace_check.cpp) and the property tests (proptest/workload.cpp) all ask these, so each
// invariant has one definition and one name:
//
//   output_shape        tokens hold ne + nd·W ids, accepted_lengths one per row
//   tokens              every emitted id is in [0, V)
//   accepted_length     a prefill row accepts 1, a decode row a in [0, W]
//   context_clamp       a decode row accepts at most max(0, L − vcl_old) (core/ops/context_clamp.h)
//   valid_cache_length  vcl after the step is at most L and equals where the commit starts plus
//                       what it committed (prefill: + input_length, decode: + a)
//   kv_slot             a token at position q writes the slot the slot rule gives (core/ops/slot.h)
//                       over the pages its request holds, in table order: page[q / P]·P + q mod P,
//                       and the dummy slot 0 past the table or past the pages held
//   nan_flag            a row is flagged exactly when the step's faults poisoned it with NaN
//                       (a ±inf poison is sanitised, not flagged)
//
// Each check returns the first violation it finds, naming the invariant, the field (as the trace
// schema spells it) and the op row, or nothing.
#pragma once

#include "core/config.h"
#include "core/executor.h"
#include "core/forward_op.h"
#include "core/step_result.h"

#include <cstdint>
#include <optional>
#include <span>
#include <string>

namespace ls {

struct InvariantViolation {
  std::string invariant;  // one of the names above
  std::string field;      // e.g. "accepted_lengths[2]"
  int32_t row = -1;       // op row, -1: the step as a whole
  std::string detail;
};

// The limits the invariants read.
struct InvariantLimits {
  int32_t verify_width = 1;    // W
  int32_t context_length = 0;  // L
  int32_t vocab_size = 0;      // V
  int32_t page_size = 1;       // P
  int32_t table_width = 0;     // pages a block-table row holds

  static InvariantLimits of(const ExecutorConfig& config, int32_t vocab_size) {
    return {config.verify_width, config.context_length, vocab_size, config.page_size,
            config.table_width()};
  }
};

// What the result's shape follows from: the op's rows, prefill rows first.
struct StepShape {
  int32_t rows_count = 0;
  int32_t prefill_rows_count = 0;

  static StepShape of(const ForwardOp& op) { return {op.rows_count(), op.prefill_rows_count()}; }
};

std::optional<InvariantViolation> check_output_shape(StepShape shape, const StepResult& result,
                                                     const InvariantLimits& limits);

// After check_output_shape passed.
std::optional<InvariantViolation> check_output_tokens(StepShape shape, const StepResult& result,
                                                      const InvariantLimits& limits);

std::optional<InvariantViolation> check_accepted_length(StepShape shape, const StepResult& result,
                                                        int32_t row, const InvariantLimits& limits);

// The bound part of valid_cache_length: 0 <= vcl <= L.
std::optional<InvariantViolation> check_vcl_bound(int32_t row, int32_t vcl_after,
                                                  const InvariantLimits& limits);

// Where row `row`'s commit starts: prefix_length on a prefill row, hist_token_length on a
// recovered decode row, else the row's vcl before the step (nullopt where that is unknown).
std::optional<int32_t> commit_start(const ForwardOp& op, int32_t row,
                                    std::optional<int32_t> vcl_before);

// `start` from commit_start; a row whose start is unknown is not checked.
std::optional<InvariantViolation> check_context_clamp(const ForwardOp& op, const StepResult& result,
                                                      int32_t row, std::optional<int32_t> start,
                                                      const InvariantLimits& limits);

// `vcl_after` is the row's valid cache length after the step; with an unknown start only the
// bound L is checked.
std::optional<InvariantViolation> check_valid_cache_length(const ForwardOp& op,
                                                           const StepResult& result, int32_t row,
                                                           std::optional<int32_t> start,
                                                           int32_t vcl_after,
                                                           const InvariantLimits& limits);

// Token `index` of the step's inputs (of op row `row`) at `position` wrote `slot`; `pages` are
// the pages its request holds, in table order.
std::optional<InvariantViolation> check_kv_slot(int32_t row, int32_t index, int32_t position,
                                                int64_t slot, std::span<const int32_t> pages,
                                                const InvariantLimits& limits);

// `faults`: what the step injected (Executor::pending_faults before its submit); a result
// without flags (a foreign executor's trace) is not checked.
std::optional<InvariantViolation> check_nan_flag(const StepResult& result, int32_t row,
                                                 const StepFaults& faults);

}  // namespace ls
