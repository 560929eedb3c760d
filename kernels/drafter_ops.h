// The n-gram drafter on the device (issue 7): core/drafter.cpp's NgramDrafter, proposing the same
// ids for the same history, and the per-pool-row token history it reads, kept by CpuBackend's
// rules. Launchers take raw device pointers, sizes and a stream, validate their arguments, and
// return the launch status (STYLE.md §2–3). Their CPU reference is NgramDrafter and CpuBackend's
// record_input_history / write_history / write_next_inputs; tests/gpu/drafter_gpu_test.cpp
// compares the two.
#pragma once

#include "kernels/step_layout.h"

#include <cuda_runtime.h>

#include <cstdint>

namespace ls::kernels {

// The longest suffix the drafter matches (NgramDrafter::kNgramMax; cuda_backend.cpp asserts the
// two agree).
constexpr int32_t kDraftNgramMax = 3;

// The ids each pool row's current owner holds, by position: every (clamped) input id at its
// position, then the emitted tokens (CpuBackend's history).
struct TokenHistory {
  int32_t* tokens;   // [pool rows, capacity] int32
  int32_t* begin;    // [pool rows] int32: the first position the row's owner wrote
  int32_t capacity;  // L + W: a decode row at vcl = L writes positions up to L + W − 1
};

// The drafter alone. For each row r of [0, rows_count), over the window
// h = histories[r, begins[r] .. positions[r]] (inclusive; its last id is the bonus token):
// next_inputs[r, 0] = the bonus and next_inputs[r, 1 .. W−1] = NgramDrafter's drafts from h,
// clamped to [0, vocab_size). Requires 0 <= begins[r] <= positions[r] < history_stride.
cudaError_t launch_ngram_drafts(const int32_t* histories, int32_t history_stride,
                                const int32_t* begins, const int32_t* positions,
                                int32_t rows_count, int32_t verify_width, int32_t vocab_size,
                                int32_t* next_inputs, cudaStream_t stream);

// The step's drafter, launched after launch_finish_rows (which committed vcl and wrote the bonus
// into future_inputs[p, 0]). For every op row of [0, rows_grid) below the header's rows_count,
// with p its pool row, one block:
//  1. a new owner (this step's table write of p starts at column 0) starts its history at p's
//     length reset: positions before it came from a prefix-cache hit or a swap-in;
//  2. the row's (clamped) input ids enter the history at their positions (the step's token
//     buffers), then the bonus at its position — prefill: prefix + length; decode with
//     a' = vcl[p] − vcl_before[row] > 0: vcl_before[row] + a' (the accepted tokens before it
//     are the inputs already written there: the verifier only accepts a draft equal to its id);
//  3. future_inputs[p, 1 .. W−1] = the drafts from history[begin .. position], or the bonus
//     repeated when the row cannot draft (decode a' = 0, a position outside [begin, capacity)).
// Requires W = state.verify_width >= 2 (with W = 1 there is nothing to draft).
cudaError_t launch_record_and_draft(StepInputs in, DeviceState state, TokenBuffers tokens,
                                    TokenHistory history, int32_t rows_grid, cudaStream_t stream);

}  // namespace ls::kernels
