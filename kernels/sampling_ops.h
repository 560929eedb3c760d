// Rules 5–9 on the device: sampling, verification, the context clamp, the commit of vcl and
// future_input_map, forced outputs, the OOV flag and the output clamp. The sampling definition is
// core/sampling.cpp's, step by step, with the same Philox4x32-10 draws keyed by (seed, position,
// draw index); greedy rows use the guard's argmax (lowest id on ties).
//
// Stochastic rows need their ids in the order (weight desc, id asc): launch_sampling_weights
// writes one 64-bit key per (logits row, id) — the weight's bits above the id's complement, so
// the order is a strict total order — and launch_sort_sampling_keys sorts each row's keys
// descending; launch_sampling_block_sums then sums each row's sorted weights in the definition's
// blocks (core/ops/order_sums.h), in parallel, so that no thread walks a row's whole vocabulary.
#pragma once

#include "core/ops/order_sums.h"
#include "kernels/record_ops.h"
#include "kernels/step_layout.h"

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

namespace ls::kernels {

// The id's complement takes the low sampling_key_id_bits(vocab) bits of a key, the weight's bits
// (w in [0, 1]: below 2^30) the 30 above them, so a sort reads sampling_key_bits(vocab) bits (47
// for a 128k vocabulary) instead of 64.
LS_HOST_DEVICE LS_INLINE int32_t sampling_key_id_bits(int32_t vocab) {
  int32_t bits = 0;
  while (bits < 31 && (int64_t{1} << bits) < vocab) ++bits;
  return bits;
}
LS_HOST_DEVICE LS_INLINE int32_t sampling_key_bits(int32_t vocab) {
  return 30 + sampling_key_id_bits(vocab);
}

// The key of weight w (>= 0) and id: the order of keys is step 4's order of (w desc, id asc).
struct SamplingKeys {
  uint64_t* keys;         // [logits_rows_max, vocab] by id
  uint64_t* sorted_keys;  // [logits_rows_max, vocab] descending per row
  // Per row, at a stride of ops::order_sum_stride(vocab): B_c (core/ops/order_sums.h) of the row's
  // sorted weights, and P_c = B_0 + ... + B_{c-1} left to right (c <= the blocks).
  float* block_sums;
  float* block_prefixes;
};

// Steps 2–3 for every stochastic logits row of the step: keys[r, i] from w_i = e^(l_i/T − m)
// (core/ops/portable_exp.h).
// Greedy and padded rows are skipped. logits [rows_grid, vocab] fp32 (already sanitised).
cudaError_t launch_sampling_weights(StepInputs in, const float* logits, int32_t rows_grid,
                                    int32_t vocab, SamplingKeys keys, cudaStream_t stream);

// Bytes of temporary storage the sort needs for rows_max rows of `vocab` keys.
size_t sort_sampling_keys_temp_bytes(int32_t rows_max, int32_t vocab);

// Sorts each of `rows` rows of keys descending. segment_offsets [rows_max + 1] holds r·vocab.
cudaError_t launch_sort_sampling_keys(void* temp, size_t temp_bytes, SamplingKeys keys,
                                      int32_t rows, int32_t vocab, const int32_t* segment_offsets,
                                      cudaStream_t stream);

// B_c and P_c of every stochastic row's sorted weights (core/ops/order_sums.h), after the sort:
// a block a row, each thread summing order blocks, then one thread chaining P.
cudaError_t launch_sampling_block_sums(StepInputs in, int32_t rows_grid, int32_t vocab,
                                       SamplingKeys keys, cudaStream_t stream);

struct FinishArgs {
  StepInputs in;
  DeviceState state;
  ResultBuffers out;
  const float* logits;            // [logits rows, vocab] sanitised
  int32_t vocab;
  const int32_t* argmax;          // [logits rows] from the guard
  const int32_t* row_nan_flags;   // [logits rows] from the guard
  const float* row_max;           // [logits rows] from the guard; read when want_logprobs
  const float* row_sum;           // [logits rows]
  SamplingKeys keys;              // read for stochastic rows only
  const int32_t* input_ids;       // [step tokens] the step's (clamped) inputs: verify drafts
  // A recorded step without a drafter: each row's state after its commit, into the record's part
  // of the results (null vcl: none; with a drafter, launch_record_state does it after the drafts).
  RecordBuffers snapshot{};
};

// One block per op row of [0, rows_grid); rows past the header's rows_count write nothing.
cudaError_t launch_finish_rows(const FinishArgs& args, int32_t rows_grid, cudaStream_t stream);

}  // namespace ls::kernels
