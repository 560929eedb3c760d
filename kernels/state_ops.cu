#include "kernels/state_ops.h"

#include "core/ops/slot.h"

namespace ls::kernels {

namespace {

constexpr int32_t kThreads = 128;

__global__ void fill_decode_inputs_kernel(const int32_t* pool_rows, int32_t tokens_count,
                                          const int32_t* vcl, const int32_t* future_inputs,
                                          int32_t w, const int32_t* table, int32_t table_width,
                                          int32_t page_size, int32_t vocab_size,
                                          int32_t* input_ids, int32_t* positions, int64_t* slots) {
  const int32_t token = blockIdx.x * blockDim.x + threadIdx.x;
  if (token >= tokens_count) return;
  const int32_t row = token / w;
  const int32_t t = token % w;
  const int32_t pool_row = pool_rows[row];
  const int32_t position = vcl[pool_row] + t;
  const int32_t id = future_inputs[pool_row * w + t];
  input_ids[token] = min(max(id, 0), vocab_size - 1);
  positions[token] = position;
  slots[token] = ops::slot_for(table + int64_t{pool_row} * table_width, table_width, page_size, position);
}

__global__ void apply_table_writes_kernel(StepInputs in, DeviceState state) {
  const int32_t w = blockIdx.x;
  if (w >= in.header->table_writes_count) return;
  const int32_t* write = in.table_writes + 4 * w;
  int32_t* row = state.table + int64_t{write[0]} * state.table_width + write[1];
  const int32_t* pages = in.table_pages + write[2];
  for (int32_t j = threadIdx.x; j < write[3]; j += blockDim.x) row[j] = pages[j];
}

// One thread, in order: two resets of one pool row (never planned, but legal) keep the last.
__global__ void reset_lengths_kernel(StepInputs in, DeviceState state) {
  const int32_t count = in.header->length_resets_count;
  for (int32_t i = 0; i < count; ++i) {
    state.vcl[in.length_resets[2 * i]] = in.length_resets[2 * i + 1];
  }
}

__global__ void prepare_rows_kernel(StepInputs in, DeviceState state, int32_t rows_grid) {
  const int32_t row = blockIdx.x * blockDim.x + threadIdx.x;
  if (row >= rows_grid || row >= in.header->rows_count) return;
  const int32_t p = in.pool_rows[row];
  state.vcl_before[row] = state.vcl[p];
  const int32_t ne = in.header->prefill_rows_count;
  if (row < ne) return;
  const int32_t override_id = in.decode_overrides[row - ne];
  if (override_id == -1) return;
  const int32_t w = state.verify_width;
  int32_t* fim = state.future_inputs + int64_t{p} * w;
  fim[0] = override_id;
  // Recovered rows have no real drafts: the extra columns are dummies (seed spec §3.2 c).
  if (in.force_single[row - ne]) {
    for (int32_t t = 1; t < w; ++t) fim[t] = override_id;
  }
}

// The row holding token t: the last row whose first token is <= t (offsets ascend).
__device__ int32_t row_of_token(const int32_t* token_offsets, int32_t rows_count, int32_t t) {
  int32_t lo = 0, hi = rows_count - 1;
  while (lo < hi) {
    const int32_t mid = (lo + hi + 1) / 2;
    if (token_offsets[mid] <= t) lo = mid; else hi = mid - 1;
  }
  return lo;
}

__global__ void fill_tokens_kernel(StepInputs in, DeviceState state, TokenBuffers tokens) {
  const int32_t t = blockIdx.x * blockDim.x + threadIdx.x;
  if (t >= tokens.tokens_max) return;
  const StepHeader& h = *in.header;
  if (t >= h.tokens_count) {
    tokens.input_ids[t] = kPadInputId;
    tokens.positions[t] = 0;
    tokens.slots[t] = 0;
    tokens.token_pool_rows[t] = state.sentinel_pool_row;
    return;
  }
  const int32_t row = row_of_token(in.token_offsets, h.rows_count, t);
  const int32_t p = in.pool_rows[row];
  const int32_t i = t - in.token_offsets[row];
  int32_t id = 0;
  int32_t start = 0;
  if (row < h.prefill_rows_count) {
    start = in.prefill_prefix[row];
    id = in.prefill_ids[t];  // prefill tokens lead the token buffer, row by row
  } else {
    start = state.vcl_before[row];
    id = state.future_inputs[int64_t{p} * state.verify_width + i];
  }
  const int32_t position = start + i;
  tokens.input_ids[t] = min(max(id, 0), state.vocab_size - 1);
  tokens.positions[t] = position;
  tokens.slots[t] = ops::slot_for(state.table + int64_t{p} * state.table_width, state.table_width,
                            state.page_size, position);
  tokens.token_pool_rows[t] = p;
}

bool valid_state(const DeviceState& s) {
  return s.table != nullptr && s.vcl != nullptr && s.future_inputs != nullptr &&
         s.vcl_before != nullptr && s.table_width >= 1 && s.page_size >= 1 &&
         s.verify_width >= 1 && s.vocab_size >= 1;
}

}  // namespace

cudaError_t launch_fill_decode_inputs(const int32_t* pool_rows, int32_t rows_count,
                                      const int32_t* valid_cache_lengths,
                                      const int32_t* future_inputs, int32_t verify_width,
                                      const int32_t* table, int32_t table_width,
                                      int32_t page_size, int32_t vocab_size, int32_t* input_ids,
                                      int32_t* positions, int64_t* slots, cudaStream_t stream) {
  if (rows_count < 0 || verify_width < 1 || table_width < 1 || page_size < 1 || vocab_size < 1) {
    return cudaErrorInvalidValue;
  }
  if (rows_count == 0) return cudaSuccess;
  const int32_t tokens = rows_count * verify_width;
  fill_decode_inputs_kernel<<<(tokens + kThreads - 1) / kThreads, kThreads, 0, stream>>>(
      pool_rows, tokens, valid_cache_lengths, future_inputs, verify_width, table, table_width,
      page_size, vocab_size, input_ids, positions, slots);
  return cudaGetLastError();
}

cudaError_t launch_apply_table_writes(StepInputs in, DeviceState state, int32_t writes_grid,
                                      cudaStream_t stream) {
  if (writes_grid < 0 || !valid_state(state) || in.header == nullptr) return cudaErrorInvalidValue;
  if (writes_grid == 0) return cudaSuccess;
  apply_table_writes_kernel<<<writes_grid, kThreads, 0, stream>>>(in, state);
  return cudaGetLastError();
}

cudaError_t launch_reset_lengths(StepInputs in, DeviceState state, cudaStream_t stream) {
  if (!valid_state(state) || in.header == nullptr) return cudaErrorInvalidValue;
  reset_lengths_kernel<<<1, 1, 0, stream>>>(in, state);
  return cudaGetLastError();
}

cudaError_t launch_fill_inputs(StepInputs in, DeviceState state, TokenBuffers tokens,
                               int32_t rows_grid, cudaStream_t stream) {
  if (rows_grid < 0 || tokens.tokens_max < 1 || !valid_state(state) || in.header == nullptr) {
    return cudaErrorInvalidValue;
  }
  if (rows_grid > 0) {
    prepare_rows_kernel<<<(rows_grid + kThreads - 1) / kThreads, kThreads, 0, stream>>>(
        in, state, rows_grid);
  }
  fill_tokens_kernel<<<(tokens.tokens_max + kThreads - 1) / kThreads, kThreads, 0, stream>>>(
      in, state, tokens);
  return cudaGetLastError();
}

}  // namespace ls::kernels
