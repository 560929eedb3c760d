#include "kernels/record_ops.h"

#include "core/digest_math.h"

namespace ls::kernels {

namespace {

constexpr int32_t kThreads = 256;
constexpr int32_t kPerThread = kRecordChunk / kThreads;
constexpr int32_t kK = kTopLogitsCountMax;
constexpr int32_t kWarps = kThreads / 32;
static_assert(kRecordChunk % kThreads == 0);

// One chunk's share of a row: its lane sums and its k best keys (0 = none: every real key is
// larger, its low half being an id's complement).
struct Partial {
  uint32_t a;
  uint32_t b;
  unsigned long long keys[kK];
};

int32_t chunks_of(int32_t vocab) { return (vocab + kRecordChunk - 1) / kRecordChunk; }

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

__device__ __forceinline__ unsigned long long warp_max_key(unsigned long long x) {
  for (int offset = 16; offset > 0; offset >>= 1) {
    const unsigned long long other = __shfl_xor_sync(0xffffffffu, x, offset);
    x = other > x ? other : x;
  }
  return x;
}

__device__ __forceinline__ uint32_t warp_sum_u32(uint32_t x) {
  for (int offset = 16; offset > 0; offset >>= 1) x += __shfl_xor_sync(0xffffffffu, x, offset);
  return x;
}

// Sum over the block (exact: integer addition). Every thread receives it.
__device__ uint32_t block_sum_u32(uint32_t x, uint32_t* scratch) {
  x = warp_sum_u32(x);
  __syncthreads();
  if (threadIdx.x % 32 == 0) scratch[threadIdx.x / 32] = x;
  __syncthreads();
  uint32_t total = 0;
  for (int32_t w = 0; w < kWarps; ++w) total += scratch[w];
  return total;
}

// The block's kK best keys, each thread holding a descending list: kK rounds of a block-wide
// max of the lists' heads, the owner of the winner popping it (keys are distinct: ids are).
__device__ void block_top(unsigned long long (&best)[kK], unsigned long long* scratch,
                          unsigned long long* out) {
  for (int32_t round = 0; round < kK; ++round) {
    const unsigned long long head = warp_max_key(best[0]);
    __syncthreads();
    if (threadIdx.x % 32 == 0) scratch[threadIdx.x / 32] = head;
    __syncthreads();
    unsigned long long winner = 0;
    for (int32_t w = 0; w < kWarps; ++w) winner = scratch[w] > winner ? scratch[w] : winner;
    if (winner != 0 && best[0] == winner) {
#pragma unroll
      for (int32_t j = 0; j + 1 < kK; ++j) best[j] = best[j + 1];
      best[kK - 1] = 0;
    }
    if (threadIdx.x == 0) out[round] = winner;
  }
}

// grid (chunks + 1, rows): blocks x < chunks digest and rank chunk x of logits row y; the last
// chunk of a row to finish combines the row's partials. Blocks x == chunks snapshot op row y.
__global__ void __launch_bounds__(kThreads)
record_kernel(const StepHeader* header, int32_t static_logits_rows, StepInputs in,
              DeviceState state, const float* logits, int32_t vocab, int32_t k,
              Partial* partials, uint32_t* counters, RecordBuffers out) {
  __shared__ uint32_t sums[kWarps];
  __shared__ unsigned long long heads[kWarps];
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
  uint32_t a = 0, b = 0;
  unsigned long long best[kK];
#pragma unroll
  for (int32_t j = 0; j < kK; ++j) best[j] = 0;
#pragma unroll 8
  for (int32_t j = 0; j < kPerThread; ++j) {
    const int32_t i = begin + j * kThreads + static_cast<int32_t>(threadIdx.x);
    if (i >= vocab) break;
    const uint32_t bits = __float_as_uint(row[i]);
    a += digest::lane_a(bits, static_cast<uint32_t>(i));
    b += digest::lane_b(bits, static_cast<uint32_t>(i));
    if (k > 0) insert_key(best, digest::rank_key(bits, i));
  }
  a = block_sum_u32(a, sums);
  b = block_sum_u32(b, sums);
  if (k > 0) block_top(best, heads, chunk_keys);
  __syncthreads();
  Partial* mine = partials + int64_t{y} * chunks + blockIdx.x;
  if (threadIdx.x == 0) {
    mine->a = a;
    mine->b = b;
    for (int32_t j = 0; j < kK; ++j) mine->keys[j] = k > 0 ? chunk_keys[j] : 0;
    __threadfence();  // the partial is visible before the count that announces it
    last = atomicAdd(counters + y, 1u) == static_cast<uint32_t>(chunks - 1) ? 1 : 0;
  }
  __syncthreads();
  if (!last) return;
  // The row's last chunk: combine every chunk's partial (read past L1: other blocks wrote them).
  __threadfence();
  const Partial* all = partials + int64_t{y} * chunks;
  uint32_t ra = 0, rb = 0;
#pragma unroll
  for (int32_t j = 0; j < kK; ++j) best[j] = 0;
  for (int32_t c = threadIdx.x; c < chunks; c += kThreads) {
    ra += __ldcg(&all[c].a);
    rb += __ldcg(&all[c].b);
    for (int32_t j = 0; j < kK; ++j) insert_key(best, __ldcg(&all[c].keys[j]));
  }
  ra = block_sum_u32(ra, sums);
  rb = block_sum_u32(rb, sums);
  if (k > 0) block_top(best, heads, chunk_keys);
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
