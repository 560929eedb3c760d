// The step stager: a StepPlan packed into pinned staging and copied to the device once per step
// (step_layout.h), the state ops that read it, and the packed results unpacked into a StepResult.
#include "kernels/cuda_backend_impl.h"

#include "kernels/state_ops.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cstring>

namespace ls {

kernels::DeviceState CudaBackend::Impl::device_state() const {
  return kernels::DeviceState{
      .table = table.get(),
      .vcl = vcl.get(),
      .future_inputs = future_inputs.get(),
      .vcl_before = vcl_before.get(),
      .table_width = table_width,
      .page_size = config.page_size,
      .verify_width = config.verify_width,
      .vocab_size = vocab,
      .context_length = config.context_length,
      .sentinel_pool_row = config.sentinel_pool_row(),
  };
}

kernels::TokenBuffers CudaBackend::Impl::token_buffers() const {
  return kernels::TokenBuffers{input_ids.get(), positions.get(), slots.get(),
                               token_pool_rows.get(), tokens_max};
}

kernels::ResultBuffers CudaBackend::Impl::result_buffers() const {
  int32_t* base = results.get();
  const size_t r = static_cast<size_t>(logits_rows_max);
  const size_t b = static_cast<size_t>(rows_max);
  return kernels::ResultBuffers{base, base + r, base + r + b, base + r + 2 * b,
                                reinterpret_cast<float*>(base + r + 3 * b)};
}

kernels::RecordBuffers CudaBackend::Impl::record_buffers() const {
  int32_t* base = results.get();
  const ResultsLayout& o = results_layout;
  return kernels::RecordBuffers{reinterpret_cast<uint64_t*>(base + o.digests), base + o.top,
                                base + o.vcl, base + o.future_inputs, base + o.table};
}

// Decode steps run at their bucket's batch size (eager and graph alike, so the two give the same
// bits); other steps at their own size.
int32_t CudaBackend::Impl::rows_grid_for(const StepPlan& plan) const {
  if (plan.mode != ForwardMode::kDecode) return plan.rows_count;
  return *std::lower_bound(buckets.begin(), buckets.end(), plan.rows_count);
}

// Packs the plan into `words`; rows [bs, rows_grid) are padding: the sentinel pool row, its
// tokens and logits rows past the real ones. Returns the words to copy before table_pages.
int32_t CudaBackend::Impl::pack(const StepPlan& plan, int32_t grid, int32_t* words,
                               size_t* pages_count) const {
  const int32_t bs = plan.rows_count;
  const int32_t ne = plan.prefill_rows_count;
  const int32_t w = plan.verify_width;
  LS_ASSERT(bs <= grid && grid <= rows_max, "rows {} grid {} max {}", bs, grid, rows_max);
  LS_ASSERT(plan.logits_rows_count() <= logits_rows_max, "{} logits rows", plan.logits_rows_count());
  LS_ASSERT(static_cast<int32_t>(plan.table_writes.size()) <= rows_max, "{} table writes",
            plan.table_writes.size());
  LS_ASSERT(static_cast<int32_t>(plan.length_resets.size()) <= rows_max, "{} resets",
            plan.length_resets.size());
  LS_ASSERT(plan.table_pages.size() <= static_cast<size_t>(rows_max) * table_width, "{} pages",
            plan.table_pages.size());
  LS_ASSERT(plan.prefill_token_ids.size() <= static_cast<size_t>(config.prefill_chunk_tokens),
            "{} prefill tokens", plan.prefill_token_ids.size());
  LS_REQUIRE(static_cast<int32_t>(plan.forced_outputs.size()) <= logits_rows_max,
             "cuda backend: {} forced outputs exceed logits_rows_max = {}",
             plan.forced_outputs.size(), logits_rows_max);
  auto& header = *reinterpret_cast<kernels::StepHeader*>(words);
  header = kernels::StepHeader{};
  header.rows_count = bs;
  header.prefill_rows_count = ne;
  header.tokens_count = plan.tokens_count;
  header.verify_width = w;
  header.logits_rows_count = plan.logits_rows_count();
  header.table_writes_count = static_cast<int32_t>(plan.table_writes.size());
  header.length_resets_count = static_cast<int32_t>(plan.length_resets.size());
  header.forced_count = static_cast<int32_t>(plan.forced_outputs.size());
  header.want_logprobs = plan.want_logprobs ? 1 : 0;
  const StagingLayout& o = layout;
  const int32_t nd = bs - ne;
  for (int32_t row = 0; row < grid; ++row) {
    const bool real = row < bs;
    words[o.pool_rows + row] = real ? plan.pool_rows[row] : config.sentinel_pool_row();
    words[o.input_lengths + row] = real ? plan.input_lengths[row] : w;
    words[o.token_offsets + row] = real ? plan.token_offsets[row] : plan.tokens_count + (row - bs) * w;
    words[o.prefill_prefix + row] = row < ne ? plan.prefill_prefix[row] : 0;
    words[o.decode_overrides + row] = row < nd ? plan.decode_overrides[row] : -1;
    words[o.force_single + row] = row < nd ? plan.force_single[row] : 0;
    kernels::SamplingRow s{};
    if (real) {
      const ResolvedSampling& rs = plan.sampling[row];
      s = kernels::SamplingRow{static_cast<uint32_t>(rs.seed), static_cast<uint32_t>(rs.seed >> 32),
                               rs.temperature, rs.top_k, rs.top_p, rs.min_p};
    }
    std::memcpy(words + o.sampling + static_cast<size_t>(row) * kSamplingWords, &s, sizeof(s));
  }
  const int32_t logits_grid = ne + (grid - ne) * w;
  for (int32_t r = 0; r < logits_grid; ++r) {
    words[o.logits_token_index + r] =
        r < plan.logits_rows_count() ? plan.logits_token_index[r]
                                     : plan.tokens_count + (r - plan.logits_rows_count());
  }
  for (size_t i = 0; i < plan.table_writes.size(); ++i) {
    const TableWrite& tw = plan.table_writes[i];
    LS_ASSERT(tw.begin + tw.pages_count <= table_width, "unclamped table write");
    int32_t* out = words + o.table_writes + 4 * i;
    out[0] = tw.pool_row, out[1] = tw.begin, out[2] = tw.pages_offset, out[3] = tw.pages_count;
  }
  for (size_t i = 0; i < plan.length_resets.size(); ++i) {
    words[o.length_resets + 2 * i] = plan.length_resets[i].pool_row;
    words[o.length_resets + 2 * i + 1] = plan.length_resets[i].length;
  }
  for (size_t i = 0; i < plan.forced_outputs.size(); ++i) {
    words[o.forced + 2 * i] = plan.forced_outputs[i].first;
    words[o.forced + 2 * i + 1] = plan.forced_outputs[i].second;
  }
  std::copy(plan.prefill_token_ids.begin(), plan.prefill_token_ids.end(), words + o.prefill_ids);
  std::copy(plan.table_pages.begin(), plan.table_pages.end(), words + o.table_pages);
  *pages_count = plan.table_pages.size();
  return static_cast<int32_t>(o.prefill_ids + plan.prefill_token_ids.size());
}

// One packed host-to-device copy of the step (two when table pages are written). The pinned
// buffer is double-buffered by step parity and never rewritten before its last copy completed.
void CudaBackend::Impl::stage(const StepPlan& plan) {
  if (staged) return;
  // Step k reuses step k − 2's pinned buffers: that step must have been collected.
  LS_ASSERT(steps_in_flight() < 2, "{} steps in flight at staging", steps_in_flight());
  const size_t parity = static_cast<size_t>(steps_count & 1);
  LS_CUDA(cudaEventSynchronize(upload_done[parity].get()));
  rows_grid = rows_grid_for(plan);
  // Prefill and mixed steps scan on the chunked grid (kernels/mamba_scan.h); a verified row in
  // a mixed step gets its per-token verify states there too (it is scanned whole, sequentially).
  mamba_chunked = plan.mode != ForwardMode::kDecode;
  choose_graph(plan);
  if (graph_index_ < 0 && steps_in_flight() > 0) {
    // An eager step is not launched ahead: its hundreds of launches queued behind a running step
    // made that step slower on the H200 (llama-8b batch 1: 6.3 ms against 5.1 ms one step at a
    // time, bench/results/2026-11-29-h200-2f3dd17d397e.log), so it waits for the step in flight
    // first; a graph step (one launch) still runs ahead.
    const auto wait_begin = std::chrono::steady_clock::now();
    LS_CUDA(cudaEventSynchronize(step_done[static_cast<size_t>((steps_count - 1) & 1)].get()));
    stage_wait_ns += std::chrono::duration_cast<std::chrono::nanoseconds>(
                         std::chrono::steady_clock::now() - wait_begin)
                         .count();
  }
  int32_t* words = host_staging[parity].get();
  size_t pages = 0;
  const int32_t head_words = pack(plan, rows_grid, words, &pages);
  const cudaStream_t s = stream.get();
  // After the pack: a device waiting for the host's planning and packing waits idle.
  step_timer.record_begin(steps_count, s);
  LS_CUDA(cudaMemcpyAsync(staging.get(), words, static_cast<size_t>(head_words) * 4,
                          cudaMemcpyHostToDevice, s));
  if (pages > 0) {
    LS_CUDA(cudaMemcpyAsync(staging.get() + layout.table_pages, words + layout.table_pages,
                            pages * 4, cudaMemcpyHostToDevice, s));
  }
  stage_mamba(plan, parity);
  LS_CUDA(cudaEventRecord(upload_done[parity].get(), s));
  staged = true;
  phase_marks.count = 0;
  mark(CudaPhase::kCount);  // opens the step
}

void CudaBackend::Impl::enqueue_table_writes(int32_t grid) {
  LS_CUDA(kernels::launch_apply_table_writes(step_inputs(), device_state(), grid, stream.get()));
}

void CudaBackend::Impl::enqueue_resets() {
  LS_CUDA(kernels::launch_reset_lengths(step_inputs(), device_state(), stream.get()));
}

void CudaBackend::Impl::enqueue_fill(int32_t grid) {
  LS_CUDA(kernels::launch_fill_inputs(step_inputs(), device_state(), token_buffers(), grid,
                                      stream.get()));
}

// Fills `result` from the pinned buffer of step parity `parity`, reusing its vectors.
void CudaBackend::Impl::unpack(const StepPlan& plan, size_t parity, StepResult& result) {
  const int32_t bs = plan.rows_count;
  const int32_t r = plan.logits_rows_count();
  result.mode = plan.mode;
  result.prefill_rows_count = plan.prefill_rows_count;
  result.verify_width = plan.verify_width;
  const kernels::ResultBuffers device = result_buffers();
  const int32_t* base = host_results[parity].get();
  auto host = [&](const void* p) { return base + (static_cast<const int32_t*>(p) - results.get()); };
  const int32_t* tokens_h = host(device.tokens);
  const int32_t* accepted_h = host(device.accepted_lengths);
  const int32_t* nan_h = host(device.nan_flags);
  const int32_t* oov_h = host(device.oov_flags);
  result.tokens.assign(tokens_h, tokens_h + r);
  result.accepted_lengths.assign(accepted_h, accepted_h + bs);
  result.nan_flags.resize(static_cast<size_t>(bs));
  result.oov_flags.resize(static_cast<size_t>(bs));
  for (int32_t i = 0; i < bs; ++i) {
    result.nan_flags[i] = static_cast<uint8_t>(nan_h[i] != 0);
    result.oov_flags[i] = static_cast<uint8_t>(oov_h[i] != 0);
  }
  result.logprobs.clear();
  if (plan.want_logprobs) {
    result.logprobs.resize(static_cast<size_t>(r));
    std::memcpy(result.logprobs.data(), host(device.logprobs), static_cast<size_t>(r) * 4);
  }
  unpack_record(plan, base, result);
}

// The record's part of the pinned results (empty vectors when the step did not record).
void CudaBackend::Impl::unpack_record(const StepPlan& plan, const int32_t* words,
                                      StepResult& result) const {
  const ResultsLayout& o = results_layout;
  const bool on = plan.record && plan.rows_count > 0;
  const size_t r = on ? static_cast<size_t>(plan.logits_rows_count()) : 0;
  const size_t bs = on ? static_cast<size_t>(plan.rows_count) : 0;
  const size_t k = on ? static_cast<size_t>(plan.top_logits_count) : 0;
  result.top_logits_count = on ? plan.top_logits_count : 0;
  result.logits_digests.resize(r);
  if (r > 0) std::memcpy(result.logits_digests.data(), words + o.digests, r * sizeof(uint64_t));
  result.top_logits.resize(r * k);
  for (size_t i = 0; i < r; ++i) {
    for (size_t j = 0; j < k; ++j) {
      const int32_t* pair = words + o.top + (i * kTopLogitsCountMax + j) * 2;
      TopLogit& t = result.top_logits[i * k + j];
      t.id = pair[0];
      std::memcpy(&t.logit, pair + 1, sizeof(float));
    }
  }
  const size_t w = static_cast<size_t>(config.verify_width);
  const size_t tw = static_cast<size_t>(table_width);
  StateSnapshot& s = result.state;
  s.pool_rows.assign(plan.pool_rows.begin(), plan.pool_rows.begin() + static_cast<ptrdiff_t>(bs));
  s.valid_cache_length.assign(words + o.vcl, words + o.vcl + bs);
  s.future_inputs.assign(words + o.future_inputs, words + o.future_inputs + bs * w);
  s.table.assign(words + o.table, words + o.table + bs * tw);
  const size_t state_rows = hybrid() ? bs : 0;  // CpuBackend::fill_record: a hybrid's alone
  result.mamba_state_digests.resize(state_rows);
  if (state_rows > 0) {
    std::memcpy(result.mamba_state_digests.data(), words + o.mamba_digests,
                state_rows * sizeof(uint64_t));
  }
}

}  // namespace ls
