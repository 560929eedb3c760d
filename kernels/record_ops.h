// What a trace records of a step beyond its outputs, computed on the device (issue 12: nothing
// reads live device state after the step): the logits digests and top-k pairs come from the
// logits pass (kernels/logits_ops.h); this snapshot of the step's rows' state (vcl, future inputs,
// table row) after the commit and the drafter, into the results the step copies back once.
#pragma once

#include "kernels/step_layout.h"

#include <cuda_runtime.h>

#include <cstdint>

namespace ls::kernels {

// The record's part of the packed results, [rows] by op row and [logits rows] by logits row.
struct RecordBuffers {
  uint64_t* digests;        // [logits_rows_max]
  int32_t* top;             // [logits_rows_max, kTopLogitsCountMax, 2] id, logit bits; best first
  int32_t* vcl;             // [rows_max]
  int32_t* future_inputs;   // [rows_max, W]
  int32_t* table;           // [rows_max, table_width]
};

// The state of op rows [0, header.rows_count) (their pool rows from the staged step) into `out`'s
// vcl, future_inputs and table; `rows_grid` (>= the header's count; a graph's padded size) bounds
// the launch.
cudaError_t launch_record_state(StepInputs in, DeviceState state, int32_t rows_grid,
                                RecordBuffers out, cudaStream_t stream);

}  // namespace ls::kernels
