// What one step returns to the host (DESIGN.md "Step result").
#pragma once

#include "core/forward_op.h"

#include <cstdint>
#include <vector>

namespace ls {

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

  // The tokens a row emitted this step: one for a prefill row, a' for a decode row.
  std::vector<int32_t> row_tokens(int32_t row) const;
  bool operator==(const StepResult&) const = default;
};

}  // namespace ls
