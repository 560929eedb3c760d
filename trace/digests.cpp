#include "trace/digests.h"

#include "core/check.h"

#include <xxhash.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <utility>

namespace ls::trace {

static_assert(std::endian::native == std::endian::little,
              "trace digests hash the in-memory bytes, which the format defines as little-endian");

uint64_t future_inputs_digest(std::span<const int32_t> ids) {
  return XXH3_64bits(ids.data(), ids.size_bytes());
}

namespace {

int32_t logits_rows_of(const StepResult& result) {
  const int32_t bs = static_cast<int32_t>(result.accepted_lengths.size());
  const int32_t ne = result.prefill_rows_count;
  return ne + (bs - ne) * result.verify_width;
}

// vcl, future-input digests and (speculative decoding) drafts of the step's rows.
void fill_state(StepOutputRecord& out, const StateSnapshot& touched, size_t bs) {
  if (touched.pool_rows.empty()) return;
  LS_ASSERT(touched.pool_rows.size() == bs, "snapshot of {} rows for a step of {} rows",
            touched.pool_rows.size(), bs);
  LS_ASSERT(touched.valid_cache_length.size() == bs, "vcl of {} rows", touched.valid_cache_length.size());
  LS_ASSERT(touched.future_inputs.size() % bs == 0, "future inputs {} for {} rows",
            touched.future_inputs.size(), bs);
  const size_t width = touched.future_inputs.size() / bs;
  out.valid_cache_lengths = touched.valid_cache_length;
  if (width > 1) out.drafts = touched.future_inputs;  // speculative decoding: the next round's drafts
  for (size_t r = 0; r < bs; ++r) {
    out.future_input_digests.push_back(
        future_inputs_digest({touched.future_inputs.data() + r * width, width}));
  }
}

}  // namespace

void fill_step_output(StepOutputRecord& out, int64_t step, const StepResult& result,
                      const StateSnapshot& touched, int32_t top_logits_count) {
  LS_ASSERT(top_logits_count >= 0 && top_logits_count <= kTopLogitsCountMax, "top {}",
            top_logits_count);
  const size_t bs = result.accepted_lengths.size();
  out.step = step;
  out.result.mode = result.mode;
  out.result.prefill_rows_count = result.prefill_rows_count;
  out.result.verify_width = result.verify_width;
  out.result.tokens = result.tokens;
  out.result.accepted_lengths = result.accepted_lengths;
  out.result.logprobs = result.logprobs;
  out.result.nan_flags = result.nan_flags;
  out.result.oov_flags = result.oov_flags;
  out.result.logits.clear();

  out.logits_digests.clear();
  out.top_logits.clear();
  out.top_logits_count = 0;
  if (!result.logits_digests.empty()) {
    LS_ASSERT(result.logits_digests.size() == static_cast<size_t>(logits_rows_of(result)),
              "{} logits digests for {} logits rows", result.logits_digests.size(),
              logits_rows_of(result));
    LS_ASSERT(result.top_logits_count <= top_logits_count || result.top_logits.empty(),
              "the step computed top {} logits, the trace records {}", result.top_logits_count,
              top_logits_count);
    LS_ASSERT(result.top_logits.size() == result.logits_digests.size() *
                                              static_cast<size_t>(result.top_logits_count),
              "{} top logits for {} rows of {}", result.top_logits.size(),
              result.logits_digests.size(), result.top_logits_count);
    out.logits_digests = result.logits_digests;
    out.top_logits = result.top_logits;
    out.top_logits_count = result.top_logits.empty() ? 0 : result.top_logits_count;
  } else if (!result.logits.empty()) {
    const int32_t rows = logits_rows_of(result);
    LS_ASSERT(rows > 0, "logits without logits rows");
    LS_ASSERT(result.logits.size() % static_cast<size_t>(rows) == 0, "logits {} rows {}",
              result.logits.size(), rows);
    const size_t vocab = result.logits.size() / static_cast<size_t>(rows);
    out.top_logits_count = static_cast<int32_t>(std::min<size_t>(top_logits_count, vocab));
    for (int32_t i = 0; i < rows; ++i) {
      const std::span<const float> row(result.logits.data() + static_cast<size_t>(i) * vocab,
                                       vocab);
      out.logits_digests.push_back(logits_row_digest(row));
      append_top_logits(row, out.top_logits_count, out.top_logits);
    }
  }

  out.valid_cache_lengths.clear();
  out.future_input_digests.clear();
  out.drafts.clear();
  fill_state(out, touched.pool_rows.empty() ? result.state : touched, bs);
  LS_ASSERT(result.mamba_state_digests.empty() || result.mamba_state_digests.size() == bs,
            "{} state digests for {} rows", result.mamba_state_digests.size(), bs);
  out.mamba_state_digests = result.mamba_state_digests;
  out.activation_digests = activation_digests(result.activations);
}

StepOutputRecord make_step_output(int64_t step, const StepResult& result,
                                  const StateSnapshot& touched, int32_t top_logits_count) {
  StepOutputRecord out;
  fill_step_output(out, step, result, touched, top_logits_count);
  return out;
}

StepOutputRecord make_step_output(int64_t step, StepResult&& result, const StateSnapshot& touched,
                                  int32_t top_logits_count) {
  return make_step_output(step, std::as_const(result), touched, top_logits_count);
}

}  // namespace ls::trace
