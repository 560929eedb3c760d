// Builds a step's output record from what the executor returned: the StepResult (logits dropped,
// replaced by their digests), the state of the rows the step touched, and the top-k pairs.
// All digests are XXH3-64 with seed 0 over little-endian bytes (trace/trace.capnp "DIGESTS").
#pragma once

#include "core/backend.h"
#include "core/step_result.h"
#include "trace/records.h"

#include <cstdint>
#include <span>
#include <vector>

namespace ls::trace {

uint64_t logits_row_digest(std::span<const float> row);      // over V float32 values
uint64_t future_inputs_digest(std::span<const int32_t> ids);  // over W int32 ids

// Appends the top `count` (id, logit) pairs of `row` to `out`: logit descending, lower id first
// on ties, NaN after every number. `count` is clamped to the row's length.
void append_top_logits(std::span<const float> row, int32_t count, std::vector<TopLogit>& out);

// `touched` is read_state() of the op's pool rows in op row order ([bs] rows), or empty when the
// caller does not record state. `top_logits_count` in 0..kTopLogitsCountMax; top pairs and logits
// digests are produced only when `result.logits` holds the logits rows.
StepOutputRecord make_step_output(int64_t step, StepResult&& result, const StateSnapshot& touched,
                                  int32_t top_logits_count);
StepOutputRecord make_step_output(int64_t step, const StepResult& result,
                                  const StateSnapshot& touched, int32_t top_logits_count);

// The same, into an existing record whose vectors keep their capacity (the recorder's path).
void fill_step_output(StepOutputRecord& out, int64_t step, const StepResult& result,
                      const StateSnapshot& touched, int32_t top_logits_count);

}  // namespace ls::trace
