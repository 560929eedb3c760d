// The declared limits of one serving world: the executor sizes every buffer from them once, at
// start-up (DESIGN.md "Limits"), the scheduler plans within them, and the simulator draws them per
// seed. One type, embedded by ExecutorConfig, SchedulerConfig and sim::SimParams, and one table of
// names and ranges (kLimitFields) that validate(), the CLI's flags and the Python binding read.
#pragma once

#include <cstdint>
#include <limits>
#include <optional>
#include <span>
#include <string>
#include <string_view>

namespace ls {

// The ranges a limit may take. Every product the executor forms from them stays inside int32
// (asserted below), so no size computed from valid limits can wrap.
inline constexpr int32_t kMaxBatchRowsMax = 4096;
// L >= 2: a request holds at least one prompt token and room for the one token it generates
// (the scheduler requires prompt length < L; seed spec: max_new_tokens is capped at L − prompt).
inline constexpr int32_t kContextLengthMin = 2;
inline constexpr int32_t kContextLengthMax = 1 << 24;
inline constexpr int32_t kPageSizeMax = 4096;
// Page 0 is the dummy that overflow writes hit, so a pool needs one page besides it.
inline constexpr int32_t kPagesCountMin = 2;
inline constexpr int32_t kPagesCountMax = 1 << 26;
inline constexpr int32_t kVerifyWidthMax = 16;
inline constexpr int32_t kPrefillChunkTokensMax = 1 << 20;
inline constexpr int32_t kHostPagesCountMax = 1 << 26;
inline constexpr int32_t kMambaSlotsCountMax = 1 << 16;

inline constexpr int64_t kInt32Max = std::numeric_limits<int32_t>::max();
static_assert(int64_t{kMaxBatchRowsMax} + 2 <= kInt32Max, "pool rows (B + 2) must fit in int32");
static_assert(int64_t{kPrefillChunkTokensMax} + int64_t{kMaxBatchRowsMax} * kVerifyWidthMax <=
                  kInt32Max,
              "step tokens (prefill chunk + B·W) must fit in int32");
static_assert(int64_t{kContextLengthMax} + kVerifyWidthMax + kPageSizeMax <= kInt32Max,
              "block-table width arithmetic (L + W + P) must fit in int32");
static_assert(int64_t{kMaxBatchRowsMax + 2} * (kContextLengthMax + kVerifyWidthMax + kPageSizeMax) <=
                  std::numeric_limits<int64_t>::max(),
              "block-table entries (pool rows · table width) must fit in int64");
static_assert(kContextLengthMin >= 2 && kPagesCountMin >= 2, "see the comments above");

// Pool row 0 is reserved, rows 1..max_batch_rows are real, and row max_batch_rows + 1 is the
// padding sentinel no request ever owns (seed spec §3.1).
struct Limits {
  int32_t max_batch_rows = 16;         // B: rows in one forward op
  int32_t context_length = 512;        // L: tokens a request may hold in KV (prompt + generated)
  int32_t page_size = 16;              // P: tokens per KV page
  int32_t pages_count = 1024;          // KV pages, page 0 being the dummy that overflow writes hit
  int32_t verify_width = 1;            // W: decode input tokens per row (N with spec decoding)
  // Prefill tokens in one forward op, summed over rows. The scheduler's per-step token budget:
  // the prefill it plans plus W per decode row stays within it.
  int32_t prefill_chunk_tokens = 512;
  int32_t host_pages_count = 0;        // host KV pages that retraction may swap to; 0 = none
  // Recurrent-state slots of a model with Mamba layers (working states of live requests, and
  // checkpoints), indexed from 0: slot 0 is a real slot, so "none" is −1. 0 = no state pool.
  int32_t mamba_slots_count = 0;

  int32_t pool_rows_count() const { return max_batch_rows + 2; }
  int32_t sentinel_pool_row() const { return max_batch_rows + 1; }
  // Wp: block-table columns. ⌊(L+P)/P⌋ without speculative decoding, ⌈(L+W)/P⌉ with it.
  int32_t table_width() const;
  // Tokens one step may carry: the prefill budget plus W for every row.
  int32_t step_tokens_max() const { return prefill_chunk_tokens + max_batch_rows * verify_width; }
  // Logits rows one step may produce: W for every row (prefill rows need one).
  int32_t logits_rows_max() const { return max_batch_rows * verify_width; }
  // A model with Mamba layers under speculative decoding (W > 1): the backend's private state
  // slots past the mamba_slots_count addressable ones, W per batch row, that hold a verified
  // decode row's state after each of its W tokens (the seed's mamba_output_indices); the commit
  // keeps the one after the last accepted token. Batch row r's token j: verify_state_slot(r, j).
  int32_t mamba_verify_slots_count() const {
    return verify_width > 1 ? max_batch_rows * verify_width : 0;
  }
  int32_t mamba_verify_slot(int32_t batch_row, int32_t token) const {
    return mamba_slots_count + batch_row * verify_width + token;
  }
  // Throws ls::Error naming the first field outside its range in kLimitFields.
  void validate() const;

  bool operator==(const Limits&) const = default;
};

// One limit: its name (the config key, the Python keyword, the trace header field), the member,
// its range, the CLI flag that sets it ("" when none does) and what it means (the flag's help).
struct LimitField {
  std::string_view name;
  int32_t Limits::*member;
  int32_t min;
  int32_t max;
  std::string_view flag;
  std::string_view description;
};

inline constexpr LimitField kLimitFields[] = {
    {"max_batch_rows", &Limits::max_batch_rows, 1, kMaxBatchRowsMax, "--max-batch-rows",
     "B: rows in one forward op"},
    {"context_length", &Limits::context_length, kContextLengthMin, kContextLengthMax,
     "--context-length", "L: tokens a request may hold (prompt + generated)"},
    {"page_size", &Limits::page_size, 1, kPageSizeMax, "--page-size", "P: tokens per KV page"},
    {"pages_count", &Limits::pages_count, kPagesCountMin, kPagesCountMax, "--pages",
     "KV pages (page 0 is the dummy)"},
    {"verify_width", &Limits::verify_width, 1, kVerifyWidthMax, "--verify-width",
     "W: decode input tokens per row (speculative decoding when > 1: the last token and W - 1 "
     "drafts, verified in one step)"},
    {"prefill_chunk_tokens", &Limits::prefill_chunk_tokens, 1, kPrefillChunkTokensMax,
     "--prefill-chunk-tokens",
     "Prefill tokens in one step, summed over rows (longer prompts are chunked)"},
    {"host_pages_count", &Limits::host_pages_count, 0, kHostPagesCountMax, "",
     "Host KV pages that retraction may swap to; 0 = none (retraction recomputes)"},
    {"mamba_slots_count", &Limits::mamba_slots_count, 0, kMambaSlotsCountMax, "--mamba-slots",
     "Recurrent-state slots of a model with Mamba layers (one working slot per live request, "
     "plus checkpoints); 0 = none, or for such a model one per batch row"},
};

// The row of kLimitFields for `member` (every member has one).
const LimitField& limit_field(int32_t Limits::*member);

// Empty when `value` lies in the field's range, else "<name> must be in [min, max], got <value>".
// `value` is 64-bit so that a caller checks before narrowing.
std::optional<std::string> limit_error(const LimitField& field, int64_t value);

}  // namespace ls
