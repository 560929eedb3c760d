// Drafters for speculative decoding (seed spec §5): after a step verified a row, a drafter proposes
// the next round's draft tokens d1 … d_{W−1}. The backend runs it inside the step, after verify and
// the context clamp, and writes `[bonus, d1 … d_{W−1}]` into the row's future_input_map.
//
// A drafter sees only what the device holds for the row (its token history) and is a pure function
// of its context, so a replay that rebuilds it from the trace header proposes the same drafts.
#pragma once

#include "core/forward_op.h"
#include "core/ops/context_clamp.h"

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>

namespace ls {

// The context clamp (DESIGN.md rule 7), core/ops/context_clamp.h. Both clamp sites of a step
// (inside the step, and the step result) call it with the same vcl_old, which makes applying both
// idempotent.
using ops::clamp_accepted_to_context;

struct DraftContext {
  RequestId request_id = 0;
  // The request's tokens as the device holds them, ending with the bonus token. It starts at
  // `history_begin` (the first position the row's current owner wrote; earlier positions came
  // from a prefix-cache hit or a swap-in and are not on the device as ids).
  std::span<const int32_t> history;
  int32_t history_begin = 0;
  int32_t bonus = 0;          // the last emitted token: column 0 of the next round
  int32_t position = 0;       // the bonus token's position: the next block starts here
  int32_t verify_width = 1;   // W
  int32_t vocab_size = 0;
};

class Drafter {
 public:
  virtual ~Drafter() = default;
  // Writes the W − 1 drafts d1 … d_{W−1} into `drafts` ([W − 1] int32). Ids outside [0, V) are
  // clamped by the backend.
  virtual void draft(const DraftContext& context, std::span<int32_t> drafts) const = 0;
  // The name a trace header records; make_drafter() rebuilds the drafter from it.
  virtual std::string name() const = 0;
};

// Prompt lookup: finds the most recent earlier occurrence of the history's last n tokens (n = 3,
// then 2, then 1) and proposes the tokens that followed it; drafts past the end of the history
// continue the copy over the drafts already proposed (a repeating loop keeps repeating). With no
// match, every draft is the bonus token.
class NgramDrafter final : public Drafter {
 public:
  static constexpr int32_t kNgramMax = 3;
  void draft(const DraftContext& context, std::span<int32_t> drafts) const override;
  std::string name() const override { return "ngram"; }
};

inline constexpr std::string_view kNoDrafterName = "none";

// The drafter a trace header names: "none" (or empty) → null, "ngram" → NgramDrafter. Throws
// ls::Error for any other name, saying which drafters can be rebuilt.
std::unique_ptr<Drafter> make_drafter(std::string_view name);

}  // namespace ls
