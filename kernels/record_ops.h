// What a trace records of a step, computed on the device (issue 12: no host work proportional to
// the vocabulary): the logits digest and the top-k (id, logit) pairs of every logits row, by the
// definition in core/digest_math.h (the CPU reference is core/logits_digest.cpp, compared in
// tests/gpu/record_ops_gpu_test.cpp), and a snapshot of the step's rows' state (vcl, future
// inputs, table row) after the commit — so that the step's one packed copy brings back everything
// a record needs and nothing reads live device state afterwards.
#pragma once

#include "kernels/step_layout.h"

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

namespace ls::kernels {

// Logits a block of the record kernel covers: 8 per thread of 256, so that a batch-1 row of a
// 128 Ki vocabulary spreads over 63 blocks (the H200 has 132 SMs) and the combine reads 504 keys.
constexpr int32_t kRecordChunk = 2048;

// The record's part of the packed results, [rows] by op row and [logits rows] by logits row.
struct RecordBuffers {
  uint64_t* digests;        // [logits_rows_max]
  int32_t* top;             // [logits_rows_max, kTopLogitsCountMax, 2] id, logit bits; best first
  int32_t* vcl;             // [rows_max]
  int32_t* future_inputs;   // [rows_max, W]
  int32_t* table;           // [rows_max, table_width]
};

// Workspace of the record kernel for up to `logits_rows_max` rows: a per-row counter (zero
// between launches: zero it once after allocating) that lets the last chunk of a row combine the
// per (row, chunk) partial sums and candidates.
size_t record_workspace_bytes(int32_t logits_rows_max, int32_t vocab);

// Digests and top-k of logits rows [0, header.logits_rows_count) of `logits` [rows, vocab], and
// the state snapshot of op rows [0, header.rows_count) (their pool rows from the staged step),
// in one launch. `logits_rows_grid` / `rows_grid` (>= the header's counts; a graph's padded
// sizes) bound the launch; `k` in [0, kTopLogitsCountMax] pairs are written per row.
cudaError_t launch_record_step(StepInputs in, DeviceState state, const float* logits,
                               int32_t vocab, int32_t logits_rows_grid, int32_t rows_grid,
                               int32_t k, void* workspace, int32_t workspace_rows,
                               RecordBuffers out, cudaStream_t stream);

// The digest and top-k alone, over `rows` rows (tests compare them with the CPU reference).
cudaError_t launch_record_logits(const float* logits, int32_t rows, int32_t vocab, int32_t k,
                                 void* workspace, int32_t workspace_rows, uint64_t* digests,
                                 int32_t* top, cudaStream_t stream);

}  // namespace ls::kernels
