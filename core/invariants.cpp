#include "core/invariants.h"

#include "core/ops/context_clamp.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cmath>

namespace ls {

namespace {

InvariantViolation violation(const char* invariant, std::string field, int32_t row,
                             std::string detail) {
  return {invariant, std::move(field), row, std::move(detail)};
}

bool is_prefill(const ForwardOp& op, int32_t row) { return op.rows[row].kind == RowKind::kPrefill; }

}  // namespace

std::optional<InvariantViolation> check_output_shape(StepShape shape, const StepResult& result,
                                                     const InvariantLimits& limits) {
  const int32_t bs = shape.rows_count;
  const int32_t ne = shape.prefill_rows_count;
  if (result.accepted_lengths.size() != static_cast<size_t>(bs)) {
    return violation("output_shape", "accepted_lengths", -1,
                     fmt::format("accepted_lengths holds {} entries for {} rows",
                                 result.accepted_lengths.size(), bs));
  }
  const size_t tokens = static_cast<size_t>(ne) + static_cast<size_t>(bs - ne) * limits.verify_width;
  if (result.tokens.size() != tokens) {
    return violation("output_shape", "tokens", -1,
                     fmt::format("tokens holds {} ids, expected ne + nd·W = {}",
                                 result.tokens.size(), tokens));
  }
  return std::nullopt;
}

std::optional<InvariantViolation> check_output_tokens(StepShape shape, const StepResult& result,
                                                      const InvariantLimits& limits) {
  const int32_t ne = shape.prefill_rows_count;
  for (size_t t = 0; t < result.tokens.size(); ++t) {
    const int32_t id = result.tokens[t];
    if (id >= 0 && id < limits.vocab_size) continue;
    const int32_t index = static_cast<int32_t>(t);
    const int32_t row = index < ne ? index : ne + (index - ne) / limits.verify_width;
    return violation("tokens", fmt::format("tokens[{}]", t), row,
                     fmt::format("id {} outside [0, vocab_size = {})", id, limits.vocab_size));
  }
  return std::nullopt;
}

std::optional<InvariantViolation> check_accepted_length(StepShape shape, const StepResult& result,
                                                        int32_t row, const InvariantLimits& limits) {
  const int32_t a = result.accepted_lengths[row];
  const bool prefill = row < shape.prefill_rows_count;
  const int32_t low = prefill ? 1 : 0;
  const int32_t high = prefill ? 1 : limits.verify_width;
  if (a >= low && a <= high) return std::nullopt;
  return violation("accepted_length", fmt::format("accepted_lengths[{}]", row), row,
                   fmt::format("{} outside [{}, {}] (a {} row{})", a, low, high,
                               prefill ? "prefill" : "decode",
                               prefill ? "" : fmt::format(", W = {}", limits.verify_width)));
}

std::optional<InvariantViolation> check_vcl_bound(int32_t row, int32_t vcl_after,
                                                  const InvariantLimits& limits) {
  if (vcl_after >= 0 && vcl_after <= limits.context_length) return std::nullopt;
  return violation("valid_cache_length", fmt::format("valid_cache_lengths[{}]", row), row,
                   fmt::format("{} outside [0, L = {}]", vcl_after, limits.context_length));
}

std::optional<int32_t> commit_start(const ForwardOp& op, int32_t row,
                                    std::optional<int32_t> vcl_before) {
  const OpRow& x = op.rows[row];
  if (x.kind == RowKind::kPrefill) return x.prefix_length;
  if (x.hist_token_length != -1) return x.hist_token_length;
  return vcl_before;
}

std::optional<InvariantViolation> check_context_clamp(const ForwardOp& op, const StepResult& result,
                                                      int32_t row, std::optional<int32_t> start,
                                                      const InvariantLimits& limits) {
  if (is_prefill(op, row) || !start) return std::nullopt;
  const int32_t a = result.accepted_lengths[row];
  if (a <= ops::clamp_accepted_to_context(a, *start, limits.context_length)) return std::nullopt;
  return violation("context_clamp", fmt::format("accepted_lengths[{}]", row), row,
                   fmt::format("accepted {} from vcl {} runs past L = {}", a, *start,
                               limits.context_length));
}

std::optional<InvariantViolation> check_valid_cache_length(const ForwardOp& op,
                                                           const StepResult& result, int32_t row,
                                                           std::optional<int32_t> start,
                                                           int32_t vcl_after,
                                                           const InvariantLimits& limits) {
  if (auto bound = check_vcl_bound(row, vcl_after, limits)) return bound;
  if (!start) return std::nullopt;
  const OpRow& x = op.rows[row];
  const int32_t committed = is_prefill(op, row) ? x.input_length : result.accepted_lengths[row];
  const int32_t expected = *start + committed;
  if (vcl_after == expected) return std::nullopt;
  const char* from = is_prefill(op, row)             ? "prefix"
                     : x.hist_token_length != -1 ? "hist_token_length"
                                                 : "previous vcl";
  return violation("valid_cache_length", fmt::format("valid_cache_lengths[{}]", row), row,
                   fmt::format("{}, expected {} {} + {} {} = {}", vcl_after, from, *start,
                               is_prefill(op, row) ? "input" : "accepted", committed, expected));
}

std::optional<InvariantViolation> check_kv_slot(int32_t row, int32_t index, int32_t position,
                                                int64_t slot, std::span<const int32_t> pages,
                                                const InvariantLimits& limits) {
  const int32_t column = position / limits.page_size;
  const bool held = column < limits.table_width && column < std::ssize(pages);
  const int64_t expected =
      held ? int64_t{pages[column]} * limits.page_size + position % limits.page_size : 0;
  if (slot == expected) return std::nullopt;
  return violation("kv_slot", fmt::format("slots[{}]", index), row,
                   fmt::format("position {} wrote slot {}, expected {} (pages held [{}])",
                               position, slot, expected, fmt::join(pages, ", ")));
}

std::optional<InvariantViolation> check_nan_flag(const StepResult& result, int32_t row,
                                                 const StepFaults& faults) {
  if (result.nan_flags.empty()) return std::nullopt;
  const auto& poisoned_rows = faults.poisoned_rows;
  const bool poisoned = std::isnan(faults.poison_value) &&
                        std::find(poisoned_rows.begin(), poisoned_rows.end(), row) != poisoned_rows.end();
  const bool flagged = result.nan_flags[static_cast<size_t>(row)] != 0;
  if (flagged == poisoned) return std::nullopt;
  return violation("nan_flag", fmt::format("nan_flags[{}]", row), row,
                   fmt::format("flag {} but the step's faults {} this row with NaN", flagged ? 1 : 0,
                               poisoned ? "poisoned" : "did not poison"));
}

}  // namespace ls
