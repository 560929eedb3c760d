#include "core/step_result.h"

#include "core/check.h"

namespace ls {

std::vector<int32_t> StepResult::row_tokens(int32_t row) const {
  const int32_t bs = static_cast<int32_t>(accepted_lengths.size());
  LS_ASSERT(row >= 0 && row < bs, "row {} of {}", row, bs);
  const int32_t begin = row < prefill_rows_count
                            ? row
                            : prefill_rows_count + (row - prefill_rows_count) * verify_width;
  const int32_t count = accepted_lengths[row];
  return {tokens.begin() + begin, tokens.begin() + begin + count};
}

}  // namespace ls
