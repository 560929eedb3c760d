#include "kernels/drafter_ops.h"

namespace ls::kernels {

namespace {

constexpr int32_t kDraftThreads = 256;
static_assert(kDraftNgramMax == 3, "the match scan below checks n = 1, 2, 3");

__device__ __forceinline__ int32_t clamp_id(int32_t id, int32_t vocab_size) {
  return min(max(id, 0), vocab_size - 1);
}

// NgramDrafter::draft over the window h[0 .. length) (h[length − 1] is the bonus), by the whole
// block: every thread calls it with the same arguments. `best` is shared memory [kDraftNgramMax].
//
// For each n the drafter takes the largest start s in [0, length − n − 1] with
// h[s .. s+n) == h[length−n .. length). Thread i scans s = length − 2 − i, − blockDim, … downwards,
// so the first match it meets for an n is its own largest; the block's largest is the max over the
// threads (order-free). A thread that meets an n = 3 match stops: n = 3 then wins for the block,
// whatever the smaller n found.
__device__ void ngram_draft(const int32_t* h, int32_t length, int32_t bonus, int32_t w,
                            int32_t vocab_size, int32_t* next, int32_t* best) {
  if (threadIdx.x < kDraftNgramMax) best[threadIdx.x] = -1;
  __syncthreads();
  const int32_t x1 = h[length - 1];
  const int32_t x2 = length >= 2 ? h[length - 2] : 0;
  const int32_t x3 = length >= 3 ? h[length - 3] : 0;
  int32_t found1 = -1, found2 = -1, found3 = -1;
  for (int32_t s = length - 2 - static_cast<int32_t>(threadIdx.x); s >= 0;
       s -= static_cast<int32_t>(blockDim.x)) {
    const int32_t a = h[s];
    if (found1 < 0 && a == x1) found1 = s;
    if (s > length - 3) continue;
    const int32_t b = h[s + 1];
    if (found2 < 0 && a == x2 && b == x1) found2 = s;
    if (s <= length - 4 && a == x3 && b == x2 && h[s + 2] == x1) {
      found3 = s;
      break;
    }
  }
  if (found1 >= 0) atomicMax(&best[0], found1);
  if (found2 >= 0) atomicMax(&best[1], found2);
  if (found3 >= 0) atomicMax(&best[2], found3);
  __syncthreads();
  if (threadIdx.x != 0) return;
  int32_t n = 0;
  int32_t start = -1;
  for (int32_t k = kDraftNgramMax; k >= 1; --k) {
    if (best[k - 1] >= 0) {
      n = k;
      start = best[k - 1];
      break;
    }
  }
  // Draft k continues the match: index start + n + k of history ++ drafts, always below
  // length + k, so it is a history id or an earlier draft (next[1 + at − length], written above).
  for (int32_t k = 0; k + 1 < w; ++k) {
    int32_t draft = bonus;
    if (n > 0) {
      const int32_t at = start + n + k;
      draft = at < length ? h[at] : next[1 + at - length];
    }
    next[1 + k] = clamp_id(draft, vocab_size);
  }
}

__global__ void __launch_bounds__(kDraftThreads)
ngram_drafts_kernel(const int32_t* histories, int32_t stride, const int32_t* begins,
                    const int32_t* positions, int32_t w, int32_t vocab_size, int32_t* next_inputs) {
  __shared__ int32_t best[kDraftNgramMax];
  const int32_t r = blockIdx.x;
  const int32_t* h = histories + int64_t{r} * stride;
  const int32_t begin = begins[r];
  const int32_t position = positions[r];
  const int32_t bonus = h[position];
  int32_t* next = next_inputs + int64_t{r} * w;
  if (threadIdx.x == 0) next[0] = clamp_id(bonus, vocab_size);
  ngram_draft(h + begin, position - begin + 1, bonus, w, vocab_size, next, best);
}

// History rule 1 for pool row p (CpuBackend::apply_table_writes / reset_lengths): a table write
// of p from column 0 makes this step's owner new; its history starts at p's length reset (the
// last one, as the CPU's loop leaves it). One thread.
__device__ void restart_history(const StepInputs& in, int32_t p, TokenHistory history) {
  const StepHeader& h = *in.header;
  bool fresh = false;
  for (int32_t i = 0; i < h.table_writes_count; ++i) {
    fresh |= in.table_writes[4 * i] == p && in.table_writes[4 * i + 1] == 0;
  }
  if (!fresh) return;
  for (int32_t i = 0; i < h.length_resets_count; ++i) {
    if (in.length_resets[2 * i] == p) history.begin[p] = in.length_resets[2 * i + 1];
  }
}

// One block per op row. Every pool row occurs once in a step (the scheduler gives each request
// its own row), so blocks never touch each other's history or future inputs.
__global__ void __launch_bounds__(kDraftThreads)
record_and_draft_kernel(StepInputs in, DeviceState state, TokenBuffers tokens,
                        TokenHistory history) {
  __shared__ int32_t best[kDraftNgramMax];
  const StepHeader& head = *in.header;
  const int32_t row = blockIdx.x;
  if (row >= head.rows_count) return;  // the whole block: a graph's padded rows
  const int32_t p = in.pool_rows[row];
  const int32_t w = state.verify_width;
  const int32_t vocab = state.vocab_size;
  const int32_t capacity = history.capacity;
  int32_t* h = history.tokens + int64_t{p} * capacity;
  int32_t* next = state.future_inputs + int64_t{p} * w;
  if (threadIdx.x == 0) restart_history(in, p, history);
  const int32_t offset = in.token_offsets[row];
  const int32_t length = in.input_lengths[row];
  for (int32_t t = threadIdx.x; t < length; t += blockDim.x) {
    const int32_t position = tokens.positions[offset + t];
    if (position >= 0 && position < capacity) h[position] = clamp_id(tokens.input_ids[offset + t], vocab);
  }
  // The bonus the finish kernel committed to column 0 (before any forced output replaced it in
  // the result), and where it sits.
  const int32_t bonus = clamp_id(next[0], vocab);
  int32_t position = 0;
  bool draft = true;
  if (row < head.prefill_rows_count) {
    position = in.prefill_prefix[row] + length;
  } else {
    const int32_t vcl_old = state.vcl_before[row];
    const int32_t accepted = state.vcl[p] - vcl_old;
    position = vcl_old + accepted;
    draft = accepted > 0;
  }
  __syncthreads();  // the inputs are written (the bonus may overwrite one of them)
  if (threadIdx.x == 0) {
    if (draft && position >= 0 && position < capacity) h[position] = bonus;
    next[0] = bonus;
  }
  __syncthreads();  // the bonus and history.begin[p] are written
  const int32_t begin = history.begin[p];
  if (!draft || position < begin || position >= capacity) {
    for (int32_t k = 1 + threadIdx.x; k < w; k += blockDim.x) next[k] = bonus;
    return;
  }
  ngram_draft(h + begin, position - begin + 1, bonus, w, vocab, next, best);
}

}  // namespace

cudaError_t launch_ngram_drafts(const int32_t* histories, int32_t history_stride,
                                const int32_t* begins, const int32_t* positions,
                                int32_t rows_count, int32_t verify_width, int32_t vocab_size,
                                int32_t* next_inputs, cudaStream_t stream) {
  if (rows_count < 0 || history_stride < 1 || verify_width < 1 || vocab_size < 1 ||
      histories == nullptr || begins == nullptr || positions == nullptr || next_inputs == nullptr) {
    return cudaErrorInvalidValue;
  }
  if (rows_count == 0) return cudaSuccess;
  ngram_drafts_kernel<<<rows_count, kDraftThreads, 0, stream>>>(
      histories, history_stride, begins, positions, verify_width, vocab_size, next_inputs);
  return cudaGetLastError();
}

cudaError_t launch_record_and_draft(StepInputs in, DeviceState state, TokenBuffers tokens,
                                    TokenHistory history, int32_t rows_grid, cudaStream_t stream) {
  if (rows_grid < 0 || in.header == nullptr || state.future_inputs == nullptr ||
      state.vcl == nullptr || state.vcl_before == nullptr || state.verify_width < 2 ||
      state.vocab_size < 1 || tokens.input_ids == nullptr || tokens.positions == nullptr ||
      history.tokens == nullptr || history.begin == nullptr ||
      history.capacity < state.verify_width) {
    return cudaErrorInvalidValue;
  }
  if (rows_grid == 0) return cudaSuccess;
  record_and_draft_kernel<<<rows_grid, kDraftThreads, 0, stream>>>(in, state, tokens, history);
  return cudaGetLastError();
}

}  // namespace ls::kernels
