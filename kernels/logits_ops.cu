#include "kernels/logits_ops.h"

#include "core/digest_math.h"
#include "kernels/reduce.cuh"
#include "kernels/step_layout.h"

namespace ls::kernels {

namespace {

constexpr int32_t kThreads = 256;
constexpr int32_t kPerThread = kGuardChunk / kThreads;
constexpr int32_t kWarps = kThreads / 32;
constexpr int32_t kK = kTopLogitsCountMax;
constexpr int32_t kGuardPartialFloats = 4;  // max, argmax (int bits), NaN seen, Σ exp(x − max)
constexpr uint32_t kFull = 0xffffffffu;
static_assert(kGuardChunk % kThreads == 0);
static_assert(kWarps >= kK, "the record's bound needs kK distinct warp maxima");

int32_t chunks_of(int32_t vocab) { return (vocab + kGuardChunk - 1) / kGuardChunk; }

size_t align_up(size_t bytes) { return (bytes + 255) / 256 * 256; }

// A chunk's share of the record: its digest lane sums and its k best keys (digest::rank_key; 0 =
// none: every real key is larger, its low half being an id's complement), best first.
struct RecordPartial {
  uint32_t a;
  uint32_t b;
  unsigned long long keys[kK];
};

// The workspace: the guard's partials [rows, chunks, 4] floats, then the record's [rows, chunks].
struct Workspace {
  float* guard;
  RecordPartial* record;
};

size_t guard_bytes(int32_t rows, int32_t vocab) {
  return align_up(static_cast<size_t>(rows) * static_cast<size_t>(chunks_of(vocab)) *
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
  const uint32_t hi = __reduce_max_sync(kFull, static_cast<uint32_t>(x >> 32));
  const uint32_t lo =
      __reduce_max_sync(kFull, static_cast<uint32_t>(x >> 32) == hi ? static_cast<uint32_t>(x) : 0u);
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

// Where a block ranks its candidates: the logits at or above its bound, one a thread at most.
constexpr int32_t kPool = kThreads;

struct RecordScratch {
  uint32_t sums[2][kWarps];
  float warp_max[kWarps];
  unsigned long long warp_keys[kWarps];
  unsigned long long pool[kPool];
  unsigned long long top[kK];
  uint32_t pool_count;
};

// The usual path: every candidate's rank is the number of candidates above it (keys are
// distinct), in one pass over the pool. Slots from min(n, k) to kK get 0 (none).
__device__ void top_of_pool(int32_t n, int32_t k, RecordScratch& s) {
  const int32_t t = static_cast<int32_t>(threadIdx.x);
  if (t < kK && t >= (n < k ? n : k)) s.top[t] = 0;
  if (t >= n) return;
  const unsigned long long mine = s.pool[t];
  int32_t rank = 0;
  for (int32_t i = 0; i < n; ++i) rank += s.pool[i] > mine ? 1 : 0;
  if (rank < k) s.top[rank] = mine;
}

// When more than kPool logits reach the bound (many equal logits): kK rounds of a block max over
// the keys below the previous round's winner (distinct keys: round r finds the r-th best).
__device__ __forceinline__ void top_by_rounds(const float (&x)[kPerThread], int32_t begin, int32_t vocab, int32_t k,
                              RecordScratch& s) {
  const int32_t t = static_cast<int32_t>(threadIdx.x);
  unsigned long long last = ~0ull;
  for (int32_t r = 0; r < kK; ++r) {
    unsigned long long m = 0;
    if (r < k) {
#pragma unroll
      for (int32_t j = 0; j < kPerThread; ++j) {
        const int32_t i = begin + j * kThreads + t;
        const unsigned long long key = i < vocab ? digest::rank_key(__float_as_uint(x[j]), i) : 0;
        m = key < last && key > m ? key : m;
      }
    }
    m = warp_max_key(m);
    if (t % 32 == 0) s.warp_keys[t / 32] = m;
    __syncthreads();
    unsigned long long best = s.warp_keys[0];
#pragma unroll
    for (int32_t w = 1; w < kWarps; ++w) best = s.warp_keys[w] > best ? s.warp_keys[w] : best;
    __syncthreads();  // every read of this round before the next round's writes
    if (t == 0) s.top[r] = best;
    last = best;
  }
}

// The chunk's record partial from its sanitised values x (−inf past the vocabulary) and each
// thread's largest. The bound, the least of the kWarps warps' largest values, has kWarps >= kK
// logits at or above it (a warp with no logit makes it −inf), so every one of the chunk's k best
// reaches it; typically ~20 of 4096 do and are ranked in one pass, the rounds take the rest.
__device__ __forceinline__ void record_chunk(const float (&x)[kPerThread], int32_t begin, int32_t vocab,
                             float thread_max, int32_t k, RecordPartial* out) {
  __shared__ RecordScratch s;
  const int32_t t = static_cast<int32_t>(threadIdx.x);
  const int32_t lane = t % 32;
  const int32_t warp = t / 32;
  uint32_t a = 0, b = 0;
#pragma unroll
  for (int32_t j = 0; j < kPerThread; ++j) {
    const int32_t i = begin + j * kThreads + t;
    const uint32_t bits = __float_as_uint(x[j]);
    a += i < vocab ? digest::lane_a(bits, static_cast<uint32_t>(i)) : 0u;
    b += i < vocab ? digest::lane_b(bits, static_cast<uint32_t>(i)) : 0u;
  }
  a = __reduce_add_sync(kFull, a);
  b = __reduce_add_sync(kFull, b);
  const float largest = warp_max(thread_max);
  if (lane == 0) {
    s.sums[0][warp] = a;
    s.sums[1][warp] = b;
    s.warp_max[warp] = largest;
  }
  if (t == 0) s.pool_count = 0;
  __syncthreads();
  if (k > 0) {
    float bound = s.warp_max[0];
#pragma unroll
    for (int32_t w = 1; w < kWarps; ++w) bound = fminf(bound, s.warp_max[w]);
#pragma unroll
    for (int32_t j = 0; j < kPerThread; ++j) {
      const int32_t i = begin + j * kThreads + t;
      if (i < vocab && x[j] >= bound) {
        const uint32_t slot = atomicAdd(&s.pool_count, 1u);
        if (slot < static_cast<uint32_t>(kPool)) s.pool[slot] = digest::rank_key(__float_as_uint(x[j]), i);
      }
    }
  }
  __syncthreads();
  const uint32_t n = s.pool_count;  // the same for every thread: the branch is uniform
  if (n > static_cast<uint32_t>(kPool)) {
    top_by_rounds(x, begin, vocab, k, s);
  } else {
    top_of_pool(static_cast<int32_t>(n), k, s);  // k == 0: n == 0, top all 0
  }
  __syncthreads();
  if (t < kK) out->keys[t] = s.top[t];
  if (warp != 0) return;
  const uint32_t ta = __reduce_add_sync(kFull, lane < kWarps ? s.sums[0][lane] : 0u);
  const uint32_t tb = __reduce_add_sync(kFull, lane < kWarps ? s.sums[1][lane] : 0u);
  if (lane == 0) {
    out->a = ta;
    out->b = tb;
  }
}

// ---- the pass ----

// grid: (chunks, rows). Sanitises one chunk of one row in place and writes its partials.
template <bool kRecord>
__global__ void __launch_bounds__(kThreads)
guard_chunk_kernel(float* logits, int32_t vocab, bool want_sum, Workspace w, int32_t top_k) {
  __shared__ float values[32];
  __shared__ int32_t indices[32];
  const int32_t chunk = blockIdx.x;
  const int32_t begin = chunk * kGuardChunk;
  float* row = logits + int64_t{blockIdx.y} * vocab;
  float x[kPerThread];
  ArgMax best{-INFINITY, 0x7fffffff};
  int32_t saw_nan = 0;
#pragma unroll
  for (int32_t k = 0; k < kPerThread; ++k) {
    const int32_t i = begin + k * kThreads + static_cast<int32_t>(threadIdx.x);
    x[k] = i < vocab ? row[i] : -INFINITY;
  }
#pragma unroll
  for (int32_t k = 0; k < kPerThread; ++k) {
    const int32_t i = begin + k * kThreads + static_cast<int32_t>(threadIdx.x);
    if (i >= vocab) continue;
    if (isnan(x[k])) {
      saw_nan = 1;
      x[k] = -kSanitisedMagnitude;
      row[i] = x[k];
    } else if (isinf(x[k])) {
      x[k] = x[k] > 0.0f ? kSanitisedMagnitude : -kSanitisedMagnitude;
      row[i] = x[k];
    }
    if (x[k] > best.value) best = ArgMax{x[k], i};  // ascending i: the first keeps a tie
  }
  const int64_t partial = int64_t{blockIdx.y} * gridDim.x + chunk;
  if constexpr (kRecord) record_chunk(x, begin, vocab, best.value, top_k, w.record + partial);
  const int32_t any_nan = __syncthreads_or(saw_nan);
  best = block_argmax(best, values, indices);
  float sum = 0.0f;
  if (want_sum) {
#pragma unroll
    for (int32_t k = 0; k < kPerThread; ++k) {
      const int32_t i = begin + k * kThreads + static_cast<int32_t>(threadIdx.x);
      if (i < vocab) sum += expf(x[k] - best.value);
    }
    sum = block_sum(sum, values);
  }
  if (threadIdx.x == 0) {
    float* p = w.guard + partial * kGuardPartialFloats;
    p[0] = best.value;
    p[1] = __int_as_float(best.index);
    p[2] = static_cast<float>(any_nan);
    p[3] = sum;
  }
}

// The row's digest and k best pairs from its chunks' record partials, on one warp: the lane
// sums (integer addition: any order gives the same bits), each lane's k best of its chunks, then
// k rounds of a warp max.
__device__ void combine_record(const LogitsPassArgs& g, const RecordPartial* p, int32_t chunks,
                               int32_t r) {
  const int32_t lane = static_cast<int32_t>(threadIdx.x);
  uint32_t a = 0, b = 0;
  unsigned long long best[kK];
#pragma unroll
  for (int32_t j = 0; j < kK; ++j) best[j] = 0;
  for (int32_t c = lane; c < chunks; c += 32) {
    a += p[c].a;
    b += p[c].b;
#pragma unroll
    for (int32_t j = 0; j < kK; ++j) insert_key(best, p[c].keys[j]);
  }
  a = __reduce_add_sync(kFull, a);
  b = __reduce_add_sync(kFull, b);
  const unsigned long long mine = warp_top(best, g.top_k);
  if (lane == 0) g.digests[r] = digest::finish(a, b, static_cast<uint32_t>(g.vocab));
  if (lane < g.top_k) {
    const int32_t id = static_cast<int32_t>(~static_cast<uint32_t>(mine));
    int32_t* pair = g.top + (int64_t{r} * kK + lane) * 2;
    pair[0] = id;
    pair[1] = __float_as_int(g.logits[int64_t{r} * g.vocab + id]);
  }
}

// One warp per row: the chunk partials combined in a fixed order (lane-strided, then butterfly).
template <bool kRecord>
__global__ void guard_combine_kernel(LogitsPassArgs g, Workspace w, int32_t chunks) {
  const int32_t r = blockIdx.x;
  const int32_t lane = threadIdx.x;
  const float* p = w.guard + int64_t{r} * chunks * kGuardPartialFloats;
  ArgMax best{-INFINITY, 0x7fffffff};
  int32_t nan = 0;
  for (int32_t c = lane; c < chunks; c += 32) {
    const float* q = p + c * kGuardPartialFloats;
    best = better(best, ArgMax{q[0], __float_as_int(q[1])});
    nan |= q[2] != 0.0f ? 1 : 0;
  }
  best = warp_argmax(best);
  nan = __any_sync(kFull, nan) ? 1 : 0;
  if (lane == 0) {
    g.nan_flags[r] = nan;
    g.argmax[r] = best.index;
  }
  if constexpr (kRecord) combine_record(g, w.record + int64_t{r} * chunks, chunks, r);
  if (g.row_max == nullptr) return;
  float sum = 0.0f;
  for (int32_t c = lane; c < chunks; c += 32) {
    const float* q = p + c * kGuardPartialFloats;
    sum += q[3] * expf(q[0] - best.value);
  }
  sum = warp_sum(sum);
  if (lane == 0) {
    g.row_max[r] = best.value;
    g.row_sum[r] = sum;
  }
}

template <bool kRecord>
void launch(const LogitsPassArgs& g, cudaStream_t stream) {
  const int32_t chunks = chunks_of(g.vocab);
  const Workspace w = carve(g.workspace, g.rows, g.vocab);
  guard_chunk_kernel<kRecord><<<dim3(chunks, g.rows), kThreads, 0, stream>>>(
      g.logits, g.vocab, g.row_max != nullptr, w, g.top_k);
  guard_combine_kernel<kRecord><<<g.rows, 32, 0, stream>>>(g, w, chunks);
}

}  // namespace

size_t logits_pass_workspace_bytes(int32_t rows, int32_t vocab) {
  return guard_bytes(rows, vocab) +
         align_up(static_cast<size_t>(rows) * static_cast<size_t>(chunks_of(vocab)) *
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
