// Device state ops of the CUDA backend. Launchers take raw device pointers, sizes and a stream,
// validate their arguments, and return the launch status (STYLE.md §2–3).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace ls::kernels {

// Rule 3 for decode rows: for row r with pool row p = pool_rows[r] and c = vcl[p], token r·W + t
// reads future_inputs[p, t] (clamped to [0, vocab_size)), position c + t, and the slot
// table[p, (c+t)/P]·P + (c+t)%P, or 0 (the dummy slot) when the column is past the table.
cudaError_t launch_fill_decode_inputs(const int32_t* pool_rows, int32_t rows_count,
                                      const int32_t* valid_cache_lengths,
                                      const int32_t* future_inputs, int32_t verify_width,
                                      const int32_t* table, int32_t table_width,
                                      int32_t page_size, int32_t vocab_size, int32_t* input_ids,
                                      int32_t* positions, int64_t* slots, cudaStream_t stream);

}  // namespace ls::kernels
