#include "core/forward_op.h"

#include "core/check.h"

#include <algorithm>
#include <bit>

namespace ls {

std::string_view to_string(ForwardMode mode) {
  switch (mode) {
    case ForwardMode::kIdle: return "IDLE";
    case ForwardMode::kExtend: return "EXTEND";
    case ForwardMode::kMixed: return "MIXED";
    case ForwardMode::kDecode: return "DECODE";
  }
  return "?";
}

std::string_view to_string(RowKind kind) {
  return kind == RowKind::kPrefill ? "prefill" : "decode";
}

std::string_view to_string(OpField field) {
  switch (field) {
    case OpField::kRows: return "rows";
    case OpField::kPrefillTokens: return "prefill tokens";
    case OpField::kPrefillTokenIds: return "prefill_token_ids";
    case OpField::kKind: return "kind";
    case OpField::kPoolRow: return "pool_row";
    case OpField::kRequestId: return "request_id";
    case OpField::kInputLength: return "input_length";
    case OpField::kPrefixLength: return "prefix_length";
    case OpField::kPromptLength: return "prompt_length";
    case OpField::kDecodeOverride: return "decode_override";
    case OpField::kHistTokenLength: return "hist_token_length";
    case OpField::kRefreshBegin: return "refresh.begin";
    case OpField::kRefreshPages: return "refresh.pages";
    case OpField::kSampling: return "sampling";
    case OpField::kMambaWorking: return "mamba_working";
    case OpField::kMambaCheckpointDst: return "mamba_checkpoint_dst";
    case OpField::kMambaCowSrc: return "mamba_cow_src";
    case OpField::kMambaBranchingSeqlen: return "mamba_branching_seqlen";
  }
  return "?";
}

ForwardMode forward_mode_of(int32_t prefill_rows_count, int32_t rows_count) {
  if (rows_count <= 0) return ForwardMode::kIdle;
  if (prefill_rows_count == rows_count) return ForwardMode::kExtend;
  if (prefill_rows_count == 0) return ForwardMode::kDecode;
  return ForwardMode::kMixed;
}

int32_t ForwardOp::prefill_rows_count() const {
  int32_t count = 0;
  for (const OpRow& row : rows) count += row.kind == RowKind::kPrefill ? 1 : 0;
  return count;
}

namespace {

// Every message starts with "forward op row R (request ID, kind)" so a user can find the row.
std::string where(int32_t row_index, const OpRow& row) {
  return fmt::format("forward op row {} (request {}, {})", row_index, row.request_id,
                     to_string(row.kind));
}

// The first recurrent-state field given (not −1): what a row of a model without Mamba layers
// should not have given.
OpField first_mamba_field(const OpRow& row) {
  if (row.mamba_working != -1) return OpField::kMambaWorking;
  if (row.mamba_checkpoint_dst != -1) return OpField::kMambaCheckpointDst;
  if (row.mamba_cow_src != -1) return OpField::kMambaCowSrc;
  return OpField::kMambaBranchingSeqlen;
}

void validate_refresh(int32_t i, const OpRow& row, const ExecutorConfig& config) {
  LS_REQUIRE_FIELD(row.refresh.begin >= 0, OpFieldAt(OpField::kRefreshBegin, i),
                   "{}: refresh.begin must be >= 0, got {}", where(i, row), row.refresh.begin);
  for (size_t j = 0; j < row.refresh.pages.size(); ++j) {
    const int32_t page = row.refresh.pages[j];
    LS_REQUIRE_FIELD(
        page >= 1 && page < config.pages_count,
        OpFieldAt(OpField::kRefreshPages, i, static_cast<int64_t>(j)),
        "{}: refresh.pages[{}] = {} is out of range [1, pages_count = {}) (page 0 is the "
        "dummy page)",
        where(i, row), j, page, config.pages_count);
  }
}

void validate_prefill_row(int32_t i, const OpRow& row, const ExecutorConfig& config) {
  LS_REQUIRE_FIELD(row.input_length >= 1, OpFieldAt(OpField::kInputLength, i),
                   "{}: input_length must be >= 1, got {}", where(i, row), row.input_length);
  LS_REQUIRE_FIELD(row.input_length <= config.prefill_chunk_tokens,
                   OpFieldAt(OpField::kInputLength, i),
                   "{}: input_length {} exceeds prefill_chunk_tokens = {}", where(i, row),
                   row.input_length, config.prefill_chunk_tokens);
  LS_REQUIRE_FIELD(row.prefix_length >= 0, OpFieldAt(OpField::kPrefixLength, i),
                   "{}: prefix_length must be >= 0, got {}", where(i, row), row.prefix_length);
  const int64_t end = int64_t{row.prefix_length} + row.input_length;
  LS_REQUIRE_FIELD(end <= config.context_length, OpFieldAt(OpField::kPrefixLength, i),
                   "{}: prefix_length {} + input_length {} = {} exceeds context_length L = {}",
                   where(i, row), row.prefix_length, row.input_length, end, config.context_length);
  LS_REQUIRE_FIELD(row.prompt_length >= end, OpFieldAt(OpField::kPromptLength, i),
                   "{}: prompt_length {} is shorter than prefix_length + input_length = {}",
                   where(i, row), row.prompt_length, end);
  LS_REQUIRE_FIELD(row.prompt_length <= config.context_length, OpFieldAt(OpField::kPromptLength, i),
                   "{}: prompt_length {} exceeds context_length L = {}", where(i, row),
                   row.prompt_length, config.context_length);
  LS_REQUIRE_FIELD(row.decode_override == -1, OpFieldAt(OpField::kDecodeOverride, i),
                   "{}: decode_override must be -1 on a prefill row, got {}", where(i, row),
                   row.decode_override);
  LS_REQUIRE_FIELD(row.hist_token_length == -1, OpFieldAt(OpField::kHistTokenLength, i),
                   "{}: hist_token_length must be -1 on a prefill row, got {}", where(i, row),
                   row.hist_token_length);
}

void validate_decode_row(int32_t i, const OpRow& row, const ExecutorConfig& config,
                         int32_t vocab_size) {
  LS_REQUIRE_FIELD(row.input_length == config.verify_width, OpFieldAt(OpField::kInputLength, i),
                   "{}: input_length must equal the verify width W = {}, got {}", where(i, row),
                   config.verify_width, row.input_length);
  LS_REQUIRE_FIELD(
      row.prefix_length == 0 && row.prompt_length == 0,
      OpFieldAt(row.prefix_length != 0 ? OpField::kPrefixLength : OpField::kPromptLength, i),
      "{}: prefix_length and prompt_length must be 0 on a decode row, got {} and {}", where(i, row),
      row.prefix_length, row.prompt_length);
  LS_REQUIRE_FIELD(row.decode_override >= -1 && row.decode_override < vocab_size,
                   OpFieldAt(OpField::kDecodeOverride, i),
                   "{}: decode_override {} is outside [0, vocab_size = {}) and is not -1",
                   where(i, row), row.decode_override, vocab_size);
  LS_REQUIRE_FIELD(row.hist_token_length >= -1 && row.hist_token_length <= config.context_length,
                   OpFieldAt(OpField::kHistTokenLength, i),
                   "{}: hist_token_length {} is outside [0, context_length L = {}] and is not -1",
                   where(i, row), row.hist_token_length, config.context_length);
  LS_REQUIRE_FIELD(
      row.hist_token_length == -1 || row.decode_override != -1,
      OpFieldAt(OpField::kHistTokenLength, i),
      "{}: a recovered row (hist_token_length {}) needs a decode_override with its last "
      "token",
      where(i, row), row.hist_token_length);
}

}  // namespace

void validate_forward_op(const ForwardOp& op, const ExecutorConfig& config, int32_t vocab_size,
                         bool recurrent_state) {
  ForwardOpValidator(config, vocab_size, recurrent_state).validate(op);
}

ForwardOpValidator::ForwardOpValidator(const ExecutorConfig& config, int32_t vocab_size,
                                       bool recurrent_state)
    : config_(config), vocab_size_(vocab_size), recurrent_state_(recurrent_state) {
  mamba_slot_stamps_.assign(static_cast<size_t>(std::max(config.mamba_slots_count, 0)), 0);
  pool_row_stamps_.assign(static_cast<size_t>(std::max(config.max_batch_rows, 0)) + 1, 0);
  const auto slots = std::bit_ceil(2 * static_cast<uint64_t>(std::max(config.max_batch_rows, 1)));
  id_slots_.assign(slots, IdSlot{});
  id_shift_ = 64 - std::countr_zero(slots);
}

bool ForwardOpValidator::take_pool_row(int32_t pool_row) {
  uint64_t& stamp = pool_row_stamps_[static_cast<size_t>(pool_row)];
  if (stamp == stamp_) return false;
  stamp = stamp_;
  return true;
}

bool ForwardOpValidator::take_mamba_slot(int32_t slot) {
  uint64_t& stamp = mamba_slot_stamps_[static_cast<size_t>(slot)];
  if (stamp == stamp_) return false;
  stamp = stamp_;
  return true;
}

// The recurrent-state fields of one row (seed spec §4 invariant 6): each −1 or a slot in
// [0, mamba_slots_count); a working slot on every row of a model with Mamba layers and on none
// otherwise; no slot written by two rows (working slots and checkpoints alike); a copy-on-write
// source with its branching length, which is the row's prefix (prefill) or its recovered KV
// length (decode); checkpoints on decode rows only in DECODE steps (the seed snapshots no decode
// row of a MIXED step), on prefill rows only where the chunk ends a page.
void ForwardOpValidator::validate_mamba_row(int32_t i, const OpRow& row, bool op_has_prefill) {
  const int32_t slots = config_.mamba_slots_count;
  const auto check_slot = [&](int32_t slot, OpField field, const char* name) {
    LS_REQUIRE_FIELD(slot == -1 || (slot >= 0 && slot < slots), OpFieldAt(field, i),
                     "{}: {} {} is outside [0, mamba_slots_count = {}) and is not -1",
                     where(i, row), name, slot, slots);
  };
  check_slot(row.mamba_working, OpField::kMambaWorking, "mamba_working_index");
  check_slot(row.mamba_checkpoint_dst, OpField::kMambaCheckpointDst, "mamba_checkpoint_dst_index");
  check_slot(row.mamba_cow_src, OpField::kMambaCowSrc, "mamba_cow_src_index");
  if (!recurrent_state_) {
    LS_REQUIRE_FIELD(row.mamba_working == -1 && row.mamba_checkpoint_dst == -1 &&
                         row.mamba_cow_src == -1 && row.mamba_branching_seqlen == -1,
                     OpFieldAt(first_mamba_field(row), i),
                     "{}: the model has no Mamba layers, so the mamba fields must be -1 (working "
                     "{}, checkpoint_dst {}, cow_src {}, branching_seqlen {})",
                     where(i, row), row.mamba_working, row.mamba_checkpoint_dst, row.mamba_cow_src,
                     row.mamba_branching_seqlen);
    return;
  }
  LS_REQUIRE_FIELD(row.mamba_working != -1, OpFieldAt(OpField::kMambaWorking, i),
                   "{}: mamba_working_index is -1, but the model has Mamba layers: every row "
                   "needs its working state slot",
                   where(i, row));
  LS_REQUIRE_FIELD(take_mamba_slot(row.mamba_working), OpFieldAt(OpField::kMambaWorking, i),
                   "{}: mamba_working_index {} is written by an earlier row of the same op (two "
                   "live requests would share a state)",
                   where(i, row), row.mamba_working);
  if (row.mamba_checkpoint_dst != -1) {
    if (row.kind == RowKind::kPrefill) {
      const int32_t end = row.prefix_length + row.input_length;
      LS_REQUIRE_FIELD(
          end % config_.page_size == 0, OpFieldAt(OpField::kMambaCheckpointDst, i),
          "{}: mamba_checkpoint_dst_index {} on a prefill "
          "chunk that ends at {}, inside a page (page_size {}): a prefill row's checkpoint "
          "is the state at its chunk's end, which must end a page",
          where(i, row), row.mamba_checkpoint_dst, end, config_.page_size);
    }
    LS_REQUIRE_FIELD(
        row.kind == RowKind::kPrefill || !op_has_prefill,
        OpFieldAt(OpField::kMambaCheckpointDst, i),
        "{}: mamba_checkpoint_dst_index "
        "{} on a decode row in a step with prefill rows: decode rows snapshot in DECODE "
        "steps only",
        where(i, row), row.mamba_checkpoint_dst);
    LS_REQUIRE_FIELD(
        row.mamba_checkpoint_dst == row.mamba_working || take_mamba_slot(row.mamba_checkpoint_dst),
        OpFieldAt(OpField::kMambaCheckpointDst, i),
        "{}: mamba_checkpoint_dst_index {} is written by an earlier row of the same op",
        where(i, row), row.mamba_checkpoint_dst);
  }
  LS_REQUIRE_FIELD(row.mamba_cow_src == -1 || row.mamba_cow_src != row.mamba_working,
                   OpFieldAt(OpField::kMambaCowSrc, i),
                   "{}: mamba_cow_src_index {} is the row's own working slot", where(i, row),
                   row.mamba_cow_src);
  LS_REQUIRE_FIELD((row.mamba_cow_src == -1) == (row.mamba_branching_seqlen == -1),
                   OpFieldAt(OpField::kMambaCowSrc, i),
                   "{}: mamba_cow_src_index {} and mamba_branching_seqlen {} must be -1 together",
                   where(i, row), row.mamba_cow_src, row.mamba_branching_seqlen);
  if (row.mamba_cow_src == -1) return;
  const bool prefill = row.kind == RowKind::kPrefill;
  LS_REQUIRE_FIELD(prefill || row.hist_token_length != -1, OpFieldAt(OpField::kMambaCowSrc, i),
                   "{}: mamba_cow_src_index {} on a decode row "
                   "that is not recovering (hist_token_length -1)",
                   where(i, row), row.mamba_cow_src);
  const int32_t covered = prefill ? row.prefix_length : row.hist_token_length;
  LS_REQUIRE_FIELD(
      row.mamba_branching_seqlen == covered, OpFieldAt(OpField::kMambaBranchingSeqlen, i),
      "{}: mamba_branching_seqlen {} differs from the {} {} the copied state must cover",
      where(i, row), row.mamba_branching_seqlen, prefill ? "prefix_length" : "hist_token_length",
      covered);
}

bool ForwardOpValidator::take_request_id(RequestId id) {
  // Fibonacci hashing, then linear probing: an op holds at most B ids in 2·B slots or more.
  const size_t mask = id_slots_.size() - 1;
  for (size_t h = static_cast<size_t>((id * 0x9E3779B97F4A7C15ull) >> id_shift_);;
       h = (h + 1) & mask) {
    IdSlot& slot = id_slots_[h];
    if (slot.stamp != stamp_) {
      slot = IdSlot{id, stamp_};
      return true;
    }
    if (slot.id == id) return false;
  }
}

void ForwardOpValidator::validate(const ForwardOp& op) {
  const ExecutorConfig& config = config_;
  const int32_t vocab_size = vocab_size_;
  ++stamp_;
  const int32_t bs = op.rows_count();
  LS_REQUIRE_FIELD(bs <= config.max_batch_rows, OpFieldAt(OpField::kRows),
                   "forward op: {} rows exceed max_batch_rows B = {}", bs, config.max_batch_rows);
  int64_t prefill_tokens = 0;
  bool seen_decode = false;
  const bool has_prefill = bs > 0 && op.rows[0].kind == RowKind::kPrefill;
  for (int32_t i = 0; i < bs; ++i) {
    const OpRow& row = op.rows[i];
    LS_REQUIRE_FIELD(
        row.kind == RowKind::kPrefill || row.kind == RowKind::kDecode, OpFieldAt(OpField::kKind, i),
        "forward op row {}: kind {} is neither prefill nor decode", i, static_cast<int>(row.kind));
    LS_REQUIRE_FIELD(!(seen_decode && row.kind == RowKind::kPrefill), OpFieldAt(OpField::kKind, i),
                     "{}: prefill rows must come first, but this prefill row follows a decode row",
                     where(i, row));
    seen_decode = seen_decode || row.kind == RowKind::kDecode;
    LS_REQUIRE_FIELD(row.pool_row >= 1 && row.pool_row <= config.max_batch_rows,
                     OpFieldAt(OpField::kPoolRow, i),
                     "{}: pool_row {} is unknown: pool rows are 1..max_batch_rows = {}",
                     where(i, row), row.pool_row, config.max_batch_rows);
    LS_REQUIRE_FIELD(take_pool_row(row.pool_row), OpFieldAt(OpField::kPoolRow, i),
                     "{}: pool_row {} is used by an earlier row of the same op", where(i, row),
                     row.pool_row);
    LS_REQUIRE_FIELD(take_request_id(row.request_id), OpFieldAt(OpField::kRequestId, i),
                     "{}: request id {} appears in an earlier row of the same op", where(i, row),
                     row.request_id);
    validate_refresh(i, row, config);
    validate_mamba_row(i, row, has_prefill);
    if (row.sampling) {
      if (const auto refused = row.sampling->refusal()) {
        throw OpFieldError(fmt::format("{}: {}", where(i, row), refused->second),
                           OpFieldAt(OpField::kSampling, i, -1, refused->first));
      }
    }
    if (row.kind == RowKind::kPrefill) {
      validate_prefill_row(i, row, config);
      prefill_tokens += row.input_length;
    } else {
      validate_decode_row(i, row, config, vocab_size);
    }
  }
  LS_REQUIRE_FIELD(prefill_tokens <= config.prefill_chunk_tokens,
                   OpFieldAt(OpField::kPrefillTokens),
                   "forward op: {} prefill tokens exceed prefill_chunk_tokens = {}", prefill_tokens,
                   config.prefill_chunk_tokens);
  LS_REQUIRE_FIELD(
      static_cast<int64_t>(op.prefill_token_ids.size()) == prefill_tokens,
      OpFieldAt(OpField::kPrefillTokenIds),
      "forward op: prefill_token_ids holds {} ids but the prefill rows' input_length sum "
      "to {}",
      op.prefill_token_ids.size(), prefill_tokens);
  int64_t offset = 0;
  for (int32_t i = 0; i < bs && op.rows[i].kind == RowKind::kPrefill; ++i) {
    for (int32_t t = 0; t < op.rows[i].input_length; ++t) {
      const int32_t id = op.prefill_token_ids[offset + t];
      LS_REQUIRE_FIELD(id >= 0 && id < vocab_size,
                       OpFieldAt(OpField::kPrefillTokenIds, i, offset + t),
                       "{}: token id {} at chunk position {} (prefill_token_ids[{}]) is outside "
                       "[0, vocab_size = {})",
                       where(i, op.rows[i]), id, t, offset + t, vocab_size);
    }
    offset += op.rows[i].input_length;
  }
}

}  // namespace ls
