// The CUDA backend's step layouts (STYLE.md §4–5): the word offsets of the staged step and of the
// packed results, and the decode buckets. Host-only plain arithmetic: no CUDA call. Every device
// buffer's size is written once, in cuda_backend_setup.cpp's lay_out_buffers.
#pragma once

#include "core/backend.h"
#include "core/config.h"
#include "core/tensor_parallel.h"
#include "kernels/cuda_backend.h"
#include "kernels/step_layout.h"

#include <cstddef>
#include <cstdint>
#include <utility>
#include <vector>

namespace ls {

constexpr int32_t kHeaderWords = sizeof(kernels::StepHeader) / sizeof(int32_t);
constexpr int32_t kSamplingWords = sizeof(kernels::SamplingRow) / sizeof(int32_t);
static_assert(sizeof(kernels::SamplingRow) % sizeof(int32_t) == 0);

// Word offsets of each array in the staged step (host pinned and device alike). Every array is
// sized from the limits; the step copies [0, prefill_ids + its prefill tokens) and then the used
// part of table_pages.
struct StagingLayout {
  size_t pool_rows, input_lengths, token_offsets, prefill_prefix, decode_overrides, force_single;
  size_t logits_token_index, sampling, table_writes, length_resets, forced, prefill_ids;
  size_t table_pages, words;

  StagingLayout(int32_t rows_max, int32_t logits_rows_max, int32_t prefill_tokens_max,
                int32_t table_width) {
    size_t at = kHeaderWords;
    auto take = [&at](size_t count) { return std::exchange(at, at + count); };
    const size_t b = static_cast<size_t>(rows_max);
    const size_t r = static_cast<size_t>(logits_rows_max);
    pool_rows = take(b), input_lengths = take(b), token_offsets = take(b);
    prefill_prefix = take(b), decode_overrides = take(b), force_single = take(b);
    logits_token_index = take(r), sampling = take(b * kSamplingWords);
    table_writes = take(4 * b), length_resets = take(2 * b), forced = take(2 * r);
    prefill_ids = take(static_cast<size_t>(prefill_tokens_max));
    table_pages = take(b * static_cast<size_t>(table_width));
    words = at;
  }

  kernels::StepInputs inputs(const int32_t* base) const {
    return kernels::StepInputs{
        .header = reinterpret_cast<const kernels::StepHeader*>(base),
        .pool_rows = base + pool_rows,
        .input_lengths = base + input_lengths,
        .token_offsets = base + token_offsets,
        .prefill_prefix = base + prefill_prefix,
        .decode_overrides = base + decode_overrides,
        .force_single = base + force_single,
        .logits_token_index = base + logits_token_index,
        .sampling = reinterpret_cast<const kernels::SamplingRow*>(base + sampling),
        .table_writes = base + table_writes,
        .length_resets = base + length_resets,
        .forced_outputs = base + forced,
        .prefill_ids = base + prefill_ids,
        .table_pages = base + table_pages,
    };
  }
};

// Word offsets of the packed results: what the finish kernel writes, then what a trace records
// (ExecutorOptions::record): digests by logits row, a hybrid's state digests by op row (only
// when `state_digests`: a model without recurrent state copies none back), top-k pairs by logits
// row, then vcl, future inputs and table row by op row, the table last so that a step copies back
// only its own rows of it.
struct ResultsLayout {
  size_t base_words, digests, mamba_digests, top, vcl, future_inputs, table, words;
  int32_t table_width;

  ResultsLayout(int32_t rows_max, int32_t logits_rows_max, int32_t verify_width, int32_t width,
                bool state_digests)
      : table_width(width) {
    const size_t b = static_cast<size_t>(rows_max);
    const size_t r = static_cast<size_t>(logits_rows_max);
    base_words = 2 * r + 3 * b;
    size_t at = (base_words + 1) / 2 * 2;  // the digests are 8-byte words
    auto take = [&at](size_t count) { return std::exchange(at, at + count); };
    digests = take(2 * r);
    mamba_digests = take(state_digests ? 2 * b : 0);
    top = take(r * kTopLogitsCountMax * 2);
    vcl = take(b);
    future_inputs = take(b * static_cast<size_t>(verify_width));
    table = take(b * static_cast<size_t>(width));
    words = at;
  }
  // Words a step copies back: the finish kernel's part, and with a record its rows' state.
  size_t copy_words(const StepPlan& plan) const {
    if (!plan.record) return base_words;
    return table + static_cast<size_t>(plan.rows_count) * static_cast<size_t>(table_width);
  }
};

// Batch sizes that decode steps are padded to (and graphs captured at): 1, 2, 4, 8, then
// multiples of 8, and max_batch_rows itself.
std::vector<int32_t> decode_buckets(int32_t rows_max);

// Whether a backend of these options drafts: the n-gram drafter with W > 1 (with W = 1 a drafter
// has no columns to fill, as on the CPU).
bool drafts_ngram(const ExecutorConfig& config, const CudaBackendOptions& options);

// The shard of `model` a backend of `options` holds (the whole model at TP 1).
TpRankShard rank_shard(const ModelConfig& model, const CudaBackendOptions& options);

}  // namespace ls
