#include "kernels/record_ops.h"

#include "core/digest_math.h"

namespace ls::kernels {

namespace {

constexpr int32_t kThreads = 256;
constexpr int32_t kPerThread = kRecordChunk / kThreads;
constexpr int32_t kK = kTopLogitsCountMax;
constexpr int32_t kWarps = kThreads / 32;
constexpr uint32_t kFull = 0xffffffffu;
static_assert(kRecordChunk % kThreads == 0);
static_assert(kWarps * kK == 64, "the block's candidates are two per lane of one warp");
static_assert(kPerThread >= kK, "the combine keeps a thread's kK best in its kPerThread keys");

// One chunk's share of a row: its lane sums and its k best keys (0 = none: every real key is
// larger, its low half being an id's complement).
struct Partial {
  uint32_t a;
  uint32_t b;
  unsigned long long keys[kK];
};

int32_t chunks_of(int32_t vocab) { return (vocab + kRecordChunk - 1) / kRecordChunk; }

// Inserts `key` into `best` (descending): a compare-and-swap chain, unrolled into registers.
// Only the combine of more than kCombineDirect chunks uses it (vocabularies above 512 Ki).
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
// (one lane: keys are distinct) recomputes its head, so no lane keeps a sorted list.
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

// Where a block ranks its candidates: the keys at or above its threshold, one a thread at most.
constexpr int32_t kPool = kThreads;

// The block's shared memory for block_partial.
struct BlockScratch {
  uint32_t sums[2][kWarps];
  unsigned long long candidates[kWarps * kK];  // the general path's per-warp k best
  unsigned long long warp_max[kWarps];         // each warp's largest key
  unsigned long long pool[kPool];              // the threshold path's candidates
  uint32_t pool_count;
};

// The general path (any keys, e.g. all logits equal): k rounds of a warp max per warp, then k
// over the warps' candidates in warp 0. Writes top[0, kK) from warp 0.
template <int32_t N>
__device__ void block_top_rounds(unsigned long long (&keys)[N], int32_t k, BlockScratch& s,
                                 unsigned long long* top) {
  const int32_t lane = static_cast<int32_t>(threadIdx.x % 32);
  const int32_t warp = static_cast<int32_t>(threadIdx.x / 32);
  const unsigned long long mine = warp_top(keys, k);
  if (lane < kK) s.candidates[warp * kK + lane] = mine;
  __syncthreads();
  if (warp != 0) return;
  unsigned long long two[2] = {s.candidates[lane], s.candidates[lane + 32]};
  const unsigned long long best = warp_top(two, k);
  if (lane < kK) top[lane] = best;
}

// The threshold path, when at most kPool keys reach `bound` (a lower bound on the block's kK-th
// best key, so the candidates hold every key of the k best): each candidate's rank is the number
// of candidates above it (keys are distinct), in one pass over the pool, no dependent rounds.
// Slots from min(candidates, k) to kK get 0 (none), as the general path leaves them.
__device__ void block_top_ranked(int32_t n, int32_t k, const BlockScratch& s,
                                 unsigned long long* top) {
  const int32_t t = static_cast<int32_t>(threadIdx.x);
  if (t < kK && t >= (n < k ? n : k)) top[t] = 0;
  if (t >= n) return;
  const unsigned long long mine = s.pool[t];
  int32_t rank = 0;
  for (int32_t i = 0; i < n; ++i) rank += s.pool[i] > mine ? 1 : 0;
  if (rank < k) top[rank] = mine;
}

// The block's lane sums (exact: integer addition) into block_a/block_b (thread 0) and its k best
// keys into `top` [kK], from every thread's `keys` (0 = none); `top` is valid after the caller's
// __syncthreads(). The bound: the least of the kWarps warps' largest keys — kWarps >= kK distinct
// keys are at or above it, so it is <= the block's kK-th best and every key of the k best passes
// it (>=: ties at the bound are the bound itself). Typically ~20 of 2048 pass and are ranked in
// one pass; when more than kPool do (many equal logits), the general path ranks them.
template <int32_t N>
__device__ void block_partial(uint32_t a, uint32_t b, unsigned long long (&keys)[N], int32_t k,
                              BlockScratch& s, unsigned long long* top, uint32_t& block_a,
                              uint32_t& block_b) {
  static_assert(kWarps >= kK, "the bound needs kK distinct warp maxima");
  const int32_t lane = static_cast<int32_t>(threadIdx.x % 32);
  const int32_t warp = static_cast<int32_t>(threadIdx.x / 32);
  a = __reduce_add_sync(kFull, a);
  b = __reduce_add_sync(kFull, b);
  const unsigned long long warp_max = k > 0 ? warp_max_key(max_key(keys)) : 0;
  if (lane == 0) {
    s.sums[0][warp] = a;
    s.sums[1][warp] = b;
    s.warp_max[warp] = warp_max;
  }
  if (threadIdx.x == 0) s.pool_count = 0;
  __syncthreads();
  if (k > 0) {
    unsigned long long bound = s.warp_max[0];
#pragma unroll
    for (int32_t w = 1; w < kWarps; ++w) bound = s.warp_max[w] < bound ? s.warp_max[w] : bound;
#pragma unroll
    for (int32_t j = 0; j < N; ++j) {
      if (keys[j] != 0 && keys[j] >= bound) {
        const uint32_t slot = atomicAdd(&s.pool_count, 1u);
        if (slot < static_cast<uint32_t>(kPool)) s.pool[slot] = keys[j];
      }
    }
  }
  __syncthreads();
  const uint32_t n = s.pool_count;  // the same for every thread: the branch below is uniform
  if (n > static_cast<uint32_t>(kPool)) {
    block_top_rounds(keys, k, s, top);
  } else {
    block_top_ranked(static_cast<int32_t>(n), k, s, top);  // k == 0: n == 0, top all 0
  }
  if (warp != 0) return;
  uint32_t ta = lane < kWarps ? s.sums[0][lane] : 0u;
  uint32_t tb = lane < kWarps ? s.sums[1][lane] : 0u;
  block_a = __reduce_add_sync(kFull, ta);
  block_b = __reduce_add_sync(kFull, tb);
}

// Chunks whose partials the combine reads in one load per key (kPerThread keys a thread).
constexpr int32_t kCombineDirect = kThreads * kPerThread / kK;

// The row's combine, by the block that finished its last chunk: the same two-level reduction
// over every chunk's partial (read past L1: other blocks wrote them).
__device__ void combine_row(const Partial* all, int32_t chunks, int32_t k, BlockScratch& s,
                            unsigned long long* top, uint32_t& row_a, uint32_t& row_b) {
  uint32_t a = 0, b = 0;
  unsigned long long keys[kPerThread];
#pragma unroll
  for (int32_t j = 0; j < kPerThread; ++j) {
    const int32_t slot = j * kThreads + static_cast<int32_t>(threadIdx.x);  // chunk slot / kK
    const int32_t c = slot / kK;
    keys[j] = c < chunks && k > 0 ? __ldcg(&all[c].keys[slot % kK]) : 0;
  }
  for (int32_t c = static_cast<int32_t>(threadIdx.x); c < chunks; c += kThreads) {
    a += __ldcg(&all[c].a);
    b += __ldcg(&all[c].b);
  }
  if (chunks > kCombineDirect && k > 0) {  // past 512 Ki logits: the rest inserted
    unsigned long long extra[kK];
#pragma unroll
    for (int32_t j = 0; j < kK; ++j) extra[j] = 0;
    for (int32_t c = kCombineDirect + static_cast<int32_t>(threadIdx.x); c < chunks; c += kThreads) {
      for (int32_t j = 0; j < kK; ++j) insert_key(extra, __ldcg(&all[c].keys[j]));
    }
    for (int32_t j = 0; j < kK; ++j) insert_key(extra, keys[j]);
#pragma unroll
    for (int32_t j = 0; j < kK; ++j) keys[j] = extra[j];
#pragma unroll
    for (int32_t j = kK; j < kPerThread; ++j) keys[j] = 0;
  }
  block_partial(a, b, keys, k, s, top, row_a, row_b);
}

// grid (chunks + 1, rows): blocks x < chunks digest and rank chunk x of logits row y; the last
// chunk of a row to finish combines the row's partials. Blocks x == chunks snapshot op row y.
__global__ void __launch_bounds__(kThreads)
record_kernel(const StepHeader* header, int32_t static_logits_rows, StepInputs in,
              DeviceState state, const float* logits, int32_t vocab, int32_t k,
              Partial* partials, uint32_t* counters, RecordBuffers out) {
  __shared__ BlockScratch scratch;
  __shared__ unsigned long long chunk_keys[kK];
  __shared__ int32_t last;
  const int32_t chunks = static_cast<int32_t>(gridDim.x) - 1;
  const int32_t y = blockIdx.y;
  if (static_cast<int32_t>(blockIdx.x) == chunks) {
    if (header == nullptr || y >= header->rows_count) return;
    const int32_t p = in.pool_rows[y];
    const int32_t w = state.verify_width;
    if (threadIdx.x == 0) out.vcl[y] = state.vcl[p];
    for (int32_t t = threadIdx.x; t < w; t += kThreads) {
      out.future_inputs[int64_t{y} * w + t] = state.future_inputs[int64_t{p} * w + t];
    }
    for (int32_t t = threadIdx.x; t < state.table_width; t += kThreads) {
      out.table[int64_t{y} * state.table_width + t] = state.table[int64_t{p} * state.table_width + t];
    }
    return;
  }
  const int32_t rows = header != nullptr ? header->logits_rows_count : static_logits_rows;
  if (y >= rows) return;
  const float* row = logits + int64_t{y} * vocab;
  const int32_t begin = blockIdx.x * kRecordChunk;
  // Every load issued before any use (independent, coalesced); the digest mix is a few integer
  // operations per logit, and the top-k ranks only the few keys at or above a bound (block_partial).
  uint32_t a = 0, b = 0;
  unsigned long long keys[kPerThread];
#pragma unroll
  for (int32_t j = 0; j < kPerThread; ++j) {
    const int32_t i = begin + j * kThreads + static_cast<int32_t>(threadIdx.x);
    const uint32_t bits = i < vocab ? __float_as_uint(row[i]) : 0u;
    keys[j] = i < vocab ? digest::rank_key(bits, i) : 0;
    a += i < vocab ? digest::lane_a(bits, static_cast<uint32_t>(i)) : 0u;
    b += i < vocab ? digest::lane_b(bits, static_cast<uint32_t>(i)) : 0u;
  }
  uint32_t chunk_a = 0, chunk_b = 0;
  block_partial(a, b, keys, k, scratch, chunk_keys, chunk_a, chunk_b);
  __syncthreads();  // chunk_keys: any thread may have written a rank
  Partial* mine = partials + int64_t{y} * chunks + blockIdx.x;
  if (threadIdx.x < kK) mine->keys[threadIdx.x] = chunk_keys[threadIdx.x];
  if (threadIdx.x == 0) {
    mine->a = chunk_a;
    mine->b = chunk_b;
  }
  if (threadIdx.x < 32) {
    __threadfence();  // the partial is visible before the count that announces it
    __syncwarp();
    if (threadIdx.x == 0) {
      last = atomicAdd(counters + y, 1u) == static_cast<uint32_t>(chunks - 1) ? 1 : 0;
    }
  }
  __syncthreads();
  if (!last) return;
  __threadfence();
  uint32_t ra = 0, rb = 0;
  combine_row(partials + int64_t{y} * chunks, chunks, k, scratch, chunk_keys, ra, rb);
  __syncthreads();
  if (threadIdx.x == 0) {
    counters[y] = 0;  // ready for the next step (stream-ordered)
    out.digests[y] = digest::finish(ra, rb, static_cast<uint32_t>(vocab));
  }
  if (static_cast<int32_t>(threadIdx.x) < k) {
    const unsigned long long key = chunk_keys[threadIdx.x];
    const int32_t id = static_cast<int32_t>(~static_cast<uint32_t>(key));
    out.top[(int64_t{y} * kK + threadIdx.x) * 2] = id;
    out.top[(int64_t{y} * kK + threadIdx.x) * 2 + 1] = __float_as_int(row[id]);
  }
}

size_t align_up(size_t bytes) { return (bytes + 255) / 256 * 256; }

}  // namespace

// Layout: the per-row counters first, then the partials, both sized for `logits_rows_max`.
size_t record_workspace_bytes(int32_t logits_rows_max, int32_t vocab) {
  const size_t rows = static_cast<size_t>(logits_rows_max);
  return align_up(rows * sizeof(uint32_t)) +
         align_up(rows * static_cast<size_t>(chunks_of(vocab)) * sizeof(Partial));
}

namespace {

cudaError_t launch(const StepHeader* header, int32_t static_rows, StepInputs in, DeviceState state,
                   const float* logits, int32_t vocab, int32_t logits_rows_grid, int32_t rows_grid,
                   int32_t k, void* workspace, int32_t workspace_rows, RecordBuffers out,
                   cudaStream_t stream) {
  if (vocab < 1 || logits_rows_grid < 0 || rows_grid < 0 || k < 0 || k > kK || k > vocab ||
      logits_rows_grid > workspace_rows ||
      logits == nullptr || workspace == nullptr || out.digests == nullptr || out.top == nullptr) {
    return cudaErrorInvalidValue;
  }
  const int32_t grid_rows = logits_rows_grid > rows_grid ? logits_rows_grid : rows_grid;
  if (grid_rows == 0) return cudaSuccess;
  if (grid_rows > 65535) return cudaErrorInvalidValue;
  const int32_t chunks = chunks_of(vocab);
  auto* counters = static_cast<uint32_t*>(workspace);
  auto* partials = reinterpret_cast<Partial*>(
      static_cast<char*>(workspace) + align_up(static_cast<size_t>(workspace_rows) * sizeof(uint32_t)));
  record_kernel<<<dim3(chunks + 1, grid_rows), kThreads, 0, stream>>>(
      header, static_rows, in, state, logits, vocab, k, partials, counters, out);
  return cudaGetLastError();
}

}  // namespace

cudaError_t launch_record_step(StepInputs in, DeviceState state, const float* logits,
                               int32_t vocab, int32_t logits_rows_grid, int32_t rows_grid,
                               int32_t k, void* workspace, int32_t workspace_rows,
                               RecordBuffers out, cudaStream_t stream) {
  if (in.header == nullptr || out.vcl == nullptr || out.future_inputs == nullptr ||
      out.table == nullptr) {
    return cudaErrorInvalidValue;
  }
  return launch(in.header, 0, in, state, logits, vocab, logits_rows_grid, rows_grid, k, workspace,
                workspace_rows, out, stream);
}

cudaError_t launch_record_logits(const float* logits, int32_t rows, int32_t vocab, int32_t k,
                                 void* workspace, int32_t workspace_rows, uint64_t* digests,
                                 int32_t* top, cudaStream_t stream) {
  RecordBuffers out{};
  out.digests = digests;
  out.top = top;
  return launch(nullptr, rows, StepInputs{}, DeviceState{}, logits, vocab, rows, 0, k, workspace,
                workspace_rows, out, stream);
}

}  // namespace ls::kernels
