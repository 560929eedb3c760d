// Device state ops of the CUDA backend (DESIGN.md per-step rules 1–3). Launchers take raw device
// pointers, sizes and a stream, validate their arguments, and return the launch status
// (STYLE.md §2–3). Their CPU reference is CpuBackend's apply_table_writes / reset_lengths /
// fill_inputs; tests/gpu/ compares the two. They launch in plain stream order and never let a
// successor overlap them: overlapped kernels read the step inputs they write before waiting
// (kernels/launch.cuh).
#pragma once

#include "kernels/step_layout.h"

#include <cuda_runtime.h>

#include <cstdint>

namespace ls::kernels {

// Rule 3 for decode rows: for row r with pool row p = pool_rows[r] and c = vcl[p], token r·W + t
// reads future_inputs[p, t] (clamped to [0, vocab_size)), position c + t, and the slot
// table[p, (c+t)/P]·P + (c+t)%P, or 0 (the dummy slot) when the column is past the table.
cudaError_t launch_fill_decode_inputs(const int32_t* pool_rows, int32_t rows_count,
                                      const int32_t* valid_cache_lengths,
                                      const int32_t* future_inputs, int32_t verify_width,
                                      const int32_t* table, int32_t table_width,
                                      int32_t page_size, int32_t vocab_size, int32_t* input_ids,
                                      int32_t* positions, int64_t* slots, cudaStream_t stream);

// Rule 1: table[pool_row, begin + j] = pages[offset + j] for the header's table writes.
// `writes_grid` (>= the header's count) is the launch size; a graph passes rows_max.
cudaError_t launch_apply_table_writes(StepInputs in, DeviceState state, int32_t writes_grid,
                                      cudaStream_t stream);

// Rule 2: vcl[pool_row] = length for the header's length resets, in order.
cudaError_t launch_reset_lengths(StepInputs in, DeviceState state, cudaStream_t stream);

// Rule 3, both halves: per row, vcl_before[row] = vcl[p] and a decode override's write into
// future_inputs (column 0; every column for force-single rows); then per token of
// [0, tokens_max): ids, positions, slots and pool rows of real tokens, and the scrub (id 1,
// position 0, slot 0, the sentinel pool row) of every token past the header's tokens_count.
// `rows_grid` (>= the header's rows_count) is the launch size of the per-row half.
cudaError_t launch_fill_inputs(StepInputs in, DeviceState state, TokenBuffers tokens,
                               int32_t rows_grid, cudaStream_t stream);

}  // namespace ls::kernels
