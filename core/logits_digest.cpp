#include "core/logits_digest.h"

#include "core/check.h"

#include <algorithm>

namespace ls {

uint64_t logits_row_digest(std::span<const float> row) {
  uint32_t a = 0;
  uint32_t b = 0;
  for (size_t i = 0; i < row.size(); ++i) {
    const uint32_t bits = digest::bits_of(row[i]);
    a += digest::lane_a(bits, static_cast<uint32_t>(i));
    b += digest::lane_b(bits, static_cast<uint32_t>(i));
  }
  return digest::finish(a, b, static_cast<uint32_t>(row.size()));
}

void append_top_logits(std::span<const float> row, int32_t count, std::vector<TopLogit>& out) {
  LS_ASSERT(count >= 0 && count <= kTopLogitsCountMax, "count {}", count);
  const size_t k = std::min(static_cast<size_t>(count), row.size());
  uint64_t best[kTopLogitsCountMax];
  size_t held = 0;
  // Insertion into a sorted array of at most 8: one comparison per logit in the common case.
  for (size_t v = 0; v < row.size(); ++v) {
    const uint64_t key = digest::rank_key(digest::bits_of(row[v]), static_cast<int32_t>(v));
    if (held == k && (k == 0 || key <= best[k - 1])) continue;
    size_t at = held < k ? held++ : k - 1;
    while (at > 0 && key > best[at - 1]) {
      best[at] = best[at - 1];
      --at;
    }
    best[at] = key;
  }
  for (size_t j = 0; j < held; ++j) {
    const int32_t id = static_cast<int32_t>(~static_cast<uint32_t>(best[j]));
    out.push_back(TopLogit{id, row[static_cast<size_t>(id)]});
  }
}

}  // namespace ls
