// What one step returns to the host (DESIGN.md "Step result").
#pragma once

#include "core/activations.h"
#include "core/forward_op.h"
#include "core/logits_digest.h"

#include <cstdint>
#include <vector>

namespace ls {

// A copy of the device state of some pool rows, for digests, checkers and tests.
struct StateSnapshot {
  std::vector<int32_t> pool_rows;           // [n]
  std::vector<int32_t> valid_cache_length;  // [n]
  std::vector<int32_t> future_inputs;       // [n, W]
  std::vector<int32_t> table;               // [n, Wp]

  bool operator==(const StateSnapshot&) const = default;
};

struct StepResult {
  ForwardMode mode = ForwardMode::kIdle;
  int32_t prefill_rows_count = 0;
  int32_t verify_width = 1;
  std::vector<int32_t> tokens;            // [ne sampled][nd × W verify outputs], in [0, V)
  std::vector<int32_t> accepted_lengths;  // [bs]: 1 for prefill rows, a' in [0, W] for decode
  std::vector<float> logprobs;            // [ne + nd × W] when asked, else empty
  std::vector<uint8_t> nan_flags;         // [bs] 1 where a logits row of the row held NaN
  std::vector<uint8_t> oov_flags;         // [bs] 1 where a sampled id fell outside [0, V)
  std::vector<float> logits;              // [logits rows, V] when captured, else empty
  // What a trace records of the step (ExecutorOptions::record), computed by the backend where the
  // logits are (core/logits_digest.h) and returned with the step, so that recording neither
  // copies logits to the host nor reads device state after the step. Empty otherwise.
  std::vector<uint64_t> logits_digests;   // [logits rows] of the sanitised rows
  int32_t top_logits_count = 0;           // k
  std::vector<TopLogit> top_logits;       // [logits rows, k]
  StateSnapshot state;                    // the op's pool rows after the step, in op row order
  // A model with recurrent state: mamba_state_digest of each op row's working slot after the
  // step (checkpoint snapshots included), in op row order. Empty otherwise.
  std::vector<uint64_t> mamba_state_digests;  // [bs]
  // ExecutorOptions::activations: the step's per-layer tensors (core/activations.h). Else empty.
  StepActivations activations;

  // The tokens a row emitted this step: one for a prefill row, a' for a decode row.
  std::vector<int32_t> row_tokens(int32_t row) const;
  bool operator==(const StepResult&) const = default;
};

}  // namespace ls
