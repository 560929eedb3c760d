// The top-k of a logits row (core/logits_digest.h defines the order). A row is taken in chunks of
// kChunk logits; a chunk's k best are found from a lower bound on its k-th largest value, so that
// only the few logits at or above it are ranked exactly. Two implementations of the bound and the
// gather give the same pairs (the candidates are ranked by their exact keys, whatever order they
// are gathered in): a portable one, and on CPUs with AVX-512 one that takes 16 logits an
// instruction — the recorder ranks every logits row of every step, and on a small model that
// cost is a visible part of the step (issue 12: `tiny`'s 512-logit rows).
#include "core/avx512.h"
#include "core/logits_avx512.h"
#include "core/check.h"
#include "core/logits_digest.h"

#include <algorithm>
#include <cmath>
#include <limits>

namespace ls {
namespace {

// The k best of `row` seen so far as rank keys, best first: best[0, held).
struct TopKeys {
  uint64_t best[kTopLogitsCountMax];
  size_t held = 0;
  size_t k = 0;
  // Once k are held, a logit enters only if it is strictly greater than the k-th (a tie has a
  // higher id, so it ranks after); while the k-th is NaN, any number enters.
  float threshold = 0.0f;
  bool threshold_nan = false;
  uint32_t* gathered = nullptr;  // a chunk's candidates (gather_buffer(): room for kChunk + 16)

