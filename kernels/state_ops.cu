#include "kernels/state_ops.h"

namespace ls::kernels {

namespace {

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
  const int32_t column = position / page_size;
  const int32_t id = future_inputs[pool_row * w + t];
  input_ids[token] = min(max(id, 0), vocab_size - 1);
  positions[token] = position;
  slots[token] = column >= table_width
                     ? 0
                     : int64_t{table[pool_row * table_width + column]} * page_size +
                           position % page_size;
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
  constexpr int32_t kThreads = 128;
  fill_decode_inputs_kernel<<<(tokens + kThreads - 1) / kThreads, kThreads, 0, stream>>>(
      pool_rows, tokens, valid_cache_lengths, future_inputs, verify_width, table, table_width,
      page_size, vocab_size, input_ids, positions, slots);
  return cudaGetLastError();
}

}  // namespace ls::kernels
