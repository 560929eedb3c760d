// The state a record keeps of one op row (its pool row's vcl, future inputs and table row), copied
// by whichever kernel last writes that state in a step: the finish (no drafter) or the record's
// own kernel after the drafter (kernels/record_ops.cu). `threads` lanes of the calling block copy.
#pragma once

#include "kernels/record_ops.h"

namespace ls::kernels {

__device__ __forceinline__ void snapshot_row(const StepInputs& in, const DeviceState& state,
                                             const RecordBuffers& out, int32_t y, int32_t threads) {
  const int32_t p = in.pool_rows[y];
  const int32_t w = state.verify_width;
  const int32_t t = static_cast<int32_t>(threadIdx.x);
  if (t == 0) out.vcl[y] = state.vcl[p];
  for (int32_t i = t; i < w; i += threads) {
    out.future_inputs[int64_t{y} * w + i] = state.future_inputs[int64_t{p} * w + i];
  }
  for (int32_t i = t; i < state.table_width; i += threads) {
    out.table[int64_t{y} * state.table_width + i] = state.table[int64_t{p} * state.table_width + i];
  }
}

}  // namespace ls::kernels
