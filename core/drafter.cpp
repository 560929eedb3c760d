#include "core/drafter.h"

#include "core/check.h"

#include <algorithm>

namespace ls {

namespace {

// The start of the most recent earlier occurrence of the last n tokens, or -1.
int32_t last_earlier_match(std::span<const int32_t> h, int32_t n) {
  const int32_t length = static_cast<int32_t>(h.size());
  if (length < n + 1) return -1;
  const std::span<const int32_t> pattern = h.subspan(static_cast<size_t>(length - n));
  for (int32_t start = length - n - 1; start >= 0; --start) {
    if (std::equal(pattern.begin(), pattern.end(), h.begin() + start)) return start;
  }
  return -1;
}

}  // namespace

void NgramDrafter::draft(const DraftContext& context, std::span<int32_t> drafts) const {
  const std::span<const int32_t> h = context.history;
  LS_ASSERT(!h.empty() && h.back() == context.bonus, "history must end with the bonus token");
  std::fill(drafts.begin(), drafts.end(), context.bonus);
  const int32_t length = static_cast<int32_t>(h.size());
  for (int32_t n = kNgramMax; n >= 1; --n) {
    const int32_t start = last_earlier_match(h, n);
    if (start < 0) continue;
    // Token k of the continuation sits at start + n + k of history ++ drafts; that index is always
    // below length + k, so it is either in the history or an earlier draft.
    for (size_t k = 0; k < drafts.size(); ++k) {
      const int32_t at = start + n + static_cast<int32_t>(k);
      drafts[k] = at < length ? h[static_cast<size_t>(at)] : drafts[static_cast<size_t>(at - length)];
    }
    return;
  }
}

std::unique_ptr<Drafter> make_drafter(std::string_view name) {
  if (name.empty() || name == kNoDrafterName) return nullptr;
  if (name == "ngram") return std::make_unique<NgramDrafter>();
  throw Error(fmt::format(
      "drafter '{}' cannot be rebuilt here: only 'none' and 'ngram' are production drafters "
      "(an oracle-mix drafter needs the reference continuations of the simulated run that "
      "recorded it)",
      name));
}

}  // namespace ls
