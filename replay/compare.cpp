#include "replay/compare.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <cstring>

namespace ls::replay {

namespace {

// Where each op row's outputs and logits rows sit: one for a prefill row, W for a decode row.
struct RowSpan {
  size_t begin = 0;
  size_t count = 0;
};

RowSpan outputs_of(const ForwardOp& op, int32_t row, int32_t width) {
  const int32_t ne = op.prefill_rows_count();
  if (row < ne) return {static_cast<size_t>(row), 1};
  return {static_cast<size_t>(ne + (row - ne) * width), static_cast<size_t>(width)};
}

template <typename T>
std::string slice(const std::vector<T>& v, RowSpan s) {
  if (s.begin + s.count > v.size()) return fmt::format("<missing: {} values>", v.size());
  return fmt::format("[{}]", fmt::join(v.begin() + static_cast<ptrdiff_t>(s.begin),
                                       v.begin() + static_cast<ptrdiff_t>(s.begin + s.count), ", "));
}

std::string hex_slice(const std::vector<uint64_t>& v, RowSpan s) {
  if (s.begin + s.count > v.size()) return fmt::format("<missing: {} values>", v.size());
  std::vector<std::string> parts;
  for (size_t i = s.begin; i < s.begin + s.count; ++i) parts.push_back(fmt::format("{:016x}", v[i]));
  return fmt::format("[{}]", fmt::join(parts, ", "));
}

// Compares bits, so NaN logprobs compare equal to themselves and −0 differs from +0.
template <typename T>
bool same_bits(const std::vector<T>& a, const std::vector<T>& b, RowSpan s) {
  if (a.size() != b.size()) return false;
  if (s.begin + s.count > a.size()) return true;  // both short the same way: caught by shape checks
  return std::memcmp(a.data() + s.begin, b.data() + s.begin, s.count * sizeof(T)) == 0;
}

// Top-k pairs bit for bit (the logit's bits: NaN equals itself, −0 differs from +0).
bool same_top(const std::vector<trace::TopLogit>& a, const std::vector<trace::TopLogit>& b,
              RowSpan s) {
  if (a.size() != b.size()) return false;
  if (s.begin + s.count > a.size()) return true;  // both short the same way: caught by shape checks
  for (size_t i = s.begin; i < s.begin + s.count; ++i) {
    if (a[i].id != b[i].id || std::memcmp(&a[i].logit, &b[i].logit, sizeof(float)) != 0) return false;
  }
  return true;
}

std::string top_slice(const std::vector<trace::TopLogit>& v, RowSpan s) {
  if (s.begin + s.count > v.size()) return fmt::format("<missing: {} pairs>", v.size());
  std::vector<std::string> parts;
  for (size_t i = s.begin; i < s.begin + s.count; ++i) {
    parts.push_back(fmt::format("{}:{}", v[i].id, v[i].logit));
  }
  return fmt::format("[{}]", fmt::join(parts, ", "));
}

}  // namespace

std::string Divergence::describe() const {
  return fmt::format("step {}, request {} (op row {}), field {}: expected {}, actual {}", step,
                     request_id, row, field, expected, actual);
}

std::optional<Divergence> first_divergence(const ForwardOp& op, const trace::StepOutputRecord& e,
                                           const trace::StepOutputRecord& a) {
  const int32_t width = e.result.verify_width;
  for (int32_t row = 0; row < op.rows_count(); ++row) {
    const RowSpan out = outputs_of(op, row, width);
    const RowSpan one{static_cast<size_t>(row), 1};
    auto diverged = [&](const char* field, std::string expected, std::string actual) {
      return Divergence{e.step, op.rows[row].request_id, row, field, std::move(expected), std::move(actual)};
    };
    if (!same_bits(e.result.tokens, a.result.tokens, out)) {
      return diverged("tokens", slice(e.result.tokens, out), slice(a.result.tokens, out));
    }
    if (!same_bits(e.result.accepted_lengths, a.result.accepted_lengths, one)) {
      return diverged("accepted_length", slice(e.result.accepted_lengths, one), slice(a.result.accepted_lengths, one));
    }
    if (!same_bits(e.result.nan_flags, a.result.nan_flags, one)) {
      return diverged("nan_flag", slice(e.result.nan_flags, one), slice(a.result.nan_flags, one));
    }
    if (!same_bits(e.result.oov_flags, a.result.oov_flags, one)) {
      return diverged("oov_flag", slice(e.result.oov_flags, one), slice(a.result.oov_flags, one));
    }
    if (!e.logits_digests.empty() && !same_bits(e.logits_digests, a.logits_digests, out)) {
      return diverged("logits_digest", hex_slice(e.logits_digests, out), hex_slice(a.logits_digests, out));
    }
    if (!e.valid_cache_lengths.empty() && !same_bits(e.valid_cache_lengths, a.valid_cache_lengths, one)) {
      return diverged("valid_cache_length", slice(e.valid_cache_lengths, one), slice(a.valid_cache_lengths, one));
    }
    const RowSpan drafts{static_cast<size_t>(row) * static_cast<size_t>(width), static_cast<size_t>(width)};
    if (!e.drafts.empty() && !same_bits(e.drafts, a.drafts, drafts)) {
      return diverged("drafts", slice(e.drafts, drafts), slice(a.drafts, drafts));
    }
    if (!e.future_input_digests.empty() && !same_bits(e.future_input_digests, a.future_input_digests, one)) {
      return diverged("future_input_digest", hex_slice(e.future_input_digests, one),
                      hex_slice(a.future_input_digests, one));
    }
    if (!e.mamba_state_digests.empty() &&
        !same_bits(e.mamba_state_digests, a.mamba_state_digests, one)) {
      return diverged("mamba_state_digest", hex_slice(e.mamba_state_digests, one),
                      hex_slice(a.mamba_state_digests, one));
    }
    const size_t k = static_cast<size_t>(e.top_logits_count);
    const RowSpan top{out.begin * k, out.count * k};
    if (!e.top_logits.empty() && !same_top(e.top_logits, a.top_logits, top)) {
      return diverged("top_logits", top_slice(e.top_logits, top), top_slice(a.top_logits, top));
    }
    if (!e.result.logprobs.empty() && !same_bits(e.result.logprobs, a.result.logprobs, out)) {
      return diverged("logprobs", slice(e.result.logprobs, out), slice(a.result.logprobs, out));
    }
  }
  return std::nullopt;
}

}  // namespace ls::replay
