// Comparing a replayed step's output record with the recorded one, field by field, bit for bit.
#pragma once

#include "core/forward_op.h"
#include "trace/records.h"

#include <optional>
#include <string>

namespace ls::replay {

struct Divergence {
  int64_t step = 0;
  RequestId request_id = 0;
  int32_t row = 0;        // op row
  std::string field;      // e.g. "tokens", "valid_cache_length", "logits_digest"
  std::string expected;   // as recorded
  std::string actual;     // as replayed

  std::string describe() const;
};

// The first field, in a fixed order (tokens, accepted length, flags, logits digests, vcl, drafts,
// future inputs, top-k logits, logprobs), where `actual` differs from `expected`; rows in op order.
std::optional<Divergence> first_divergence(const ForwardOp& op, const trace::StepOutputRecord& expected,
                                           const trace::StepOutputRecord& actual);

}  // namespace ls::replay
