#include "kernels/logits_ops.h"

#include "core/digest_math.h"
#include "kernels/reduce.cuh"
#include "kernels/step_layout.h"

namespace ls::kernels {

namespace {

constexpr int32_t kThreads = 256;
constexpr int32_t kWarps = kThreads / 32;
constexpr int32_t kK = kTopLogitsCountMax;
constexpr int32_t kGuardPartialFloats = 4;  // max, argmax (int bits), NaN seen, Σ exp(x − max)
constexpr uint32_t kAllLanes = 0xffffffffu;
static_assert(kK <= 8, "the record's bound is the least of 8 groups' maxima");

int32_t segments_of(int32_t vocab) { return (vocab + kLogitsSegment - 1) / kLogitsSegment; }

size_t align_up(size_t bytes) { return (bytes + 255) / 256 * 256; }

// A segment's share of the record: its digest lane sums and its k best keys (digest::rank_key; 0 =
// none: every real key is larger, its low half being an id's complement), best first.
struct RecordPartial {
  uint32_t a;
  uint32_t b;
  unsigned long long keys[kK];
};

// The workspace: the guard's partials [rows, segments, 4] floats, then the record's [rows, segments].
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

// ---- the pass: one warp a segment of kSegment logits ----

// A lane holds kLaneValues logits of its warp's segment: vector j of lane l is logits
// [(j·32 + l)·4, +4) of the segment (coalesced float4 loads), so a lane's values rise with the id.
constexpr int32_t kLaneValues = kLogitsSegment / 32;
constexpr int32_t kVectors = kLaneValues / 4;
static_assert(kLogitsSegment % 128 == 0);

__device__ __forceinline__ int32_t local_index(int32_t e, int32_t lane) {
  return ((e / 4) * 32 + lane) * 4 + e % 4;
}

// Where a warp ranks its candidates: the logits at or above its bound.
constexpr int32_t kPool = 64;

// The usual path: n <= kPool candidates (keys distinct) in `pool`; each one's rank is the number
// of candidates above it. Writes keys[0, kK) of the segment's partial, best first, 0 past n.
__device__ __forceinline__ void rank_pool(const unsigned long long* pool, int32_t n, int32_t k,
                                          unsigned long long* keys) {
  const int32_t lane = static_cast<int32_t>(threadIdx.x % 32);
  if (lane < kK && lane >= (n < k ? n : k)) keys[lane] = 0;
  for (int32_t c = lane; c < n; c += 32) {
    const unsigned long long mine = pool[c];
    int32_t rank = 0;
    for (int32_t m = 0; m < n; ++m) rank += pool[m] > mine ? 1 : 0;
    if (rank < k) keys[rank] = mine;
  }
}

// When more than kPool logits reach the bound (many equal logits): k rounds of a warp max over
// the keys below the previous round's winner (distinct keys: round r finds the r-th best).
template <bool kFull>
__device__ __forceinline__ void rank_rounds(const float (&x)[kLaneValues], int32_t begin,
                                            int32_t limit, int32_t k, unsigned long long* keys) {
  const int32_t lane = static_cast<int32_t>(threadIdx.x % 32);
  unsigned long long last = ~0ull;
  for (int32_t r = 0; r < kK; ++r) {
    unsigned long long m = 0;
    if (r < k) {
#pragma unroll
      for (int32_t e = 0; e < kLaneValues; ++e) {
        const int32_t local = local_index(e, lane);
        if (!kFull && local >= limit) continue;
        const unsigned long long key = digest::rank_key(__float_as_uint(x[e]), begin + local);
        m = key < last && key > m ? key : m;
      }
    }
    m = warp_max_key(m);
    if (lane == 0) keys[r] = m;  // 0 once the segment has no more, and for r >= k
    last = m;
  }
}

// The segment's record partial from its sanitised values (the lanes' largest in lane_max, −inf
// for a lane without one). The bound, the least of the 8 largest values of the warp's groups of
// 4 lanes, has 8 >= kK logits at or above it, so every one of the segment's k best reaches it;
// typically ~20 of 1024 do and are ranked in one pass.
template <bool kFull>
__device__ __forceinline__ void record_segment(const float (&x)[kLaneValues], int32_t begin,
                                               int32_t limit, float lane_max, int32_t k,
                                               unsigned long long* pool, RecordPartial* out) {
  const int32_t lane = static_cast<int32_t>(threadIdx.x % 32);
  uint32_t a = 0, b = 0;
#pragma unroll
  for (int32_t e = 0; e < kLaneValues; ++e) {
    const int32_t local = local_index(e, lane);
    const uint32_t i = static_cast<uint32_t>(begin + local);
    const uint32_t bits = __float_as_uint(x[e]);
    if (kFull || local < limit) {
      a += digest::lane_a(bits, i);
      b += digest::lane_b(bits, i);
    }
  }
  a = __reduce_add_sync(kAllLanes, a);
  b = __reduce_add_sync(kAllLanes, b);
  if (lane == 0) {
    out->a = a;
    out->b = b;
  }
  if (k == 0) {
    if (lane < kK) out->keys[lane] = 0;
    return;
  }
  float bound = fmaxf(lane_max, __shfl_xor_sync(kAllLanes, lane_max, 1));
  bound = fmaxf(bound, __shfl_xor_sync(kAllLanes, bound, 2));
  bound = fminf(bound, __shfl_xor_sync(kAllLanes, bound, 4));
  bound = fminf(bound, __shfl_xor_sync(kAllLanes, bound, 8));
  bound = fminf(bound, __shfl_xor_sync(kAllLanes, bound, 16));
  int32_t mine = 0;
#pragma unroll
  for (int32_t e = 0; e < kLaneValues; ++e) {
    const int32_t local = local_index(e, lane);
    mine += (kFull || local < limit) && x[e] >= bound ? 1 : 0;
  }
  int32_t before = mine;  // inclusive scan over the lanes, then exclusive
#pragma unroll
  for (int32_t d = 1; d < 32; d *= 2) {
    const int32_t other = __shfl_up_sync(kAllLanes, before, d);
    before += lane >= d ? other : 0;
  }
  const int32_t n = __shfl_sync(kAllLanes, before, 31);
  before -= mine;
  if (n > kPool) {
    rank_rounds<kFull>(x, begin, limit, k, out->keys);
    return;
  }
#pragma unroll
  for (int32_t e = 0; e < kLaneValues; ++e) {
    const int32_t local = local_index(e, lane);
    if ((kFull || local < limit) && x[e] >= bound) {
      pool[before++] = digest::rank_key(__float_as_uint(x[e]), begin + local);
    }
  }
  __syncwarp();
  rank_pool(pool, n, k, out->keys);
}

// One warp's segment [begin, begin + kLogitsSegment) of a row (limit: the logits it holds, fewer
// in a row's last segment): sanitise in place, then its guard partial and (kRecord) record partial.
template <bool kRecord, bool kFull>
__device__ __forceinline__ void pass_segment(float* row, int32_t begin, int32_t limit,
                                             bool vectorised, bool want_sum, float* guard_partial,
                                             RecordPartial* record_partial, int32_t k,
                                             unsigned long long* pool) {
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
#pragma unroll
  for (int32_t e = 0; e < kLaneValues; ++e) {
    const int32_t local = local_index(e, lane);
    if (!kFull && local >= limit) continue;
    if (isnan(x[e])) {
      saw_nan = 1;
      x[e] = -kSanitisedMagnitude;
      row[begin + local] = x[e];
    } else if (isinf(x[e])) {
      x[e] = x[e] > 0.0f ? kSanitisedMagnitude : -kSanitisedMagnitude;
      row[begin + local] = x[e];
    }
    if (x[e] > best.value) best = ArgMax{x[e], begin + local};  // rising ids: the first keeps a tie
  }
  if constexpr (kRecord) record_segment<kFull>(x, begin, limit, best.value, k, pool, record_partial);
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
pass_kernel(float* logits, int32_t vocab, int32_t segments, bool want_sum, Workspace w,
            int32_t top_k) {
  __shared__ unsigned long long pools[kRecord ? kWarps : 1][kPool];
  const int32_t warp = static_cast<int32_t>(threadIdx.x / 32);
  const int32_t segment = static_cast<int32_t>(blockIdx.x) * kWarps + warp;
  if (segment >= segments) return;
  const int32_t begin = segment * kLogitsSegment;
  const int32_t limit = vocab - begin;
  float* row = logits + int64_t{blockIdx.y} * vocab;
  const int64_t partial = int64_t{blockIdx.y} * segments + segment;
  float* guard_partial = w.guard + partial * kGuardPartialFloats;
  RecordPartial* record_partial = w.record + partial;
  unsigned long long* pool = pools[kRecord ? warp : 0];
  const bool vectorised = vocab % 4 == 0;  // rows start 16-byte aligned (cudaMalloc'd base)
  if (limit >= kLogitsSegment) {
    pass_segment<kRecord, true>(row, begin, limit, vectorised, want_sum, guard_partial,
                                record_partial, top_k, pool);
  } else {
    pass_segment<kRecord, false>(row, begin, limit, vectorised, want_sum, guard_partial,
                                 record_partial, top_k, pool);
  }
}

// ---- the combine: one block a row ----

constexpr int32_t kCombineThreads = 256;
constexpr int32_t kCombineWarps = kCombineThreads / 32;
static_assert(kCombineWarps * kK == 64, "warp 0 ranks the warps' k best, two keys a lane");

struct CombineScratch {
  float values[32];
  int32_t indices[32];
  uint32_t sums[2][kCombineWarps];
  unsigned long long candidates[kCombineWarps * kK];
};

// The row's digest and k best pairs from its segments' record partials: thread t holds segment
// t's k best (and inserts those of t + 256, … in a longer row), each warp ranks its lanes', warp 0
// the warps'. The lane sums are integer sums: any order gives the same bits.
__device__ void combine_record(const LogitsPassArgs& g, const RecordPartial* p, int32_t segments,
                               int32_t r, CombineScratch& s) {
  const int32_t t = static_cast<int32_t>(threadIdx.x);
  const int32_t lane = t % 32;
  const int32_t warp = t / 32;
  uint32_t a = 0, b = 0;
  unsigned long long best[kK];
#pragma unroll
  for (int32_t j = 0; j < kK; ++j) best[j] = t < segments ? p[t].keys[j] : 0;  // best first
  for (int32_t c = t; c < segments; c += kCombineThreads) {
    a += p[c].a;
    b += p[c].b;
    if (c == t) continue;
#pragma unroll
    for (int32_t j = 0; j < kK; ++j) insert_key(best, p[c].keys[j]);
  }
  a = __reduce_add_sync(kAllLanes, a);
  b = __reduce_add_sync(kAllLanes, b);
  const unsigned long long mine = warp_top(best, g.top_k);
  if (lane < kK) s.candidates[warp * kK + lane] = mine;
  if (lane == 0) {
    s.sums[0][warp] = a;
    s.sums[1][warp] = b;
  }
  __syncthreads();
  if (warp != 0) return;
  unsigned long long two[2] = {s.candidates[lane], s.candidates[lane + 32]};
  const unsigned long long winner = warp_top(two, g.top_k);
  const uint32_t ra = __reduce_add_sync(kAllLanes, lane < kCombineWarps ? s.sums[0][lane] : 0u);
  const uint32_t rb = __reduce_add_sync(kAllLanes, lane < kCombineWarps ? s.sums[1][lane] : 0u);
  if (lane == 0) g.digests[r] = digest::finish(ra, rb, static_cast<uint32_t>(g.vocab));
  if (lane < g.top_k) {
    const int32_t id = static_cast<int32_t>(~static_cast<uint32_t>(winner));
    int32_t* pair = g.top + (int64_t{r} * kK + lane) * 2;
    pair[0] = id;
    pair[1] = __float_as_int(g.logits[int64_t{r} * g.vocab + id]);
  }
}

// One block per row: the segment partials combined in a fixed order (thread-strided, then the
// block reductions of kernels/reduce.cuh).
template <bool kRecord>
__global__ void __launch_bounds__(kCombineThreads)
combine_kernel(LogitsPassArgs g, Workspace w, int32_t segments) {
  __shared__ CombineScratch s;
  const int32_t r = blockIdx.x;
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
  if constexpr (kRecord) combine_record(g, w.record + int64_t{r} * segments, segments, r, s);
}

template <bool kRecord>
void launch(const LogitsPassArgs& g, cudaStream_t stream) {
  const int32_t segments = segments_of(g.vocab);
  const Workspace w = carve(g.workspace, g.rows, g.vocab);
  pass_kernel<kRecord><<<dim3((segments + kWarps - 1) / kWarps, g.rows), kThreads, 0, stream>>>(
      g.logits, g.vocab, segments, g.row_max != nullptr, w, g.top_k);
  combine_kernel<kRecord><<<g.rows, kCombineThreads, 0, stream>>>(g, w, segments);
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
