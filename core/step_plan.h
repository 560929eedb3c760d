// The host half of a step, computed once in core as plain data (DESIGN.md "Backends"): which table
// slices to write (already clamped), which rows reset vcl and to what, where each row's tokens and
// logits rows sit, and each row's sampling. Backends only execute it.
#pragma once

#include "core/config.h"
#include "core/forward_op.h"
#include "core/ops/slot.h"
#include "core/sampling_params.h"

#include <cstdint>
#include <span>
#include <utility>
#include <vector>

namespace ls {

struct TableWrite {
  int32_t pool_row = 0;
  int32_t begin = 0;
  int32_t pages_offset = 0;  // into StepPlan::table_pages
  int32_t pages_count = 0;   // already clamped to the table width
};

struct LengthReset {
  int32_t pool_row = 0;
  int32_t length = 0;
};

// A checkpoint candidate (a decode row of a DECODE step, or a prefill row): working slot `src` is
// copied to `dst` after the commit iff the row's new vcl is a multiple of the page size (seed spec
// §4 invariant 6, no drafter). A verified decode row (StepPlan::mamba_verify_base ≥ 0) follows the
// rule "with a drafter" instead: with old = vcl_old, new = old + a' and fb = (old div P + 1)·P,
// the state after verify token fb − old − 1 is copied to `dst` iff fb ≤ new. The host filtered
// src ≥ 0, dst ≥ 0, src ≠ dst; the page test reads device state, so the backend makes it.
struct MambaSnapshot {
  int32_t row = 0;
  int32_t src = 0;
  int32_t dst = 0;
};

struct MambaCopy {
  int32_t src = 0;
  int32_t dst = 0;
};

struct StepPlan {
  ForwardMode mode = ForwardMode::kIdle;
  int32_t rows_count = 0;          // bs
  int32_t prefill_rows_count = 0;  // ne
  int32_t tokens_count = 0;        // T = Σ input_length
  int32_t verify_width = 1;        // W

  std::vector<int32_t> pool_rows;       // [bs]
  std::vector<RequestId> request_ids;   // [bs] (drafters key their proposals by request)
  std::vector<int32_t> input_lengths;   // [bs]
  std::vector<int32_t> token_offsets;   // [bs] first token of each row in the token buffer
  std::vector<int32_t> prefill_prefix;  // [ne] start position of each prefill row
  std::vector<int32_t> prefill_token_ids;  // [Σ prefill input_length]
  std::vector<int32_t> decode_overrides;   // [nd] -1 or column 0's id
  std::vector<uint8_t> force_single;       // [nd] 1: accept exactly one token (rule 9 of the seed)

  std::vector<TableWrite> table_writes;  // rule 1, clamped
  std::vector<int32_t> table_pages;      // pages of all table writes, concatenated
  std::vector<LengthReset> length_resets;  // rule 2

  // Recurrent state (models with Mamba layers), applied after rule 3 and before the forward:
  // copy-on-write into working slots, then zeroing of fresh requests' working slots.
  std::vector<int32_t> mamba_working;      // [bs] each row's working slot (−1: no state)
  // [bs] a verified decode row's (W > 1) first verify-state slot, Limits::mamba_verify_slot(row,
  // 0): its token j leaves its state in slot base + j, the working slot is only read, and the
  // commit copies the state after the last accepted token into it. −1 for every other row.
  std::vector<int32_t> mamba_verify_base;
  std::vector<MambaCopy> mamba_copies;     // cow_src → working
  std::vector<int32_t> mamba_zeroes;       // working slots to zero
  std::vector<MambaSnapshot> mamba_snapshots;  // after the commit (no decode row of a MIXED step)

  // Logits rows: one per prefill row (its last token), then W per decode row.
  std::vector<int32_t> logits_token_index;  // [ne + nd·W] index into the token buffer
  std::vector<ResolvedSampling> sampling;   // [bs]

  // Fault site: emitted ids replaced after sampling, before the OOV flag and the output clamp —
  // how the simulator plants an out-of-vocabulary sample. (token index, id)
  std::vector<std::pair<int32_t, int32_t>> forced_outputs;

  bool capture_logits = false;
  bool want_logprobs = false;
  // Fill the result's trace data (ExecutorOptions::record): digests and top-k of every logits
  // row, after the NaN guard, and the state of the step's rows after the commit.
  bool record = false;
  int32_t top_logits_count = 0;  // k, at most the vocabulary
  // A fault poisons logits rows between rule 4 and rule 5 (the backend's poison_logits): the
  // backend must not fuse the NaN guard into the forward.
  bool logits_poisoned = false;

  int32_t decode_rows_count() const { return rows_count - prefill_rows_count; }
  int32_t logits_rows_count() const { return static_cast<int32_t>(logits_token_index.size()); }
  std::span<const int32_t> pages_of(const TableWrite& w) const {
    return {table_pages.data() + w.pages_offset, static_cast<size_t>(w.pages_count)};
  }
};

// The slot rule (core/ops/slot.h): 0, the dummy slot, when the page column is past the table.
inline int64_t slot_for(std::span<const int32_t> table_row, int32_t page_size, int64_t position) {
  return ops::slot_for(table_row.data(), static_cast<int64_t>(table_row.size()), page_size, position);
}

}  // namespace ls
