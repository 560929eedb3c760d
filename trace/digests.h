// Builds a step's output record from what the executor returned: the StepResult with its trace
// data (logits digests, top-k pairs and the rows' state, which the backend computed inside the
// step: ExecutorOptions::record), or — for tests and tools that captured whole logits rows —
// digests and top-k computed here from StepResult::logits by the same definition
// (core/logits_digest.h; trace/trace.capnp "DIGESTS").
#pragma once

#include "core/backend.h"
#include "core/step_result.h"
#include "trace/records.h"

#include <cstdint>
#include <span>
#include <vector>

namespace ls::trace {

using ls::append_top_logits;   // logit descending, lower id first on ties, NaN last
using ls::logits_row_digest;   // core/logits_digest.h
uint64_t future_inputs_digest(std::span<const int32_t> ids);  // XXH3-64 over W int32 ids

// `touched` is read_state() of the op's pool rows in op row order ([bs] rows), or empty: then the
// result's own snapshot (StepResult::state) is used, or no state is recorded when that is empty
// too. `top_logits_count` in 0..kTopLogitsCountMax. Digests and top pairs come from the result's
// trace data when it has them (the count must then be the result's), else from `result.logits`
// when it holds the logits rows, else the record has none.
StepOutputRecord make_step_output(int64_t step, StepResult&& result, const StateSnapshot& touched,
                                  int32_t top_logits_count);
StepOutputRecord make_step_output(int64_t step, const StepResult& result,
                                  const StateSnapshot& touched, int32_t top_logits_count);

// The same, into an existing record whose vectors keep their capacity (the recorder's path).
void fill_step_output(StepOutputRecord& out, int64_t step, const StepResult& result,
                      const StateSnapshot& touched, int32_t top_logits_count);

}  // namespace ls::trace
