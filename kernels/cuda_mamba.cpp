// A hybrid model's Mamba2 layers on the CUDA backend (issue 19): what it refuses, the mixer's
// weights, the recurrent-state pool in the CPU reference's layout and its host side (retraction by
// swap; then, with speculative decoding, the verify-state slots: core/limits.h
// mamba_verify_slots_count), a step's state lists staged beside its words, and the state rules —
// copy-on-write then zeroing before the forward, after the commit the verified rows' accepted
// state into their working slots and the DECODE step's page-boundary checkpoints — as kernels
// reading device lists, so that a decode graph replays them (CpuBackend::apply_state_rules,
// commit_verified_state and snapshot_mamba_checkpoints are the reference).
#include "kernels/cuda_backend_impl.h"

#include "core/host_memory.h"
#include "core/model/weights.h"

#include <cuda_runtime.h>

#include <algorithm>

namespace ls {

// What the CUDA backend does not implement for Mamba layers, refused by name (as the CPU
// reference refuses the first two: core/cpu_model.cpp init_mamba_pool).
void CudaBackend::Impl::refuse_unsupported_hybrid() const {
  if (!model.has_recurrent_state()) return;
  const MambaConfig& m = model.mamba;
  LS_REQUIRE(model.mamba_layers_count() < model.layers_count, "cuda backend: model '{}' has no "
             "attention layer (every layer is Mamba2), which the CUDA backend does not implement",
             model.name);
  LS_REQUIRE(shard.degree == 1, "cuda backend: --tp {}: model '{}' has Mamba2 layers; tensor "
             "parallelism is not implemented for them (use --tp 1)", shard.degree, model.name);
  LS_REQUIRE(config.verify_width == 1 || config.host_pages_count == 0, "cuda backend: "
             "verify_width {} with host_pages_count {}: model '{}' has Mamba2 layers; speculative "
             "decoding with retraction by swap is not implemented for them (use host_pages_count "
             "0: retraction by recompute)", config.verify_width, config.host_pages_count,
             model.name);
  LS_REQUIRE(config.mamba_slots_count >= 1, "cuda backend: model '{}' has {} Mamba2 layers but "
             "mamba_slots_count is 0: its requests need recurrent-state slots", model.name,
             model.mamba_layers_count());
  LS_REQUIRE(m.conv_kernel <= kernels::kMambaConvKernelMax, "cuda backend: model '{}': mamba "
             "conv_kernel {} exceeds the CUDA mixer's {}", model.name, m.conv_kernel,
             kernels::kMambaConvKernelMax);
  LS_REQUIRE(m.state_size <= kernels::kMambaStateSizeMax, "cuda backend: model '{}': mamba "
             "state_size {} exceeds the CUDA mixer's {}", model.name, m.state_size,
             kernels::kMambaStateSizeMax);
  LS_REQUIRE(config.max_batch_rows <= kernels::kMambaPoolOpsMax, "cuda backend: max_batch_rows "
             "{} exceeds the {} state-pool entries of one launch", config.max_batch_rows,
             kernels::kMambaPoolOpsMax);
}

// Each layer's index among its kind: the Mamba layers' into the mixer weights and the state
// pool, the attention layers' into the KV cache.
void CudaBackend::Impl::index_layer_kinds() {
  mamba_index.assign(static_cast<size_t>(layers), -1);
  kv_index.assign(static_cast<size_t>(layers), -1);
  mamba_layers = 0;
  kv_layers = 0;
  for (int32_t l = 0; l < layers; ++l) {
    const bool mamba = model.layer_kind(l) == LayerKind::kMamba2;
    (mamba ? mamba_index : kv_index)[static_cast<size_t>(l)] = mamba ? mamba_layers++ : kv_layers++;
  }
  mamba_slot_floats =
      mamba_layers * (model.mamba.conv_state_floats() + model.mamba.ssm_state_floats());
}

// Zero states (a request's first chunk zeroes its slot anyway) and workspace (the graphs'
// warm-ups run the mixer over rows of no tokens, whose outputs read it), every list −1
// (padding), the pinned buffers the lists are packed into, and the host states of retraction by
// swap: one per host page, zeroed, as on the CPU reference (CpuModel::copy_host_state).
void CudaBackend::Impl::initialise_mamba() {
  if (!hybrid()) return;
  const cudaStream_t s = stream.get();
  LS_CUDA(cudaMemsetAsync(mamba_pool.get(), 0, mamba_pool.bytes(), s));
  LS_CUDA(cudaMemsetAsync(mamba_workspace.get(), 0, mamba_workspace.bytes(), s));
  LS_CUDA(cudaMemsetAsync(mamba_staging.get(), 0xff, mamba_staging.bytes(), s));
  const MambaStagingLayout o(rows_max);
  for (auto& buffer : host_mamba_staging) buffer = PinnedArray<int32_t>(o.staged_words);
  const uint64_t host_floats =
      static_cast<uint64_t>(mamba_slot_floats) * static_cast<uint64_t>(config.host_pages_count);
  require_host_memory(host_floats * sizeof(float),
                      fmt::format("cuda backend: the pinned host recurrent states ({} host pages "
                                  "of {} floats)", config.host_pages_count, mamba_slot_floats));
  host_mamba_states = PinnedArray<float>(static_cast<size_t>(host_floats));
  std::fill(host_mamba_states.get(), host_mamba_states.get() + host_mamba_states.count(), 0.0f);
}

// A cache op's recurrent state (CacheOp::state_slot >= 0): the slot's state out to the host state
// of the op's first host page, or back from it into the slot, queued on the stream like the op's
// page copies — behind every step enqueued before it (a step in flight finishes writing the
// state before it is copied out) and ahead of every later one.
void CudaBackend::Impl::enqueue_state_copy(const CacheOp& op) {
  if (op.state_slot == -1) return;
  LS_ASSERT(hybrid(), "cuda backend: cache op with state slot {} on a model without Mamba layers",
            op.state_slot);
  LS_ASSERT(op.state_slot >= 0 && op.state_slot < config.mamba_slots_count,
            "state slot {} of {}", op.state_slot, config.mamba_slots_count);
  LS_ASSERT(!op.host_pages.empty(), "state slot {} with no host page", op.state_slot);
  const size_t n = static_cast<size_t>(mamba_slot_floats);
  float* device = mamba_pool.get() + static_cast<size_t>(op.state_slot) * n;
  float* host = host_mamba_states.get() + static_cast<size_t>(op.host_pages.front()) * n;
  if (op.kind == CacheOpKind::kSwapOut) {
    LS_CUDA(cudaMemcpyAsync(host, device, n * sizeof(float), cudaMemcpyDeviceToHost, stream.get()));
  } else {
    LS_CUDA(cudaMemcpyAsync(device, host, n * sizeof(float), cudaMemcpyHostToDevice, stream.get()));
  }
}

// Layer `layer`'s mixer tensors from the host (its linear ones in the storage type).
void CudaBackend::Impl::upload_mamba_layer(int32_t layer, const LayerWeights& w) {
  const size_t m = static_cast<size_t>(mamba_index[static_cast<size_t>(layer)]);
  LS_ASSERT(mamba_index[static_cast<size_t>(layer)] >= 0, "layer {} is not a Mamba layer", layer);
  const MambaConfig& c = model.mamba;
  const size_t h = static_cast<size_t>(hidden);
  const size_t inner = static_cast<size_t>(c.inner_size());
  const size_t conv = static_cast<size_t>(c.conv_dim());
  const size_t heads = static_cast<size_t>(c.heads_count);
  upload_tensor(w_in_proj, m * static_cast<size_t>(c.in_proj_size()) * h, w.in_proj);
  upload_tensor(w_out_proj, m * h * inner, w.out_proj);
  const auto copy = [](float* dst, std::span<const float> src, size_t count) {
    LS_ASSERT(src.size() == count, "mixer tensor of {} floats, expected {}", src.size(), count);
    LS_CUDA(cudaMemcpy(dst, src.data(), src.size_bytes(), cudaMemcpyHostToDevice));
  };
  const size_t window = conv * static_cast<size_t>(c.conv_kernel);
  copy(mamba_conv_weight.get() + m * window, w.conv_weight, window);
  if (c.conv_bias) copy(mamba_conv_bias.get() + m * conv, w.conv_bias, conv);
  copy(mamba_dt_bias.get() + m * heads, w.dt_bias, heads);
  copy(mamba_a_log.get() + m * heads, w.a_log, heads);
  copy(mamba_d_skip.get() + m * heads, w.d_skip, heads);
  copy(mamba_norm.get() + m * inner, w.mamba_norm, inner);
}

kernels::MambaShape CudaBackend::Impl::mamba_shape() const { return mamba_shape_of(model); }

kernels::MambaLayerParams CudaBackend::Impl::mamba_params(int32_t mamba_layer) const {
  const MambaConfig& c = model.mamba;
  const size_t m = static_cast<size_t>(mamba_layer);
  const size_t conv = static_cast<size_t>(c.conv_dim());
  const size_t heads = static_cast<size_t>(c.heads_count);
  return kernels::MambaLayerParams{
      .conv_weight = mamba_conv_weight.get() + m * conv * static_cast<size_t>(c.conv_kernel),
      .conv_bias = c.conv_bias ? mamba_conv_bias.get() + m * conv : nullptr,
      .dt_bias = mamba_dt_bias.get() + m * heads,
      .a_log = mamba_a_log.get() + m * heads,
      .d_skip = mamba_d_skip.get() + m * heads,
      .norm_weight = mamba_norm.get() + m * static_cast<size_t>(c.inner_size()),
  };
}

// The CPU's pool layout: slot s, Mamba layer m at s · slot floats + m · layer floats.
kernels::MambaStateView CudaBackend::Impl::mamba_state(int32_t mamba_layer) const {
  const int64_t layer_floats = model.mamba.conv_state_floats() + model.mamba.ssm_state_floats();
  float* conv = mamba_pool.get() + mamba_layer * layer_floats;
  return kernels::MambaStateView{conv, conv + model.mamba.conv_state_floats(), mamba_slot_floats};
}

// The step's rows as the staged words hold them (a decode graph's padding included): each row's
// tokens and its working slot, −1 for padding.
kernels::MambaRows CudaBackend::Impl::mamba_rows() const {
  const kernels::StepInputs in = step_inputs();
  const MambaStagingLayout o(rows_max);
  return kernels::MambaRows{in.token_offsets, in.input_lengths, mamba_staging.get() + o.slots,
                            rows_grid, mamba_staging.get() + o.verify_base};
}

// Each token's working slot as the last staged step's mixer launches read it
// (InputSnapshot::mamba_slots): row r < rows_grid's tokens take its staged slot — −1 for a
// padded row — and every other token −1. Read back from the device words (the caller synchronised
// the stream), so a slot the staging got wrong shows. Empty for a model without Mamba layers.
std::vector<int32_t> CudaBackend::Impl::token_mamba_slots() const {
  if (!hybrid()) return {};
  const size_t rows = static_cast<size_t>(rows_grid);
  const auto read = [rows](const int32_t* device) {
    std::vector<int32_t> host(rows);
    LS_CUDA(cudaMemcpy(host.data(), device, rows * sizeof(int32_t), cudaMemcpyDeviceToHost));
    return host;
  };
  const std::vector<int32_t> offsets = read(staging.get() + layout.token_offsets);
  const std::vector<int32_t> lengths = read(staging.get() + layout.input_lengths);
  const std::vector<int32_t> row_slots =
      read(mamba_staging.get() + MambaStagingLayout(rows_max).slots);
  std::vector<int32_t> per_token(static_cast<size_t>(tokens_max), -1);
  for (size_t r = 0; r < rows; ++r) {
    LS_ASSERT(offsets[r] >= 0 && lengths[r] >= 0 && offsets[r] + lengths[r] <= tokens_max,
              "staged row {}: tokens [{}, {}) of {}", r, offsets[r], offsets[r] + lengths[r],
              tokens_max);
    std::fill_n(per_token.begin() + offsets[r], lengths[r], row_slots[r]);
  }
  return per_token;
}

// The plan's state lists into this parity's pinned buffer, every list padded to rows_max with −1,
// and one copy to the device (stage() waited for this parity's previous upload).
void CudaBackend::Impl::stage_mamba(const StepPlan& plan, size_t parity) {
  if (!hybrid()) return;
  const MambaStagingLayout o(rows_max);
  LS_ASSERT(plan.mamba_working.size() == static_cast<size_t>(plan.rows_count), "{} working slots "
            "for {} rows", plan.mamba_working.size(), plan.rows_count);
  const size_t b = static_cast<size_t>(rows_max);
  LS_ASSERT(plan.mamba_copies.size() <= b && plan.mamba_zeroes.size() <= b &&
                plan.mamba_snapshots.size() <= b,
            "state lists of {}, {} and {} entries for {} rows", plan.mamba_copies.size(),
            plan.mamba_zeroes.size(), plan.mamba_snapshots.size(), rows_max);
  int32_t* words = host_mamba_staging[parity].get();
  std::fill(words, words + o.staged_words, -1);
  std::copy(plan.mamba_working.begin(), plan.mamba_working.end(), words + o.slots);
  std::copy(plan.mamba_verify_base.begin(), plan.mamba_verify_base.end(), words + o.verify_base);
  for (size_t i = 0; i < plan.mamba_copies.size(); ++i) {
    words[o.copies + 2 * i] = plan.mamba_copies[i].src;
    words[o.copies + 2 * i + 1] = plan.mamba_copies[i].dst;
  }
  std::copy(plan.mamba_zeroes.begin(), plan.mamba_zeroes.end(), words + o.zeroes);
  for (size_t i = 0; i < plan.mamba_snapshots.size(); ++i) {
    const MambaSnapshot& s = plan.mamba_snapshots[i];
    words[o.snapshots + 3 * i] = s.row;
    words[o.snapshots + 3 * i + 1] = s.src;
    words[o.snapshots + 3 * i + 2] = s.dst;
  }
  LS_CUDA(cudaMemcpyAsync(mamba_staging.get(), words, o.staged_words * sizeof(int32_t),
                          cudaMemcpyHostToDevice, stream.get()));
}

// Between the fill and the forward: the copies in list order, then the zeroing. Full-width
// launches (an all-padding list exits at once), the same in a graph and eagerly.
void CudaBackend::Impl::enqueue_mamba_rules() {
  if (!hybrid()) return;
  const MambaStagingLayout o(rows_max);
  LS_CUDA(kernels::launch_mamba_copy_slots(mamba_pool.get(), mamba_slot_floats,
                                           mamba_staging.get() + o.copies, rows_max,
                                           forward_stream()));
  LS_CUDA(kernels::launch_mamba_zero_slots(mamba_pool.get(), mamba_slot_floats,
                                           mamba_staging.get() + o.zeroes, rows_max,
                                           forward_stream()));
}

// After the commit (vcl advanced by a'): with speculative decoding, each verified row's state
// after its last accepted token into its working slot; then the snapshots — working →
// checkpoint where the row's new vcl ends a page, a verified row's state at the boundary it
// crossed (the rule with a drafter).
void CudaBackend::Impl::enqueue_mamba_snapshots() {
  if (!hybrid()) return;
  const MambaStagingLayout o(rows_max);
  int32_t* words = mamba_staging.get();
  const bool verifying = config.verify_width > 1;
  if (verifying) {
    LS_CUDA(kernels::launch_mamba_verify_commit_pairs(words + o.slots, words + o.verify_base,
                                                      rows_max, step_inputs().pool_rows, vcl.get(),
                                                      vcl_before.get(), words + o.commit_pairs,
                                                      forward_stream()));
    LS_CUDA(kernels::launch_mamba_copy_slots(mamba_pool.get(), mamba_slot_floats,
                                             words + o.commit_pairs, rows_max, forward_stream()));
  }
  LS_CUDA(kernels::launch_mamba_snapshot_pairs(
      words + o.snapshots, rows_max, step_inputs().pool_rows, vcl.get(), config.page_size,
      words + o.pairs, forward_stream(), verifying ? words + o.verify_base : nullptr,
      verifying ? vcl_before.get() : nullptr));
  LS_CUDA(kernels::launch_mamba_copy_slots(mamba_pool.get(), mamba_slot_floats, words + o.pairs,
                                           rows_max, forward_stream()));
}

// The state digests of state_slots [count] (device memory; −1: skipped) into digests, on the
// forward's stream behind what it queued (a recorded step: after the snapshots, the state
// CpuBackend::fill_record digests).
void CudaBackend::Impl::enqueue_mamba_digests(const int32_t* state_slots, int32_t count,
                                              uint64_t* digests) const {
  LS_CUDA(kernels::launch_mamba_state_digests(mamba_pool.get(), mamba_slot_floats, state_slots,
                                              count, mamba_digest_partials.get(),
                                              mamba_digest_partials.count(), digests,
                                              forward_stream()));
}

// The simulator's view: each slot's digest on the device, max_batch_rows slots a launch (the
// partials' size), in the stream's order (behind every step submitted), synchronized.
std::vector<uint64_t> CudaBackend::Impl::read_mamba_digests(std::span<const int32_t> wanted) const {
  LS_REQUIRE(hybrid() || wanted.empty(), "cuda backend: model '{}' has no recurrent state: {} "
             "slots asked", model.name, wanted.size());
  std::vector<uint64_t> out(wanted.size());
  if (wanted.empty()) return out;
  for (const int32_t slot : wanted) {
    LS_REQUIRE(slot >= 0 && slot < config.mamba_slots_count, "cuda backend: mamba slot {} of {}",
               slot, config.mamba_slots_count);
  }
  const size_t batch = std::min(wanted.size(), static_cast<size_t>(rows_max));
  DeviceArray<int32_t> device_slots(batch);
  DeviceArray<uint64_t> device_digests(batch);
  const cudaStream_t s = stream.get();  // every copy in the stream's order, behind the steps
  for (size_t begin = 0; begin < wanted.size(); begin += batch) {
    const size_t count = std::min(batch, wanted.size() - begin);
    LS_CUDA(cudaMemcpyAsync(device_slots.get(), wanted.data() + begin, count * sizeof(int32_t),
                            cudaMemcpyHostToDevice, s));
    enqueue_mamba_digests(device_slots.get(), static_cast<int32_t>(count), device_digests.get());
    LS_CUDA(cudaMemcpyAsync(out.data() + begin, device_digests.get(), count * sizeof(uint64_t),
                            cudaMemcpyDeviceToHost, s));
    LS_CUDA(cudaStreamSynchronize(s));
  }
  return out;
}

std::vector<float> CudaBackend::Impl::read_mamba_slot(int32_t slot) const {
  LS_REQUIRE(hybrid(), "cuda backend: model '{}' has no recurrent state", model.name);
  LS_REQUIRE(slot >= 0 && slot < config.mamba_slots_count, "cuda backend: mamba slot {} of {}",
             slot, config.mamba_slots_count);
  LS_CUDA(cudaStreamSynchronize(stream.get()));
  std::vector<float> out(static_cast<size_t>(mamba_slot_floats));
  LS_CUDA(cudaMemcpy(out.data(), mamba_pool.get() + slot * mamba_slot_floats,
                     out.size() * sizeof(float), cudaMemcpyDeviceToHost));
  return out;
}

}  // namespace ls
