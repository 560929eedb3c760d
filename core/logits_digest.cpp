#include "core/logits_digest.h"

#include "core/check.h"

#include <algorithm>
#include <cmath>
#include <limits>

namespace ls {

// Cloned for AVX-512 and AVX2 (dispatched at load time): the loop vectorises there with 16 or 8
// lanes of 32-bit multiplies, which x86-64's baseline SSE2 lacks (0.31 → 0.21 µs a 512-logit row
// of `tiny` with AVX-512 on this machine). The sums are exact whatever the lane order.
[[gnu::target_clones("arch=x86-64-v4", "avx2", "default")]] uint64_t logits_row_digest(
    std::span<const float> row) {
  const float* x = row.data();
  const uint32_t n = static_cast<uint32_t>(row.size());
  uint32_t a = 0;
  uint32_t b = 0;
  for (uint32_t i = 0; i < n; ++i) {
    uint32_t bits;
    std::memcpy(&bits, x + i, sizeof bits);
    a += digest::lane_a(bits, i);
    b += digest::lane_b(bits, i);
  }
  return digest::finish(a, b, n);
}

namespace {

// The k best of `row` as rank keys, best first, in `best`; returns how many are held.
struct TopKeys {
  uint64_t best[kTopLogitsCountMax];
  size_t held = 0;
  size_t k = 0;
  // Once k are held, a logit enters only if it is strictly greater than the k-th (a tie has a
  // higher id, so it ranks after); while the k-th is NaN, any number enters.
  float threshold = 0.0f;
  bool threshold_nan = false;