  bool may_enter(float x) const {
    return held < k || (threshold_nan ? !std::isnan(x) : x > threshold);
  }
  void insert(std::span<const float> row, size_t v) {
    insert_key(row, digest::rank_key(digest::bits_of(row[v]), static_cast<int32_t>(v)));
  }
  void insert_key(std::span<const float> row, uint64_t key) {
    if (held == k && key <= best[k - 1]) return;
    size_t at = held < k ? held++ : k - 1;
    while (at > 0 && key > best[at - 1]) {
      best[at] = best[at - 1];
      --at;
    }
    best[at] = key;
    if (held == k) set_threshold(row);
  }
  void set_threshold(std::span<const float> row) {
    const float kth = row[static_cast<uint32_t>(~static_cast<uint32_t>(best[k - 1]))];
    threshold_nan = std::isnan(kth);
    threshold = kth;
  }
};

// A chunk of kChunk logits is viewed as rows of kColumns. Column maxima (an elementwise max over
// contiguous rows: it vectorises) give a lower bound on the chunk's k-th largest logit: a logit
// below the k-th largest column maximum is not among the chunk's k best.
constexpr size_t kColumns = 64;
constexpr size_t kChunk = 4096;
// Candidates of a chunk ranked by counting (count² comparisons); more are inserted one by one.
constexpr size_t kRankedMax = 64;
// Room for a vector store of 16 lanes past the last candidate.
constexpr size_t kGatherSlack = 16;

// Where a chunk's candidates are gathered: not on the stack, where a frame of 16 KiB cost more
// than the ranking (its pages are probed on every call).
uint32_t* gather_buffer() {
  static thread_local uint32_t buffer[kChunk + kGatherSlack];
  return buffer;
}

// A chunk's `best` best keys, ranked (best first), into `top` (the first chunk's become `top` as
// they are).
[[gnu::always_inline]] inline void take_ranked(std::span<const float> row, const uint64_t* ranked,
                                               size_t best, TopKeys& top) {
  if (top.held == 0) {
    std::copy(ranked, ranked + best, top.best);
    top.held = best;
    if (top.held == top.k) top.set_threshold(row);
    return;
  }
  for (size_t r = 0; r < best; ++r) top.insert_key(row, ranked[r]);
}

// The candidates of a chunk, ranked by counting: each one's rank is the number of candidates above
// it (keys are distinct), so no branch depends on the logits; the chunk's k best then enter `top`
// best first (the first chunk's become `top` as they are). Many equal logits at the bound (more
// than kRankedMax): one by one. Inlined into each path, so it is compiled for that path's CPU.
[[gnu::always_inline]] inline void rank_candidates(std::span<const float> row,
                                                   const uint32_t* gathered, size_t count,
                                                   TopKeys& top) {
  if (count > kRankedMax) {
    for (size_t i = 0; i < count; ++i) top.insert(row, gathered[i]);
    return;
  }
  uint64_t keys[kRankedMax];
  for (size_t i = 0; i < count; ++i) {
    keys[i] = digest::rank_key(digest::bits_of(row[gathered[i]]), static_cast<int32_t>(gathered[i]));
  }
  uint64_t ranked[kTopLogitsCountMax + 1];  // slot k takes every rank past the k best
  for (size_t i = 0; i < count; ++i) {
    size_t rank = 0;
    for (size_t j = 0; j < count; ++j) rank += keys[j] > keys[i] ? 1 : 0;
    ranked[rank < top.k ? rank : top.k] = keys[i];
  }
  take_ranked(row, ranked, std::min(count, top.k), top);
}

// ---- portable ----

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
// chunk, so at least k elements are >= the least of them.
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

// The k-th largest column maximum, the tightest such bound. Only the maxima at or above the loose
// bound (at least k are: the groups' maxima; typically not many more) are gathered, then the least
// of them that fewer than k exceed is counted out — no branch depends on the logits (they
// mispredict half the time).
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

// The ids of the chunk's logits at or above `bound`, from the columns whose maximum reaches it
// (ids out of ascending order: the ranking compares exact keys), without a branch on the logits.
size_t gather_reaching_columns(const float* x, size_t begin, size_t n, const float* maxima,
                               float bound, uint32_t* out) {
  size_t count = 0;
  for (size_t c = 0; c < kColumns; ++c) {
    if (!(maxima[c] >= bound)) continue;
    for (size_t v = begin + c; v < begin + n; v += kColumns) {
      out[count] = static_cast<uint32_t>(v);
      count += x[v] >= bound ? 1 : 0;
    }
  }
  return count;
}

// A chunk of at least 2 × kColumns logits, k < kColumns; false (nothing done) when the chunk
// holds a NaN (NaN ranks last and the maxima ignore it: the caller then scans it plainly).
bool chunk_top_portable(std::span<const float> row, size_t begin, size_t n, TopKeys& top) {
  float maxima[kColumns];
  if (column_maxima(row.data() + begin, n, maxima)) return false;
  const float bound = kth_column_maximum(maxima, top.k, kth_lower_bound(maxima, top.k));
  uint32_t* const gathered = top.gathered;
  const size_t count = gather_reaching_columns(row.data(), begin, n, maxima, bound, gathered);
  rank_candidates(row, gathered, count, top);
  return true;
}

// A chunk's bounded path: false (nothing done) when the chunk holds a NaN.
using ChunkTopFn = bool (*)(std::span<const float> row, size_t begin, size_t n, TopKeys& top);

// ---- AVX-512 ----
// The same steps with the 64 column maxima in four registers: the bound counted out among the
// few maxima that reach a looser one, the candidates by a compare and a compress over the whole
// chunk (16 logits an instruction).

#if LS_HAS_AVX512_PATHS
LS_AVX512_BEGIN

using avx512::lanes_below;

// The k-th largest of the values of x[0, count), counted with their multiplicity: the least
// value that fewer than k values exceed (a lower bound is all the callers need: the gather takes
// every logit at or above it). 16 values at a time count, in one register, how many of all the
// values exceed each of them: one compare and one masked add per value, none depending on the one
// before. `x` has room for whole vectors past count.
LS_AVX512 float kth_largest_avx512(float* x, size_t count, size_t k) {
  // Lanes past the last: below every value counted (none is counted above itself).
  for (size_t i = count; i < (count + 15) / 16 * 16; ++i) {
    x[i] = -std::numeric_limits<float>::infinity();
  }
  const __m512i ones = _mm512_set1_epi32(1);
  const __m512i ks = _mm512_set1_epi32(static_cast<int32_t>(k));
  float bound = std::numeric_limits<float>::infinity();
  for (size_t i = 0; i < count; i += 16) {
    const __m512 values = _mm512_loadu_ps(x + i);
    __m512i above = _mm512_setzero_si512();
    for (size_t j = 0; j < count; ++j) {
      const __mmask16 exceeded = _mm512_cmp_ps_mask(_mm512_set1_ps(x[j]), values, _CMP_GT_OQ);
      above = _mm512_mask_add_epi32(above, exceeded, above, ones);
    }
    const __mmask16 within = _mm512_mask_cmplt_epi32_mask(lanes_below(count - i), above, ks);
    if (within != 0) bound = std::min(bound, _mm512_mask_reduce_min_ps(within, values));
  }
  return bound;
}

// The k-th largest of the 64 column maxima, k ≤ 16. First a looser bound from 16 groups of 4
// columns (a register's lanes, maximised over the four registers): each group's maximum is a
// distinct logit, so k logits reach the k-th largest of them; then only the column maxima that
// reach it (typically a few more than k) are counted against each other.
LS_AVX512 float kth_column_maximum_avx512(const __m512* maxima, size_t k) {
  static_assert(kTopLogitsCountMax <= 16 && kColumns == 64);
  float groups[16];
  _mm512_storeu_ps(groups, _mm512_max_ps(_mm512_max_ps(maxima[0], maxima[1]),
                                         _mm512_max_ps(maxima[2], maxima[3])));
  const __m512 loose = _mm512_set1_ps(kth_largest_avx512(groups, 16, k));
  float reaching[kColumns + 16];
  size_t count = 0;
  for (size_t q = 0; q < 4; ++q) {
    const __mmask16 reach = _mm512_cmp_ps_mask(maxima[q], loose, _CMP_GE_OQ);
    _mm512_storeu_ps(reaching + count, _mm512_maskz_compress_ps(reach, maxima[q]));
    count += static_cast<size_t>(__builtin_popcount(reach));
  }
  return kth_largest_avx512(reaching, count, k);
}

// Column maxima of a chunk in four registers; false when the chunk holds a NaN.
LS_AVX512 bool column_maxima_avx512(const float* x, size_t n, __m512* maxima) {
  const __m512 neg_inf = _mm512_set1_ps(-std::numeric_limits<float>::infinity());
  for (size_t q = 0; q < 4; ++q) maxima[q] = neg_inf;
  __mmask16 nan = 0;
  size_t r = 0;
  for (; r + kColumns <= n; r += kColumns) {
    for (size_t q = 0; q < 4; ++q) {
      const __m512 values = _mm512_loadu_ps(x + r + 16 * q);
      nan |= _mm512_cmp_ps_mask(values, values, _CMP_UNORD_Q);
      maxima[q] = _mm512_max_ps(maxima[q], values);
    }
  }
  for (size_t q = 0; r + 16 * q < n; ++q) {  // the last, partial row of columns
    const __mmask16 live = lanes_below(n - r - 16 * q);
    const __m512 values = _mm512_maskz_loadu_ps(live, x + r + 16 * q);
    nan |= _mm512_mask_cmp_ps_mask(live, values, values, _CMP_UNORD_Q);
    maxima[q] = _mm512_mask_max_ps(maxima[q], live, maxima[q], values);
  }
  return nan == 0;
}

// The ids `ids` of the live lanes of x[0, 16) at or above `bounds`, appended to `gathered`;
// `ids` then moves on by 16. Compressed in a register and stored whole (a compress straight to
// memory is slow on some cores); `gathered` has room for the lanes past the last candidate.
LS_AVX512 inline void gather_16(__mmask16 live, const float* x, __m512 bounds, __m512i& ids,
                                uint32_t* gathered, size_t& count) {
  const __mmask16 reach =
      _mm512_mask_cmp_ps_mask(live, _mm512_maskz_loadu_ps(live, x), bounds, _CMP_GE_OQ);
  _mm512_storeu_si512(gathered + count, _mm512_maskz_compress_epi32(reach, ids));
  count += static_cast<size_t>(__builtin_popcount(reach));
  ids = _mm512_add_epi32(ids, _mm512_set1_epi32(16));
}

// rank_candidates for at most 16 candidates, in one register: a candidate's rank is how many
// precede it in the keys' order — a greater logit, or an equal one with a lower id — counted by
// two compares against all of them at once. The keys' ranks exactly: the bounded path sees no NaN
// (it refuses a chunk that holds one), and −0 and +0 compare equal as their keys do.
LS_AVX512 void rank_16_avx512(std::span<const float> row, const uint32_t* gathered, size_t count,
                              TopKeys& top) {
  const __mmask16 live = lanes_below(count);
  const __m512i ids = _mm512_maskz_loadu_epi32(live, gathered);
  const __m512 values = _mm512_mask_i32gather_ps(_mm512_setzero_ps(), live, ids, row.data(), 4);
  float value_of[16];
  _mm512_storeu_ps(value_of, values);
  uint64_t ranked[kTopLogitsCountMax + 1];  // slot k takes every rank past the k best
  for (size_t i = 0; i < count; ++i) {
    const __m512 value = _mm512_set1_ps(value_of[i]);
    const __m512i id = _mm512_set1_epi32(static_cast<int32_t>(gathered[i]));
    const __mmask16 greater = _mm512_mask_cmp_ps_mask(live, values, value, _CMP_GT_OQ);
    const __mmask16 equal = _mm512_mask_cmp_ps_mask(live, values, value, _CMP_EQ_OQ);
    const __mmask16 tie_before = _mm512_mask_cmplt_epu32_mask(equal, ids, id);
    const size_t rank = static_cast<size_t>(__builtin_popcount(greater | tie_before));
    ranked[rank < top.k ? rank : top.k] =
        digest::rank_key(digest::bits_of(value_of[i]), static_cast<int32_t>(gathered[i]));
  }
  take_ranked(row, ranked, std::min(count, top.k), top);
}

// A NaN-free chunk's top from its column maxima: the bound, the candidates at or above it, their
// ranks.
LS_AVX512 void top_from_maxima_avx512(std::span<const float> row, size_t begin, size_t n,
                                      const __m512* maxima, TopKeys& top) {
  const float* x = row.data() + begin;
  const __m512 bounds = _mm512_set1_ps(kth_column_maximum_avx512(maxima, top.k));
  __m512i ids = _mm512_add_epi32(_mm512_set1_epi32(static_cast<int32_t>(begin)),
                                 _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15));
  uint32_t* const gathered = top.gathered;
  size_t count = 0;
  size_t v = 0;
  for (; v + 16 <= n; v += 16) gather_16(0xFFFF, x + v, bounds, ids, gathered, count);
  if (v < n) gather_16(lanes_below(n - v), x + v, bounds, ids, gathered, count);
  if (count <= 16) {
    rank_16_avx512(row, gathered, count, top);
  } else {
    rank_candidates(row, gathered, count, top);
  }
}

LS_AVX512 bool chunk_top_avx512(std::span<const float> row, size_t begin, size_t n, TopKeys& top) {
  __m512 maxima[4];
  if (!column_maxima_avx512(row.data() + begin, n, maxima)) return false;
  top_from_maxima_avx512(row, begin, n, maxima, top);
  return true;
}

// The record's pass over one vector of a chunk: rule 5, the store, the digest's lanes and the
// column maxima of register q (the vector's columns: its offset in the chunk mod 64, over 16).
LS_AVX512 inline void record_16(float* x, __mmask16 live, size_t q, avx512::DigestLanes& lanes,
                                __m512* maxima, __mmask16& any_nan) {
  __mmask16 nan;
  const __m512 clean = avx512::sanitised_16(_mm512_maskz_loadu_ps(live, x), nan);
  any_nan |= nan & live;
  _mm512_mask_storeu_ps(x, live, clean);
  if (live == 0xFFFF) lanes.add(_mm512_castps_si512(clean));  // the row's tail: finish()'s
  maxima[q] = _mm512_mask_max_ps(maxima[q], live, maxima[q], clean);
}

// One chunk of a recorded row (begin a multiple of 16): the guard, the digest and the column
// maxima in one pass, then the chunk's top from the maxima — the sanitised chunk has no NaN, so
// the bounded path always applies where it is long enough.
LS_AVX512 bool record_chunk_avx512(std::span<float> row, size_t begin, size_t n,
                                   avx512::DigestLanes& lanes, TopKeys& top) {
  float* const x = row.data() + begin;
  const __m512 neg_inf = _mm512_set1_ps(-std::numeric_limits<float>::infinity());
  __m512 maxima[4] = {neg_inf, neg_inf, neg_inf, neg_inf};
  __mmask16 any_nan = 0;
  size_t v = 0;
  for (; v + kColumns <= n; v += kColumns) {
    for (size_t q = 0; q < 4; ++q) record_16(x + v + 16 * q, 0xFFFF, q, lanes, maxima, any_nan);
  }
  for (size_t q = 0; v < n; v += 16, ++q) record_16(x + v, lanes_below(n - v), q, lanes, maxima, any_nan);
  if (top.k == 0) return any_nan != 0;
  if (n >= kColumns * 2 && top.k < kColumns) {
    top_from_maxima_avx512(row, begin, n, maxima, top);
  } else {
    for (size_t i = begin; i < begin + n; ++i) {
      if (top.may_enter(row[i])) top.insert(row, i);
    }
  }
  return any_nan != 0;
}

LS_AVX512_END

ChunkTopFn fastest_chunk_top() {
  return cpu_has_avx512() ? chunk_top_avx512 : chunk_top_portable;
}
#else
ChunkTopFn fastest_chunk_top() { return chunk_top_portable; }
#endif

// Chosen once, at the first call (a function-local static: safe from any static initialiser).
ChunkTopFn chosen_chunk_top() {
  static const ChunkTopFn chosen = fastest_chunk_top();
  return chosen;
}

// One chunk: the bounded path when the chunk is long enough to have more columns than k and holds
// no NaN; otherwise the plain ascending scan.
void chunk_top(std::span<const float> row, size_t begin, size_t n, TopKeys& top, ChunkTopFn bounded) {
  if (n >= kColumns * 2 && top.k < kColumns && bounded(row, begin, n, top)) return;
  for (size_t v = begin; v < begin + n; ++v) {
    if (top.may_enter(row[v])) top.insert(row, v);
  }
}

// The k best held, as pairs, best first.
void emit_top(std::span<const float> row, const TopKeys& top, std::vector<TopLogit>& out) {
  for (size_t j = 0; j < top.held; ++j) {
    const int32_t id = static_cast<int32_t>(~static_cast<uint32_t>(top.best[j]));
    out.push_back(TopLogit{id, row[static_cast<size_t>(id)]});
  }
}

void append_top_logits_with(std::span<const float> row, int32_t count, std::vector<TopLogit>& out,
                            ChunkTopFn bounded) {
  LS_ASSERT(count >= 0 && count <= kTopLogitsCountMax, "count {}", count);
  TopKeys top;
  top.k = std::min(static_cast<size_t>(count), row.size());
  top.gathered = gather_buffer();
  if (top.k == 0) return;
  for (size_t begin = 0; begin < row.size(); begin += kChunk) {
    chunk_top(row, begin, std::min(kChunk, row.size() - begin), top, bounded);
  }
  emit_top(row, top, out);
}

using RecordRowFn = bool (*)(std::span<float>, int32_t, uint64_t&, std::vector<TopLogit>&);

#if LS_HAS_AVX512_PATHS
LS_AVX512_BEGIN
LS_AVX512 bool record_row_avx512(std::span<float> row, int32_t count, uint64_t& digest,
                                 std::vector<TopLogit>& out) {
  LS_ASSERT(count >= 0 && count <= kTopLogitsCountMax, "count {}", count);
  TopKeys top;
  top.k = std::min(static_cast<size_t>(count), row.size());
  top.gathered = gather_buffer();
  avx512::DigestLanes lanes;
  bool nan = false;
  for (size_t begin = 0; begin < row.size(); begin += kChunk) {
    nan |= record_chunk_avx512(row, begin, std::min(kChunk, row.size() - begin), lanes, top);
  }
  digest = lanes.finish(row.data(), static_cast<uint32_t>(row.size()));
  emit_top(row, top, out);
  return nan;
}
LS_AVX512_END

RecordRowFn fastest_record_row() {
  return cpu_has_avx512() ? record_row_avx512 : sanitise_and_record_row_portable;
}
#else
RecordRowFn fastest_record_row() { return sanitise_and_record_row_portable; }
#endif

RecordRowFn chosen_record_row() {
  static const RecordRowFn chosen = fastest_record_row();
  return chosen;
}

}  // namespace

void append_top_logits(std::span<const float> row, int32_t count, std::vector<TopLogit>& out) {
  append_top_logits_with(row, count, out, chosen_chunk_top());
}

void append_top_logits_portable(std::span<const float> row, int32_t count,
                                std::vector<TopLogit>& out) {
  append_top_logits_with(row, count, out, chunk_top_portable);
}

bool sanitise_and_record_row_portable(std::span<float> row, int32_t count, uint64_t& digest,
                                      std::vector<TopLogit>& top) {
  const bool nan = sanitise_logits_row_portable(row);
  digest = logits_row_digest_portable(row);
  append_top_logits_portable(row, count, top);
  return nan;
}

bool sanitise_and_record_row(std::span<float> row, int32_t count, uint64_t& digest,
                             std::vector<TopLogit>& top) {
  return chosen_record_row()(row, count, digest, top);
}

}  // namespace ls
