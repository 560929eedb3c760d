#include "kernels/logits_ops.h"

#include "core/ops/digest.h"
#include "core/ops/nan_guard.h"
#include "kernels/reduce.cuh"
#include "kernels/step_layout.h"

namespace ls::kernels {

namespace {

constexpr int32_t kThreads = 256;
constexpr int32_t kWarps = kThreads / 32;
constexpr int32_t kK = kTopLogitsCountMax;
constexpr int32_t kGuardPartialFloats = 4;  // max, argmax (int bits), NaN seen, Σ exp(x − max)
constexpr uint32_t kAllLanes = 0xffffffffu;

int32_t segments_of(int32_t vocab) { return (vocab + kLogitsSegment - 1) / kLogitsSegment; }

size_t align_up(size_t bytes) { return (bytes + 255) / 256 * 256; }

// A segment's share of the record: its digest lane sums. (Its top-k needs nothing more: the
// guard's partial holds the segment's largest logit and its id.)
struct RecordPartial {
  uint32_t a;
  uint32_t b;
};

// The workspace: the guard's partials [rows, segments, 4] floats, then the record's
// [rows, segments].
struct Workspace {
  float* guard;
  RecordPartial* record;
};

size_t guard_bytes(int32_t rows, int32_t vocab) {
  return align_up(static_cast<size_t>(rows) * static_cast<size_t>(segments_of(vocab)) *
                  kGuardPartialFloats * sizeof(float));
}

Workspace carve(void* base, int32_t rows, int32_t vocab) {
  auto* bytes = static_cast<char*>(base);
  return {reinterpret_cast<float*>(bytes),
          reinterpret_cast<RecordPartial*>(bytes + guard_bytes(rows, vocab))};
}

// ---- the record's top-k over keys ----

// Inserts `key` into `best` (descending): a compare-and-swap chain, unrolled into registers.
__device__ __forceinline__ void insert_key(unsigned long long (&best)[kK], unsigned long long key) {
  if (key <= best[kK - 1]) return;
#pragma unroll
  for (int32_t j = 0; j < kK; ++j) {
    if (key > best[j]) {
      const unsigned long long t = best[j];
      best[j] = key;
      key = t;
    }
  }
}

template <int32_t N>
__device__ __forceinline__ unsigned long long max_key(const unsigned long long (&keys)[N]) {
  unsigned long long m = keys[0];
#pragma unroll
  for (int32_t j = 1; j < N; ++j) m = keys[j] > m ? keys[j] : m;
  return m;
}

// The warp's largest key, by two single-instruction reductions (redux.sync is 32-bit): the
// high halves, then the low halves of the lanes that hold that high half.
__device__ __forceinline__ unsigned long long warp_max_key(unsigned long long x) {
  const uint32_t hi = __reduce_max_sync(kAllLanes, static_cast<uint32_t>(x >> 32));
  const uint32_t lo =
      __reduce_max_sync(kAllLanes, static_cast<uint32_t>(x >> 32) == hi ? static_cast<uint32_t>(x) : 0u);
  return (static_cast<unsigned long long>(hi) << 32) | lo;
}

// The warp's k best keys over every lane's `keys` (distinct, 0 = none): lane r < k receives the
// r-th best, other lanes 0. k rounds of a warp max of the lanes' heads; only the winner's lane
// (one lane: keys are distinct) recomputes its head.
template <int32_t N>
__device__ unsigned long long warp_top(unsigned long long (&keys)[N], int32_t k) {
  const int32_t lane = static_cast<int32_t>(threadIdx.x % 32);
  unsigned long long head = max_key(keys);
  unsigned long long mine = 0;
  for (int32_t r = 0; r < k; ++r) {
    const unsigned long long winner = warp_max_key(head);
    if (lane == r) mine = winner;
    if (winner != 0 && head == winner) {
#pragma unroll
      for (int32_t j = 0; j < N; ++j) keys[j] = keys[j] == winner ? 0 : keys[j];
      head = max_key(keys);
    }
  }
  return mine;
}

// ---- the pass: one warp a segment of kLogitsSegment logits ----

// A lane holds kLaneValues logits of its warp's segment: vector j of lane l is logits
// [(j·32 + l)·4, +4) of the segment (coalesced float4 loads), so a lane's values rise with the id.
constexpr int32_t kLaneValues = kLogitsSegment / 32;
constexpr int32_t kVectors = kLaneValues / 4;
static_assert(kLogitsSegment % 128 == 0);

__device__ __forceinline__ int32_t local_index(int32_t e, int32_t lane) {
  return ((e / 4) * 32 + lane) * 4 + e % 4;
}

// One warp's segment [begin, begin + kLogitsSegment) of a row (limit: the logits it holds, fewer
// in a row's last segment): sanitise in place, then its guard partial and (kRecord) its digest
// lane sums. All the record adds to the pass is the digest's few integer operations a logit.
template <bool kRecord, bool kFull>
__device__ __forceinline__ void pass_segment(float* row, int32_t begin, int32_t limit,
                                             bool vectorised, bool want_sum, float* guard_partial,
                                             RecordPartial* record_partial) {
  const int32_t lane = static_cast<int32_t>(threadIdx.x % 32);
  float x[kLaneValues];
  if (kFull && vectorised) {
    const float4* v = reinterpret_cast<const float4*>(row + begin);
#pragma unroll
    for (int32_t j = 0; j < kVectors; ++j) {
      const float4 q = v[j * 32 + lane];
      x[4 * j] = q.x, x[4 * j + 1] = q.y, x[4 * j + 2] = q.z, x[4 * j + 3] = q.w;
    }
  } else {
#pragma unroll
    for (int32_t e = 0; e < kLaneValues; ++e) {
      const int32_t local = local_index(e, lane);
      x[e] = kFull || local < limit ? row[begin + local] : -INFINITY;
    }
  }
  ArgMax best{-INFINITY, 0x7fffffff};
  int32_t saw_nan = 0;
  uint32_t a = 0, b = 0;
#pragma unroll
  for (int32_t e = 0; e < kLaneValues; ++e) {
    const int32_t local = local_index(e, lane);
    if (!kFull && local >= limit) continue;
    // Stores only what the guard changes; each branch folds sanitised_logit to its constant.
    if (isnan(x[e])) {
      saw_nan = 1;
      x[e] = ops::sanitised_logit(x[e]);
      row[begin + local] = x[e];
    } else if (isinf(x[e])) {
      x[e] = ops::sanitised_logit(x[e]);
      row[begin + local] = x[e];
    }
    if (x[e] > best.value) best = ArgMax{x[e], begin + local};  // rising ids: the first keeps a tie
    if constexpr (kRecord) {
      const uint32_t i = static_cast<uint32_t>(begin + local);
      a += digest::lane_a(__float_as_uint(x[e]), i);
      b += digest::lane_b(__float_as_uint(x[e]), i);
    }
  }
  if constexpr (kRecord) {
    a = __reduce_add_sync(kAllLanes, a);
    b = __reduce_add_sync(kAllLanes, b);
    if (lane == 0) *record_partial = RecordPartial{a, b};
  }
  best = warp_argmax(best);
  float sum = 0.0f;
  if (want_sum) {
#pragma unroll
    for (int32_t e = 0; e < kLaneValues; ++e) {
      if (kFull || local_index(e, lane) < limit) sum += expf(x[e] - best.value);
    }
    sum = warp_sum(sum);
  }
  const int32_t any_nan = __any_sync(kAllLanes, saw_nan) ? 1 : 0;
  if (lane == 0) {
    guard_partial[0] = best.value;
    guard_partial[1] = __int_as_float(best.index);
    guard_partial[2] = static_cast<float>(any_nan);
    guard_partial[3] = sum;
  }
}

// grid: (⌈segments / kWarps⌉, rows); warp w of block x takes segment x·kWarps + w of row y. Warps
// are independent: no block barrier.
template <bool kRecord>
__global__ void __launch_bounds__(kThreads)
pass_kernel(float* logits, int32_t vocab, int32_t segments, bool want_sum, Workspace w) {
  const int32_t warp = static_cast<int32_t>(threadIdx.x / 32);
  const int32_t segment = static_cast<int32_t>(blockIdx.x) * kWarps + warp;
  if (segment >= segments) return;
  const int32_t begin = segment * kLogitsSegment;
  const int32_t limit = vocab - begin;
  float* row = logits + int64_t{blockIdx.y} * vocab;
  const int64_t partial = int64_t{blockIdx.y} * segments + segment;
  float* guard_partial = w.guard + partial * kGuardPartialFloats;
  const bool vectorised = vocab % 4 == 0;  // rows start 16-byte aligned (cudaMalloc'd base)
  if (limit >= kLogitsSegment) {
    pass_segment<kRecord, true>(row, begin, limit, vectorised, want_sum, guard_partial,
                                w.record + partial);
  } else {
    pass_segment<kRecord, false>(row, begin, limit, vectorised, want_sum, guard_partial,
                                 w.record + partial);
  }
}

// ---- the combine: one block a row ----

constexpr int32_t kCombineThreads = 256;
constexpr int32_t kCombineWarps = kCombineThreads / 32;
static_assert(kCombineWarps * kK == 64, "warp 0 ranks the warps' k best, two keys a lane");
// Candidates ranked in one pass; more (many equal logits at the bound) take the rounds.
constexpr int32_t kPool = kCombineThreads;
// Logits of the candidate segments a thread loads before it tests them (independent loads): the
// k best segments in one round, so the rescan costs one trip to L2, not several in a chain.
constexpr int32_t kRescanBatch = kK * kLogitsSegment / kCombineThreads;
static_assert(kRescanBatch * kCombineThreads == kK * kLogitsSegment);

struct CombineScratch {
  float values[32];
  int32_t indices[32];
  uint32_t sums[2][kCombineWarps];
  unsigned long long candidates[kCombineWarps * kK];
  unsigned long long warp_keys[kCombineWarps];
  unsigned long long top[kK];
  unsigned long long pool[kPool];
  uint32_t pool_bits[kPool];  // each candidate's logit bits (the key holds −0 as +0)
  uint32_t top_bits[kK];
  int32_t list[kK];
  uint32_t list_count;
  uint32_t pool_count;
  unsigned long long bound;
};

// The block's largest key over every thread's `key`; every thread receives it.
__device__ unsigned long long block_max_key(unsigned long long key, CombineScratch& s) {
  const int32_t t = static_cast<int32_t>(threadIdx.x);
  key = warp_max_key(key);
  __syncthreads();  // warp_keys may still be read by a previous call
  if (t % 32 == 0) s.warp_keys[t / 32] = key;
  __syncthreads();
  unsigned long long m = s.warp_keys[0];
#pragma unroll
  for (int32_t i = 1; i < kCombineWarps; ++i) m = s.warp_keys[i] > m ? s.warp_keys[i] : m;
  return m;
}

// Calls f(id, x) for every logit of the listed segments, kRescanBatch loads in flight a thread.
template <typename F>
__device__ __forceinline__ void for_listed_logits(const LogitsPassArgs& g, int32_t r, int32_t listed,
                                                  const CombineScratch& s, F&& f) {
  const float* row = g.logits + int64_t{r} * g.vocab;
  const int32_t total = listed * kLogitsSegment;
  for (int32_t base = 0; base < total; base += kCombineThreads * kRescanBatch) {
    int32_t ids[kRescanBatch];
    float x[kRescanBatch];
#pragma unroll
    for (int32_t j = 0; j < kRescanBatch; ++j) {
      const int32_t flat = base + j * kCombineThreads + static_cast<int32_t>(threadIdx.x);
      ids[j] = flat < total ? s.list[flat / kLogitsSegment] * kLogitsSegment + flat % kLogitsSegment
                            : g.vocab;
      x[j] = ids[j] < g.vocab ? row[ids[j]] : 0.0f;
    }
#pragma unroll
    for (int32_t j = 0; j < kRescanBatch; ++j) {
      if (ids[j] < g.vocab) f(ids[j], x[j]);
    }
  }
}

// The row's digest and k best pairs. The digest: the segments' lane sums (integer sums: any order
// gives the same bits). The top-k in two levels, by rank keys (distinct: they hold the id): the
// k-th best of the segments' best keys is a lower bound on the row's k-th best key (the k segment
// bests are k keys at or above it), and only a segment whose best reaches the bound holds a key
// that does — the k best segments, no more. Their logits (read again, from L2: the pass just
// read them) at or above the bound are ranked exactly: typically ~10, at most k segments' worth.
__device__ void combine_record(const LogitsPassArgs& g, const Workspace& w, int32_t segments,
                               int32_t r, CombineScratch& s) {
  const int32_t t = static_cast<int32_t>(threadIdx.x);
  const int32_t lane = t % 32;
  const int32_t warp = t / 32;
  const float* gp = w.guard + int64_t{r} * segments * kGuardPartialFloats;
  const RecordPartial* rp = w.record + int64_t{r} * segments;
  const int32_t k = g.top_k;
  uint32_t a = 0, b = 0;
  unsigned long long best[kK];
#pragma unroll
  for (int32_t j = 0; j < kK; ++j) best[j] = 0;
  for (int32_t c = t; c < segments; c += kCombineThreads) {
    a += rp[c].a;
    b += rp[c].b;
    const float* q = gp + c * kGuardPartialFloats;
    insert_key(best, digest::rank_key(__float_as_uint(q[0]), __float_as_int(q[1])));
  }
  a = __reduce_add_sync(kAllLanes, a);
  b = __reduce_add_sync(kAllLanes, b);
  const unsigned long long mine = warp_top(best, k);
  if (lane < kK) s.candidates[warp * kK + lane] = mine;
  if (lane == 0) {
    s.sums[0][warp] = a;
    s.sums[1][warp] = b;
  }
  if (t == 0) s.list_count = 0, s.pool_count = 0;
  __syncthreads();
  if (warp == 0) {
    unsigned long long two[2] = {s.candidates[lane], s.candidates[lane + 32]};
    const unsigned long long ranked = warp_top(two, k);
    const unsigned long long kth = k > 0 ? __shfl_sync(kAllLanes, ranked, k - 1) : 0;
    const uint32_t ra = __reduce_add_sync(kAllLanes, lane < kCombineWarps ? s.sums[0][lane] : 0u);
    const uint32_t rb = __reduce_add_sync(kAllLanes, lane < kCombineWarps ? s.sums[1][lane] : 0u);
    if (lane == 0) {
      g.digests[r] = digest::finish(ra, rb, static_cast<uint32_t>(g.vocab));
      s.bound = kth;  // 0 (fewer segments than k): every logit
    }
  }
  __syncthreads();
  if (k == 0) return;
  const unsigned long long bound = s.bound;
  for (int32_t c = t; c < segments; c += kCombineThreads) {
    const float* q = gp + c * kGuardPartialFloats;
    if (digest::rank_key(__float_as_uint(q[0]), __float_as_int(q[1])) >= bound) {
      s.list[atomicAdd(&s.list_count, 1u)] = c;  // at most k: the keys are distinct
    }
  }
  __syncthreads();
  const int32_t listed = static_cast<int32_t>(s.list_count);
  for_listed_logits(g, r, listed, s, [&](int32_t id, float x) {
    const unsigned long long key = digest::rank_key(__float_as_uint(x), id);
    if (key < bound) return;
    const uint32_t slot = atomicAdd(&s.pool_count, 1u);
    if (slot < static_cast<uint32_t>(kPool)) {
      s.pool[slot] = key;
      s.pool_bits[slot] = __float_as_uint(x);
    }
  });
  __syncthreads();
  const int32_t n = static_cast<int32_t>(s.pool_count);  // the same for every thread
  if (n <= kPool) {
    if (t < kK && t >= (n < k ? n : k)) s.top[t] = 0, s.top_bits[t] = 0;
    if (t < n) {  // keys are distinct: a candidate's rank is the number above it
      const unsigned long long key = s.pool[t];
      int32_t rank = 0;
      for (int32_t i = 0; i < n; ++i) rank += s.pool[i] > key ? 1 : 0;
      if (rank < k) {
        s.top[rank] = key;
        s.top_bits[rank] = s.pool_bits[t];
      }
    }
  } else {  // more than kPool (equal logits): k rounds of a block max below the last winner
    unsigned long long last = ~0ull;
    for (int32_t round = 0; round < k; ++round) {
      unsigned long long m = 0;
      for_listed_logits(g, r, listed, s, [&](int32_t id, float x) {
        const unsigned long long key = digest::rank_key(__float_as_uint(x), id);
        m = key >= bound && key < last && key > m ? key : m;
      });
      last = block_max_key(m, s);
      if (t == 0) {
        s.top[round] = last;
        const int32_t id = static_cast<int32_t>(~static_cast<uint32_t>(last));
        s.top_bits[round] = __float_as_uint(g.logits[int64_t{r} * g.vocab + id]);
      }
    }
  }
  __syncthreads();
  if (t < k) {  // n < k only when the row has fewer than k logits: k ≤ vocab is checked
    const int32_t id = static_cast<int32_t>(~static_cast<uint32_t>(s.top[t]));
    int32_t* pair = g.top + (int64_t{r} * kK + t) * 2;
    pair[0] = id;
    pair[1] = static_cast<int32_t>(s.top_bits[t]);
  }
}

// A row's guard partials combined in a fixed order (thread-strided, then the block reductions of
// kernels/reduce.cuh): its NaN flag, argmax and (for log-probabilities) max and sum.
__device__ void combine_guard(const LogitsPassArgs& g, const Workspace& w, int32_t segments,
                              int32_t r, CombineScratch& s) {
  const int32_t t = static_cast<int32_t>(threadIdx.x);
  const float* p = w.guard + int64_t{r} * segments * kGuardPartialFloats;
  ArgMax best{-INFINITY, 0x7fffffff};
  int32_t nan = 0;
  for (int32_t c = t; c < segments; c += kCombineThreads) {
    const float* q = p + c * kGuardPartialFloats;
    best = better(best, ArgMax{q[0], __float_as_int(q[1])});
    nan |= q[2] != 0.0f ? 1 : 0;
  }
  nan = __syncthreads_or(nan);
  best = block_argmax(best, s.values, s.indices);
  if (t == 0) {
    g.nan_flags[r] = nan != 0 ? 1 : 0;
    g.argmax[r] = best.index;
  }
  if (g.row_max != nullptr) {
    float sum = 0.0f;
    for (int32_t c = t; c < segments; c += kCombineThreads) {
      const float* q = p + c * kGuardPartialFloats;
      sum += q[3] * expf(q[0] - best.value);
    }
    sum = block_sum(sum, s.values);
    if (t == 0) {
      g.row_max[r] = best.value;
      g.row_sum[r] = sum;
    }
  }
}

// Blocks [0, rows): each a row's guard combine; a recorded pass adds blocks [rows, 2 rows), each
// a row's record combine (its digest and top-k), which need the pass alone: both run side by
// side in one launch, so a record adds no launch and no fork to the step (a record combine on a
// second stream, joined before the copy back, cost a batch-1 step ~3 us on the H200).
__global__ void __launch_bounds__(kCombineThreads)
combine_kernel(LogitsPassArgs g, Workspace w, int32_t segments) {
  __shared__ CombineScratch s;
  const int32_t b = static_cast<int32_t>(blockIdx.x);
  if (b < g.rows) {
    combine_guard(g, w, segments, b, s);
  } else {
    combine_record(g, w, segments, b - g.rows, s);
  }
}

template <bool kRecord>
void launch(const LogitsPassArgs& g, cudaStream_t stream) {
  const int32_t segments = segments_of(g.vocab);
  const Workspace w = carve(g.workspace, g.rows, g.vocab);
  pass_kernel<kRecord><<<dim3((segments + kWarps - 1) / kWarps, g.rows), kThreads, 0, stream>>>(
      g.logits, g.vocab, segments, g.row_max != nullptr, w);
  combine_kernel<<<kRecord ? 2 * g.rows : g.rows, kCombineThreads, 0, stream>>>(g, w, segments);
}

}  // namespace

size_t logits_pass_workspace_bytes(int32_t rows, int32_t vocab) {
  return guard_bytes(rows, vocab) +
         align_up(static_cast<size_t>(rows) * static_cast<size_t>(segments_of(vocab)) *
                  sizeof(RecordPartial));
}

cudaError_t launch_logits_pass(const LogitsPassArgs& g, cudaStream_t stream) {
  const bool record = g.digests != nullptr;
  if (g.rows < 0 || g.rows > 65535 || g.vocab < 1 || g.logits == nullptr ||
      g.workspace == nullptr || g.nan_flags == nullptr || g.argmax == nullptr ||
      (g.row_max == nullptr) != (g.row_sum == nullptr) ||
      (record && (g.top == nullptr || g.top_k < 0 || g.top_k > kK || g.top_k > g.vocab))) {
    return cudaErrorInvalidValue;
  }
  if (g.rows == 0) return cudaSuccess;
  if (record) {
    launch<true>(g, stream);
  } else {
    launch<false>(g, stream);
  }
  return cudaGetLastError();
}

}  // namespace ls::kernels