  bool may_enter(float x) const {
    return held < k || (threshold_nan ? !std::isnan(x) : x > threshold);
  }
  void insert(std::span<const float> row, size_t v) {
    const uint64_t key = digest::rank_key(digest::bits_of(row[v]), static_cast<int32_t>(v));
    if (held == k && key <= best[k - 1]) return;
    size_t at = held < k ? held++ : k - 1;
    while (at > 0 && key > best[at - 1]) {
      best[at] = best[at - 1];
      --at;
    }
    best[at] = key;
    if (held == k) {
      const float kth = row[static_cast<uint32_t>(~static_cast<uint32_t>(best[k - 1]))];
      threshold_nan = std::isnan(kth);
      threshold = kth;
    }
  }
};

// The fast path works on chunks of kChunk logits viewed as rows of kColumns. Column maxima (an
// elementwise max over contiguous rows: it vectorises) give a lower bound on the chunk's k-th
// largest logit; a logit below it is not among the chunk's k best, so a block of kTestBlock
// with none at or above it is skipped by one vectorised test and only the few logits that pass are
// ranked exactly.
constexpr size_t kColumns = 64;
constexpr size_t kChunk = 4096;
// Candidates of a chunk ranked by counting (count² comparisons); more are inserted one by one.
constexpr size_t kRankedMax = 64;

// Column maxima of x[0, n) into `maxima` (NaN ignored); returns whether a NaN was seen.
bool column_maxima(const float* x, size_t n, float* maxima) {
  for (size_t c = 0; c < kColumns; ++c) maxima[c] = -std::numeric_limits<float>::infinity();
  int32_t nan = 0;
  size_t r = 0;
  for (; r + kColumns <= n; r += kColumns) {
    for (size_t c = 0; c < kColumns; ++c) {
      maxima[c] = x[r + c] > maxima[c] ? x[r + c] : maxima[c];
      nan |= x[r + c] != x[r + c] ? 1 : 0;
    }
  }
  for (size_t c = 0; r + c < n; ++c) {
    maxima[c] = x[r + c] > maxima[c] ? x[r + c] : maxima[c];
    nan |= x[r + c] != x[r + c] ? 1 : 0;
  }
  return nan != 0;
}

// A lower bound on the k-th largest value of the chunk, from its column maxima, without a
// selection: split the columns into k groups; each group's maximum is a distinct element of the
// chunk, so at least k elements are >= the least of them. Branch-free (it vectorises), and
// tight enough that only a few logits a row pass it.
float kth_lower_bound(const float* maxima, size_t k) {
  float bound = std::numeric_limits<float>::infinity();
  for (size_t g = 0; g < k; ++g) {
    float group = -std::numeric_limits<float>::infinity();
    for (size_t c = g * kColumns / k; c < (g + 1) * kColumns / k; ++c) {
      group = maxima[c] > group ? maxima[c] : group;
    }
    bound = group < bound ? group : bound;
  }
  return bound;
}

// The k-th largest column maximum, the tightest such bound: a column whose maximum is below it
// holds none of the chunk's k best. Only the maxima at or above the loose bound (at least k are:
// the groups' maxima; typically not many more) are gathered, then the least of them that fewer
// than k exceed is counted out — no branch depends on the logits (they mispredict half the time).
float kth_column_maximum(const float* maxima, size_t k, float loose) {
  float reaching[kColumns];
  size_t count = 0;
  for (size_t c = 0; c < kColumns; ++c) {
    reaching[count] = maxima[c];
    count += maxima[c] >= loose ? 1 : 0;
  }
  float bound = std::numeric_limits<float>::infinity();
  for (size_t i = 0; i < count; ++i) {
    size_t above = 0;
    for (size_t j = 0; j < count; ++j) above += reaching[j] > reaching[i] ? 1 : 0;
    bound = above < k && reaching[i] < bound ? reaching[i] : bound;
  }
  return bound;
}

// One chunk: the plain ascending scan when it holds a NaN (NaN ranks last and maxima ignore it)
// or is too short to have more columns than k; otherwise only the columns whose maximum reaches
// the k-th largest column maximum are scanned, their logits at or above it gathered without a
// branch on the logits, and only those ranked exactly (ids out of ascending order: a tie may
// still rank first, so >=; insert() compares the exact keys).
void chunk_top(std::span<const float> row, size_t begin, size_t n, TopKeys& top) {
  float maxima[kColumns];
  if (n < kColumns * 2 || top.k >= kColumns || column_maxima(row.data() + begin, n, maxima)) {
    for (size_t v = begin; v < begin + n; ++v) {
      if (top.may_enter(row[v])) top.insert(row, v);
    }
    return;
  }
  const float bound = kth_column_maximum(maxima, top.k, kth_lower_bound(maxima, top.k));
  const float* x = row.data();
  uint32_t gathered[kChunk];
  size_t count = 0;
  for (size_t c = 0; c < kColumns; ++c) {
    if (!(maxima[c] >= bound)) continue;
    for (size_t v = begin + c; v < begin + n; v += kColumns) {
      gathered[count] = static_cast<uint32_t>(v);
      count += x[v] >= bound ? 1 : 0;
    }
  }
  if (count > kRankedMax) {  // many equal logits at the bound: one by one
    for (size_t i = 0; i < count; ++i) top.insert(row, gathered[i]);
    return;
  }
  // Each candidate's rank is the number of candidates above it (keys are distinct): counted, so
  // no branch depends on the logits; the chunk's k best then enter `top` best first.
  uint64_t keys[kRankedMax];
  for (size_t i = 0; i < count; ++i) {
    keys[i] = digest::rank_key(digest::bits_of(x[gathered[i]]), static_cast<int32_t>(gathered[i]));
  }
  uint32_t ranked[kTopLogitsCountMax + 1];  // slot k takes every rank past the k best
  for (size_t i = 0; i < count; ++i) {
    size_t rank = 0;
    for (size_t j = 0; j < count; ++j) rank += keys[j] > keys[i] ? 1 : 0;
    ranked[rank < top.k ? rank : top.k] = gathered[i];
  }
  for (size_t r = 0; r < std::min(count, top.k); ++r) top.insert(row, ranked[r]);
}

}  // namespace

void append_top_logits(std::span<const float> row, int32_t count, std::vector<TopLogit>& out) {
  LS_ASSERT(count >= 0 && count <= kTopLogitsCountMax, "count {}", count);
  TopKeys top;
  top.k = std::min(static_cast<size_t>(count), row.size());
  if (top.k == 0) return;
  for (size_t begin = 0; begin < row.size(); begin += kChunk) {
    chunk_top(row, begin, std::min(kChunk, row.size() - begin), top);
  }
  for (size_t j = 0; j < top.held; ++j) {
    const int32_t id = static_cast<int32_t>(~static_cast<uint32_t>(top.best[j]));
    out.push_back(TopLogit{id, row[static_cast<size_t>(id)]});
  }
}

}  // namespace ls
