// The device-side view of one step, shared by the CUDA backend and its kernels. Plain data only
// (no CUDA types), so it compiles as C++17 in .cu files and as C++20 in host files.
//
// The backend packs a StepPlan into pinned host staging with this layout and copies it to the
// device once per step. Counts live in the device-resident StepHeader rather than in kernel
// arguments, so a CUDA graph captured for a padded batch size reads each step's real counts.
#pragma once

#include <cstdint>

namespace ls::kernels {

// Sampling of one op row as the device sampler reads it (a ResolvedSampling, flattened).
struct SamplingRow {
  uint32_t seed_lo = 0;
  uint32_t seed_hi = 0;
  float temperature = 1.0f;
  int32_t top_k = 1;  // 1 = greedy
  float top_p = 1.0f;
  float min_p = 0.0f;
};

struct StepHeader {
  int32_t rows_count = 0;          // bs, real rows (a graph's padded rows are past it)
  int32_t prefill_rows_count = 0;  // ne
  int32_t tokens_count = 0;        // T, real tokens
  int32_t verify_width = 1;        // W
  int32_t logits_rows_count = 0;   // ne + nd·W
  int32_t table_writes_count = 0;
  int32_t length_resets_count = 0;
  int32_t forced_count = 0;
  int32_t want_logprobs = 0;
  int32_t reserved[7] = {};
};
static_assert(sizeof(StepHeader) == 64, "the header is one 64-byte block");

// Device pointers into the staged step (all inside one device buffer).
struct StepInputs {
  const StepHeader* header;
  const int32_t* pool_rows;           // [rows_max]; padded rows hold the sentinel pool row
  const int32_t* input_lengths;       // [rows_max]
  const int32_t* token_offsets;       // [rows_max] first token of each row
  const int32_t* prefill_prefix;      // [rows_max] by prefill row
  const int32_t* decode_overrides;    // [rows_max] by decode row (row − ne); −1 = none
  const int32_t* force_single;        // [rows_max] by decode row
  const int32_t* logits_token_index;  // [logits_rows_max]
  const SamplingRow* sampling;        // [rows_max]
  const int32_t* table_writes;        // [rows_max, 4] pool row, begin, pages offset, pages count
  const int32_t* length_resets;       // [rows_max, 2] pool row, length
  const int32_t* forced_outputs;      // [logits_rows_max, 2] result index, id
  const int32_t* prefill_ids;         // [prefill_chunk_tokens] by token index
  const int32_t* table_pages;         // [rows_max · table_width]
};

// Device-resident executor state (DESIGN.md "Device-resident state"), one row per pool index.
struct DeviceState {
  int32_t* table;          // [pool rows, table_width] req_to_page
  int32_t* vcl;            // [pool rows] valid_cache_lengths
  int32_t* future_inputs;  // [pool rows, W] future_input_map
  int32_t* vcl_before;     // [rows_max] each row's vcl at fill time (the context clamp's vcl_old)
  int32_t table_width;
  int32_t page_size;
  int32_t verify_width;
  int32_t vocab_size;
  int32_t context_length;
  int32_t sentinel_pool_row;
};

// The step's token buffers, written by the fill and read by the forward.
struct TokenBuffers {
  int32_t* input_ids;        // [step_tokens_max]
  int32_t* positions;        // [step_tokens_max]
  int64_t* slots;            // [step_tokens_max]
  int32_t* token_pool_rows;  // [step_tokens_max]
  int32_t tokens_max;
};

// The packed result the finish kernel writes and the host copies back in one transfer.
struct ResultBuffers {
  int32_t* tokens;            // [logits_rows_max] [ne sampled][nd × W verify outputs]
  int32_t* accepted_lengths;  // [rows_max]
  int32_t* nan_flags;         // [rows_max]
  int32_t* oov_flags;         // [rows_max]
  float* logprobs;            // [logits_rows_max]
};

constexpr int32_t kPadInputId = 1;  // what padded and scrubbed tokens read (seed spec invariant 9)

}  // namespace ls::kernels
