// The forward op: one scheduled batch, the executor's only input (DESIGN.md "The executor's
// contract"). Prefill rows come first, then decode rows; the mode follows from the counts.
#pragma once

#include "core/check.h"
#include "core/config.h"
#include "core/sampling_params.h"

#include <cstdint>
#include <optional>
#include <string_view>
#include <vector>

namespace ls {

enum class RowKind : uint8_t { kPrefill = 0, kDecode = 1 };
enum class ForwardMode : uint8_t { kIdle = 0, kExtend = 1, kMixed = 2, kDecode = 3 };

std::string_view to_string(ForwardMode mode);
std::string_view to_string(RowKind kind);
ForwardMode forward_mode_of(int32_t prefill_rows_count, int32_t rows_count);

// A slice of the request's block table to (re)write: table[pool_row, begin + j] = pages[j].
// Slices that run past the table width are clamped, never rejected (seed spec §3.2 a).
struct TableRefresh {
  int32_t begin = 0;
  std::vector<int32_t> pages;

  bool operator==(const TableRefresh&) const = default;
};

struct OpRow {
  RowKind kind = RowKind::kDecode;
  RequestId request_id = 0;
  int32_t pool_row = 0;      // 1..max_batch_rows
  int32_t input_length = 0;  // prefill: this chunk's tokens; decode: must equal W
  // Prefill rows only.
  int32_t prefix_length = 0;  // tokens already in KV (prefix-cache hit + earlier chunks)
  int32_t prompt_length = 0;  // the whole prompt; the chunk is the last iff prefix + input == it
  // Decode rows only.
  int32_t decode_override = -1;     // -1: input from future_input_map; else column 0's id
  int32_t hist_token_length = -1;   // -1, or the KV length to resume from after retraction
  TableRefresh refresh;
  // Recurrent-state slots (models with Mamba layers; all −1 otherwise). Slot 0 is a real slot, so
  // "none" is −1 (seed spec §4 invariant 6).
  int32_t mamba_working = -1;          // the request's working state; required on such a model
  // Working → here after the step when the new vcl ends a page: decode rows of DECODE steps, and
  // prefill rows whose chunk ends a page.
  int32_t mamba_checkpoint_dst = -1;
  int32_t mamba_cow_src = -1;          // copied into the working slot before the forward
  int32_t mamba_branching_seqlen = -1; // the tokens the copied state covers (with mamba_cow_src)
  // Required when the request is new to its pool row; ignored otherwise must not be given.
  std::optional<SamplingParams> sampling;

  bool operator==(const OpRow&) const = default;
};

struct ForwardOp {
  std::vector<OpRow> rows;                 // [bs], prefill rows first
  std::vector<int32_t> prefill_token_ids;  // [Σ prefill input_length], row by row

  int32_t rows_count() const { return static_cast<int32_t>(rows.size()); }
  int32_t prefill_rows_count() const;
  int32_t decode_rows_count() const { return rows_count() - prefill_rows_count(); }
  ForwardMode mode() const { return forward_mode_of(prefill_rows_count(), rows_count()); }
  bool operator==(const ForwardOp&) const = default;
};

// The field of a forward op that a refusal is about.
enum class OpField : uint8_t {
  kRows,             // the op as a whole: its row count
  kPrefillTokens,    // the op as a whole: its prefill rows' input_length summed
  kPrefillTokenIds,  // element: the id's index in prefill_token_ids, row: its prefill row;
                     // both −1: their count
  kKind,
  kPoolRow,
  kRequestId,
  kInputLength,
  kPrefixLength,
  kPromptLength,
  kDecodeOverride,
  kHistTokenLength,
  kRefreshBegin,
  kRefreshPages,  // element: the index in refresh.pages
  kSampling,      // part: the parameter, when one is out of range
  kMambaWorking,
  kMambaCheckpointDst,
  kMambaCowSrc,
  kMambaBranchingSeqlen,
};

// lockstep's name of the field ("pool_row", "refresh.pages", "prefill_token_ids", ...).
std::string_view to_string(OpField field);

// Where in an op a refusal points: the field, its row (−1: none) and the element of a list field
// (−1: none).
struct OpFieldAt {
  constexpr OpFieldAt(OpField f, int32_t r = -1, int64_t e = -1, std::string_view p = {})
      : field(f), row(r), element(e), part(p) {}
  OpField field;
  int32_t row;
  int64_t element;
  std::string_view part;  // a static string, or empty
};

// A refused forward op. The message names the field in lockstep's words; at() says the same to
// a caller with names of its own (the Python module answers with the seed's FlatForwardOp names).
class OpFieldError : public Error {
 public:
  OpFieldError(const std::string& message, OpFieldAt at) : Error(message), at_(at) {}
  const OpFieldAt& at() const { return at_; }

 private:
  OpFieldAt at_;
};

// LS_REQUIRE for a forward op's field: throws OpFieldError carrying `at`, an OpFieldAt(...).
#define LS_REQUIRE_FIELD(cond, at, ...)                               \
  do {                                                                \
    if (!(cond)) [[unlikely]]                                         \
      throw ::ls::OpFieldError(::fmt::format(__VA_ARGS__), at);       \
  } while (0)

// Checks everything about the op that the host can check without device state. Throws
// OpFieldError naming the field, the row and the limit. `vocab_size` bounds token ids.
void validate_forward_op(const ForwardOp& op, const ExecutorConfig& config, int32_t vocab_size,
                         bool recurrent_state = false);

// validate_forward_op with its bookkeeping sized once from the limits, so that checking an op
// allocates nothing: the executor keeps one and checks every step with it.
class ForwardOpValidator {
 public:
  // `recurrent_state`: the model has Mamba layers, so every row needs a working slot.
  ForwardOpValidator(const ExecutorConfig& config, int32_t vocab_size, bool recurrent_state = false);
  void validate(const ForwardOp& op);

 private:
  void validate_mamba_row(int32_t i, const OpRow& row, bool op_has_prefill);
  // A slot this op writes (a working state, a checkpoint): false when an earlier row writes it.
  bool take_mamba_slot(int32_t slot);
  // Each op draws a new stamp: an entry is taken by this op exactly when it holds the stamp, so
  // nothing is cleared between ops.
  bool take_pool_row(int32_t pool_row);
  bool take_request_id(RequestId id);

  struct IdSlot {
    RequestId id = 0;
    uint64_t stamp = 0;
  };
  ExecutorConfig config_;
  int32_t vocab_size_ = 0;
  bool recurrent_state_ = false;
  uint64_t stamp_ = 0;
  std::vector<uint64_t> mamba_slot_stamps_;  // [mamba_slots_count]
  std::vector<uint64_t> pool_row_stamps_;  // [max_batch_rows + 1]
  std::vector<IdSlot> id_slots_;           // open addressing, a power of two >= 2 · max_batch_rows
  int32_t id_shift_ = 0;                   // 64 − log2(id_slots_.size())
};

}  // namespace ls
