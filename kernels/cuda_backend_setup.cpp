// CudaBackend::Impl's construction: the limits it refuses, every device buffer laid out once
// (lay_out_buffers: the same list allocates them and sizes them for cuda_kv_sizing), their
// contents initialised, every GEMM plan made.
#include "kernels/cuda_backend_impl.h"

#include "core/drafter.h"
#include "core/model/rope.h"
#include "kernels/gemm.h"
#include "kernels/gemm_small_m.h"
#include "kernels/layer_ops.h"
#include "kernels/logits_ops.h"
#include "kernels/sampling_ops.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <limits>
#include <type_traits>
#include <vector>

namespace ls {

using kernels::bf16;

int32_t small_m_gemm_tokens_max_for(const CudaBackendOptions& o, int64_t out, int64_t in) {
  const bool dims_fit = out <= std::numeric_limits<int32_t>::max() &&
                        in <= std::numeric_limits<int32_t>::max();
  if (!dims_fit ||
      !kernels::gemm_small_m_fills_its_waves(static_cast<int32_t>(out), static_cast<int32_t>(in))) {
    return 0;
  }
  const int32_t every = small_m_gemm_tokens_max_of(o);
  const bool large = out * in * 2 >= kSmallMGemmLargeProductBytes;
  return large ? std::max(every, small_m_gemm_large_tokens_max_of(o)) : every;
}

namespace {

using Impl = CudaBackend::Impl;

// The ledger a device buffer counts in.
enum class Account : uint8_t { kWeights, kKv, kWorkspace };

template <typename T>
constexpr size_t element_bytes(DeviceArray<T> Impl::*) {
  return sizeof(T);
}

// The small-M GEMM's workspace: the largest any linear shape needs at up to the tokens it runs
// the GEMM at (small_m_gemm_tokens_max_for; 0 when off, in fp32, or when no shape splits K).
size_t small_m_gemm_workspace_bytes(const ModelConfig& model, const TpRankShard& shard,
                                    const CudaBackendOptions& options) {
  if (options.precision != CudaPrecision::kBf16) return 0;
  const Impl::LinearShapes s = Impl::linear_shapes_of(model, shard, options);
  size_t bytes = 0;
  for (const Impl::LinearShape& shape :
       {s.qkv, s.o, s.gate_up, s.down, s.lm_head, s.in_proj, s.out_proj}) {
    // Batch-invariant mode runs every product on the GEMM, in blocks of its most tokens.
    const int32_t tokens_max = options.batch_invariant
                                   ? kSmallMGemmTokensInvariant
                                   : shape.small_m_tokens_max;
    if (tokens_max < 1) continue;
    bytes = std::max(bytes, kernels::gemm_small_m_workspace_bytes(
                                shape.out, shape.in, tokens_max));
  }
  return bytes;
}

// Every device buffer of a backend over (full_model, config, options) but TpRank's (which
// TpRank::workspace_bytes sizes), in allocation order, with its element count: the one place
// these sizes are written. take(account, &Impl::member, count) allocates the member at
// construction, or adds its bytes up when cuda_kv_sizing plans memory before any backend exists.
// "E" buffers are bytes: elements of the precision's storage type (bf16 or fp32).
template <typename Take>
void lay_out_buffers(const ModelConfig& full_model, const ExecutorConfig& config,
                     const CudaBackendOptions& options, Take&& take) {
  const TpRankShard shard = rank_shard(full_model, options);
  const ModelConfig model = rank_model_config(full_model, shard);
  const size_t e = options.precision == CudaPrecision::kFp32 ? sizeof(float) : sizeof(bf16);
  const auto z = [](int64_t n) { return static_cast<size_t>(n); };
  const size_t h = z(model.hidden_size), l = z(model.layers_count), v = z(model.vocab_size);
  const size_t qs = z(model.q_size()), kvs = z(model.kv_size()), f = z(model.ffn_size);
  const size_t t = z(config.step_tokens_max()), r = z(config.logits_rows_max());
  const size_t pool = z(config.pool_rows_count()), w = z(config.verify_width);
  const size_t positions = z(config.table_width()) * z(config.page_size);
  constexpr Account kW = Account::kWeights, kS = Account::kWorkspace;
  take(kW, &Impl::embedding, e * v * h);
  const size_t head_rows = shard.degree > 1 ? z(shard.vocab_rows) : model.tied_embeddings ? 0 : v;
  if (head_rows > 0) take(kW, &Impl::lm_head, e * head_rows * h);
  take(kW, &Impl::w_qkv, e * l * (qs + 2 * kvs) * h);
  take(kW, &Impl::w_o, e * l * h * qs);
  take(kW, &Impl::w_gate_up, e * l * 2 * f * h);
  take(kW, &Impl::w_down, e * l * h * f);
  take(kW, &Impl::attn_norm, l * h);
  take(kW, &Impl::ffn_norm, l * h);
  take(kW, &Impl::final_norm, h);
  if (model.qkv_bias) take(kW, &Impl::qkv_bias, l * (qs + 2 * kvs));
  if (model.qk_norm) {
    take(kW, &Impl::q_norm, l * z(model.head_dim));
    take(kW, &Impl::k_norm, l * z(model.head_dim));
  }
  if (model.has_recurrent_state()) {
    // A hybrid's Mamba layers (TP 1 only: refuse_unsupported_hybrid). The state pool counts as
    // workspace: a fixed size, beside the weights, that the KV pages share the device with.
    const size_t m = z(model.mamba_layers_count());
    const MambaConfig& ms = model.mamba;
    const size_t in_proj = z(ms.in_proj_size()), inner = z(ms.inner_size());
    const size_t conv = z(ms.conv_dim()), heads = z(ms.heads_count);
    take(kW, &Impl::w_in_proj, e * m * in_proj * h);
    take(kW, &Impl::w_out_proj, e * m * h * inner);
    take(kW, &Impl::mamba_conv_weight, m * conv * z(ms.conv_kernel));
    if (ms.conv_bias) take(kW, &Impl::mamba_conv_bias, m * conv);
    take(kW, &Impl::mamba_dt_bias, m * heads);
    take(kW, &Impl::mamba_a_log, m * heads);
    take(kW, &Impl::mamba_d_skip, m * heads);
    take(kW, &Impl::mamba_norm, m * inner);
    take(kS, &Impl::mamba_pool, z(config.mamba_slots_count + config.mamba_verify_slots_count()) *
                                    m * z(ms.conv_state_floats() + ms.ssm_state_floats()));
    take(kS, &Impl::mamba_proj, t * in_proj);
    take(kS, &Impl::mamba_y, e * t * inner);
    take(kS, &Impl::mamba_workspace,
         kernels::mamba_chunked_workspace_floats(mamba_shape_of(model), config.step_tokens_max()));
    take(kS, &Impl::mamba_staging, MambaStagingLayout(config.max_batch_rows).words);
    take(kS, &Impl::mamba_digest_partials,
         kernels::mamba_digest_workspace_words(
             int64_t{model.mamba_layers_count()} * (ms.conv_state_floats() + ms.ssm_state_floats()),
             config.max_batch_rows));
  }
  const size_t kv_layers = z(model.layers_count - model.mamba_layers_count());
  const size_t kv_bytes = e * kv_layers * z(config.pages_count) * z(config.page_size) * kvs;
  take(Account::kKv, &Impl::k_cache, kv_bytes);
  take(Account::kKv, &Impl::v_cache, kv_bytes);
  take(kS, &Impl::rope_cos, positions * z(model.rotary_dim() / 2));
  take(kS, &Impl::rope_sin, positions * z(model.rotary_dim() / 2));
  take(kS, &Impl::residual, t * h);
  take(kS, &Impl::normed, e * t * h);
  take(kS, &Impl::qkv, t * (qs + 2 * kvs));
  take(kS, &Impl::q, t * qs);
  take(kS, &Impl::attn_out, e * t * qs);
  take(kS, &Impl::gate_up, t * 2 * f);
  take(kS, &Impl::act, e * t * f);
  // Decode steps (rows_max · W tokens) must fit in one attention launch (graphs); prefill may
  // be chunked under the cap. The tile kernel's list of tiles (default mode's prefill: one int a
  // token) shares these floats and is cut into launches if it does not fit (it always does at
  // these sizes); batch-invariant mode's prefill takes the decode kernel, chunked under the cap.
  const kernels::AttentionShape shape{model.query_heads_count, model.kv_heads_count,
                                      model.head_dim, config.table_width(), config.page_size,
                                      config.table_width() * config.page_size};
  const size_t decode_floats =
      kernels::attention_workspace_floats(shape, config.max_batch_rows * config.verify_width);
  const size_t all_floats = kernels::attention_workspace_floats(shape, config.step_tokens_max());
  const size_t cap_floats = static_cast<size_t>(options.attention_workspace_bytes_max) / 4;
  take(kS, &Impl::attention_workspace, std::max(decode_floats, std::min(all_floats, cap_floats)));
  take(kS, &Impl::final_normed, e * r * h);
  take(kS, &Impl::logits, r * v);
  take(kS, &Impl::cublas_workspace, z(options.cublas_workspace_bytes));
  take(kS, &Impl::small_m_gemm_workspace, small_m_gemm_workspace_bytes(model, shard, options));
  take(kS, &Impl::logits_workspace,
       kernels::logits_pass_workspace_bytes(config.logits_rows_max(), model.vocab_size));
  take(kS, &Impl::argmax, r);
  take(kS, &Impl::row_nan_flags, r);
  take(kS, &Impl::row_max, r);
  take(kS, &Impl::row_sum, r);
  take(kS, &Impl::keys, r * v);
  take(kS, &Impl::sorted_keys, r * v);
  take(kS, &Impl::block_sums, r * z(ops::order_sum_stride(model.vocab_size)));
  take(kS, &Impl::block_prefixes, r * z(ops::order_sum_stride(model.vocab_size)));
  take(kS, &Impl::segment_offsets, r + 1);
  const size_t sort_bytes =
      kernels::sort_sampling_keys_temp_bytes(config.logits_rows_max(), model.vocab_size);
  LS_REQUIRE(sort_bytes > 0, "cuda backend: the sampler's sort reported no workspace size");
  take(kS, &Impl::sort_temp, sort_bytes);
  take(kS, &Impl::table, pool * z(config.table_width()));
  take(kS, &Impl::vcl, pool);
  take(kS, &Impl::future_inputs, pool * w);
  take(kS, &Impl::vcl_before, z(config.max_batch_rows));
  take(kS, &Impl::input_ids, t);
  take(kS, &Impl::positions, t);
  take(kS, &Impl::slots, t);
  take(kS, &Impl::token_pool_rows, t);
  if (drafts_ngram(config, options)) {
    take(kS, &Impl::history, pool * (z(config.context_length) + w));
    take(kS, &Impl::history_begin, pool);
  }
  const StagingLayout staging(config.max_batch_rows, config.logits_rows_max(),
                              config.prefill_chunk_tokens, config.table_width());
  take(kS, &Impl::staging, staging.words);
  const ResultsLayout results(config.max_batch_rows, config.logits_rows_max(),
                              config.verify_width, config.table_width(),
                              model.mamba_layers_count() > 0);
  take(kS, &Impl::results, results.words);
}

// Device bytes of the weights and of every workspace for one configuration: what a backend
// allocates besides the KV cache, whose size is the only one that depends on pages_count.
struct FixedBytes {
  int64_t weights = 0;
  int64_t workspace = 0;
};

// `full_model`: the whole model; a TP rank holds its shard and TpRank's buffers.
FixedBytes fixed_bytes(const ModelConfig& full_model, const ExecutorConfig& config,
                       const CudaBackendOptions& options) {
  FixedBytes out;
  lay_out_buffers(full_model, config, options, [&out](Account account, auto member, size_t count) {
    const auto bytes = static_cast<int64_t>(count * element_bytes(member));
    if (account == Account::kWeights) out.weights += bytes;
    if (account == Account::kWorkspace) out.workspace += bytes;
  });
  const TpRankShard shard = rank_shard(full_model, options);
  if (shard.degree > 1) {
    out.workspace += TpRank::workspace_bytes(shard, config.step_tokens_max(),
                                             config.logits_rows_max(), full_model.hidden_size);
  }
  return out;
}

}  // namespace

CudaBackend::Impl::Impl(const ModelConfig& model_config, const ExecutorConfig& executor_config,
                        const CudaBackendOptions& backend_options)
    : shard(rank_shard(model_config, backend_options)),
      full_model(model_config),
      model(rank_model_config(model_config, shard)),
      config(executor_config),
      options(backend_options),
      elem_bytes(backend_options.precision == CudaPrecision::kFp32 ? sizeof(float) : sizeof(bf16)),
      hidden(model.hidden_size),
      q_size(model.q_size()),
      kv_size(model.kv_size()),
      ffn(model.ffn_size),
      vocab(model.vocab_size),
      layers(model.layers_count),
      table_width(config.table_width()),
      positions_count(config.table_width() * config.page_size),
      tokens_max(config.step_tokens_max()),
      rows_max(config.max_batch_rows),
      logits_rows_max(config.logits_rows_max()),
      slots_count(int64_t{config.pages_count} * config.page_size),
      attention_shape{model.query_heads_count, model.kv_heads_count, model.head_dim,
                      config.table_width(), config.page_size,
                      config.table_width() * config.page_size},
      attention_prefill(backend_options.prefill_attention_by_decode_kernel
                            ? kernels::AttentionPrefill::kDecodeKernel
                            : kernels::AttentionPrefill::kTiles),
      layout(config.max_batch_rows, config.logits_rows_max(), config.prefill_chunk_tokens,
             config.table_width()),
      results_layout(config.max_batch_rows, config.logits_rows_max(), config.verify_width,
                     config.table_width(), model.mamba_layers_count() > 0) {
  refuse_unsupported();
  index_layer_kinds();
  LS_CUDA(cudaSetDevice(options.device));
  refuse_context_past_attention();
  stream = CudaStream::create();
  record_stream = CudaStream::create();
  record_fork = CudaEvent::create();
  record_join = CudaEvent::create();
  cublas = CublasHandle::create(stream.get());
  lay_out_buffers(full_model, config, options, [this](Account account, auto member, size_t count) {
    using Array = std::remove_reference_t<decltype(this->*member)>;
    int64_t& ledger_bytes = account == Account::kWeights ? ledger.weights
                            : account == Account::kKv    ? ledger.kv
                                                         : ledger.workspace;
    this->*member = Array(count, ledger_bytes);
  });
  LS_CUBLAS(cublasSetWorkspace(cublas.get(), cublas_workspace.get(), cublas_workspace.bytes()));
  gemm_plans = std::make_unique<kernels::GemmPlans>(stream.get(), cublas_workspace.get(),
                                                    cublas_workspace.bytes());
  if (shard.degree > 1) {
    tp = std::make_unique<TpRank>(full_model, shard, *options.tp_comm, tokens_max,
                                  logits_rows_max, ledger.workspace);
  }
  const FixedBytes planned = fixed_bytes(full_model, config, options);
  LS_ASSERT(planned.weights == ledger.weights, "weight bytes {} planned {}", ledger.weights,
            planned.weights);
  LS_ASSERT(planned.workspace == ledger.workspace, "workspace bytes {} planned {}",
            ledger.workspace, planned.workspace);
  drafting = drafts_ngram(config, options);
  if (drafting) history_capacity = config.context_length + config.verify_width;
  initialise_buffers();
  create_host_side();
  buckets = decode_buckets(rows_max);
  if (options.profile) {
    // Start, state ops, embedding, 9 per layer, head, tail.
    const size_t marks_max = 16 + 9 * static_cast<size_t>(layers);
    phase_marks.create(marks_max);
  }
  linears = linear_shapes_of(model, shard, options);
  plan_gemms();
  LS_CUDA(cudaStreamSynchronize(stream.get()));
}

// Batch-invariant mode (options.batch_invariant) holds only where every product runs the small-M
// GEMM and nothing else depends on the batch: what it does not cover is refused by name.
static_assert(kSmallMGemmTokensInvariant == kernels::kSmallMGemmTokensMax,
              "batch_invariant_options asks for the small-M GEMM's most tokens");

// The profile's leave_out (a benchmark's option: the step computes wrong logits) covers the bf16
// attention decoder at TP 1, whose kernels LeaveOut names; anything else is refused by name.
void CudaBackend::Impl::refuse_what_leave_out_cannot_cover() const {
  const char* what = "cuda backend: leave_out (a benchmark's profile)";
  LS_REQUIRE((options.leave_out & ~kLeaveOutAll) == 0, "{}: bits {:#x} name no kernel (LeaveOut "
             "has {:#x})", what, options.leave_out & ~kLeaveOutAll, kLeaveOutAll);
  LS_REQUIRE(options.precision == CudaPrecision::kBf16, "{} runs bf16 only", what);
  LS_REQUIRE(!options.batch_invariant, "{} does not cover batch-invariant mode", what);
  LS_REQUIRE(shard.degree == 1, "{} runs at TP 1 only", what);
  LS_REQUIRE(options.drafter.empty() || options.drafter == kNoDrafterName,
             "{} does not cover a drafter ('{}')", what, options.drafter);
  LS_REQUIRE(!model.has_recurrent_state(), "{} does not cover Mamba layers", what);
  // The split kernel's parts exist on its tensor-core form at llama's group (kernels/attention.h).
  int32_t parts = 0;
  for (const LeaveOut part : kLeaveOutKinds) {
    if (is_split_kernel_part(part) && leaves_out(part)) ++parts;
  }
  if (parts == 0) return;
  LS_REQUIRE(parts == 1, "{}: attention_body, attention_kv_reads and attention_arithmetic are "
             "parts of one kernel, left out one at a time", what);
  const int32_t group = model.query_heads_count / model.kv_heads_count;
  LS_REQUIRE(kernels::attention_split_parts_exist(model.head_dim, group), "{}: attention's parts "
             "need head_dim 64 or 128 (the tensor-core kernel) and {} query heads a KV head, not "
             "head_dim {} and {}", what, kernels::kAttentionLeaveOutGroup, model.head_dim, group);
}

void CudaBackend::Impl::refuse_what_batch_invariance_cannot_cover() const {
  const char* what = "cuda backend: batch_invariant (--determinism invariant)";
  LS_REQUIRE(options.precision == CudaPrecision::kBf16, "{} runs bf16 only (the small-M GEMM)", what);
  LS_REQUIRE(options.gemv_tokens_max == 0, "{} needs gemv_tokens_max 0, not {} (the GEMV sums in "
             "another order than the small-M GEMM)", what, options.gemv_tokens_max);
  LS_REQUIRE(small_m_gemm_tokens_max_of(options) == kernels::kSmallMGemmTokensMax,
             "{} needs small_m_gemm_tokens_max {}, not {}", what, kernels::kSmallMGemmTokensMax,
             small_m_gemm_tokens_max_of(options));
  LS_REQUIRE(shard.degree == 1, "{} runs at TP 1 only (an all-reduce's sum is not a row's own)",
             what);
  LS_REQUIRE(options.drafter.empty() || options.drafter == kNoDrafterName,
             "{} does not cover a drafter ('{}'): speculative decoding's invariance is untested",
             what, options.drafter);
  LS_REQUIRE(config.verify_width == 1, "{} does not cover speculative decoding (verify_width {})",
             what, config.verify_width);
  LS_REQUIRE(!model.has_recurrent_state(), "{} does not cover Mamba layers (the chunked and the "
             "sequential scans sum in different orders)", what);
  LS_REQUIRE(options.prefill_attention_by_decode_kernel, "{} needs "
             "prefill_attention_by_decode_kernel (the prefill tile kernel computes a chunk's "
             "tokens in another order than the decode kernel)", what);
  const LinearShapes s = linear_shapes_of(model, shard, options);
  for (const LinearShape& shape : {s.qkv, s.o, s.gate_up, s.down, s.lm_head}) {
    LS_REQUIRE(shape.in % 8 == 0, "{} needs every linear layer's input a multiple of 8 (one "
               "has {})", what, shape.in);
  }
}

// What this backend cannot run, refused before anything is allocated.
void CudaBackend::Impl::refuse_unsupported() const {
  model.validate();
  config.validate();
  check_context_length(model, config.context_length, /*allow_beyond_max_positions=*/true);
  refuse_unsupported_hybrid();
  LS_REQUIRE(options.drafter.empty() || options.drafter == kNoDrafterName ||
                 options.drafter == "ngram",
             "cuda backend: unknown drafter '{}'; the CUDA backend runs 'none' and 'ngram' "
             "(oracle-mix is the simulator's and runs on the CPU reference only)",
             options.drafter);
  LS_REQUIRE(int64_t{logits_rows_max} * vocab < (int64_t{1} << 31),
             "cuda backend: logits rows ({}) × vocab ({}) exceed 2^31", logits_rows_max, vocab);
  if (options.batch_invariant) refuse_what_batch_invariance_cannot_cover();  // its names first
  if (options.leave_out != 0) refuse_what_leave_out_cannot_cover();
  LS_REQUIRE(options.gemv_tokens_max >= 0 && options.gemv_tokens_max <= kernels::kGemvTokensMax,
             "cuda backend: gemv_tokens_max {} is outside [0, {}]", options.gemv_tokens_max,
             kernels::kGemvTokensMax);
  // A small-M GEMM token limit: within the kernel's, and 0 unless bf16.
  const auto refuse_bad_small_m_limit = [&](const char* name, int32_t value) {
    LS_REQUIRE(value >= 0 && value <= kernels::kSmallMGemmTokensMax,
               "cuda backend: {} {} is outside [0, {}]", name, value,
               kernels::kSmallMGemmTokensMax);
    LS_REQUIRE(value == 0 || options.precision == CudaPrecision::kBf16,
               "cuda backend: {} {} needs bf16 precision (the small-M GEMM has bf16 operands; "
               "fp32 runs pedantic cuBLAS)", name, value);
  };
  const int32_t small_m = small_m_gemm_tokens_max_of(options);
  refuse_bad_small_m_limit("small_m_gemm_tokens_max", small_m);
  const int32_t large = small_m_gemm_large_tokens_max_of(options);
  refuse_bad_small_m_limit("small_m_gemm_large_tokens_max", large);
  LS_REQUIRE(large >= small_m,
             "cuda backend: small_m_gemm_large_tokens_max {} is below small_m_gemm_tokens_max {}, "
             "which every product runs the small-M GEMM up to: it would change nothing",
             large, small_m);
  LS_REQUIRE(model.head_dim % 8 == 0 && model.head_dim <= 256,
             "cuda backend: head_dim {} must be a multiple of 8 and at most 256", model.head_dim);
  LS_REQUIRE((model.query_heads_count / model.kv_heads_count) * model.head_dim <= 1024,
             "cuda backend: (query heads / KV heads) · head_dim = {} exceeds 1024",
             (model.query_heads_count / model.kv_heads_count) * model.head_dim);
  int devices = 0;
  LS_REQUIRE(cudaGetDeviceCount(&devices) == cudaSuccess && devices > options.device,
             "cuda backend: no CUDA device {} (found {})", options.device, devices);
  LS_REQUIRE(shard.degree == 1 || options.tp_comm != nullptr,
             "cuda backend: rank {} of a TP {} group needs its communicator", shard.rank,
             shard.degree);
}

// The decode attention's combine holds two floats for each of a token's splits in a block's
// shared memory: a context past what the device allows is refused by name here, not left to fail
// at its first launch.
void CudaBackend::Impl::refuse_context_past_attention() const {
  int64_t positions_max = 0;
  LS_CUDA(kernels::attention_positions_max(&positions_max));
  LS_REQUIRE(positions_count <= positions_max,
             "cuda backend: a context of {} positions (table_width {} × page_size {}) exceeds "
             "the {} the decode attention combines on this GPU (two floats a {}-key split in one "
             "block's shared memory)",
             positions_count, table_width, config.page_size, positions_max,
             kernels::kAttentionSplitKeys);
}

// The pinned buffers of the step's copies (by step parity), the host KV pages, and the events.
void CudaBackend::Impl::create_host_side() {
  host_kv = PinnedArray<uint8_t>(static_cast<size_t>(config.host_pages_count) * 2 * kv_layers *
                                 config.page_size * kv_size * elem_bytes);
  for (auto& buffer : host_staging) buffer = PinnedArray<int32_t>(layout.words);
  for (auto& event : upload_done) event = CudaEvent::create();
  for (auto& buffer : host_results) buffer = PinnedArray<int32_t>(results.count());
  for (auto& event : step_done) event = CudaEvent::create();
  if (options.time_steps) step_timer.create();
}

// What the buffers hold before the first step: zeros (KV, state, staging, the last TP rank's
// head rows past the vocabulary, whose logits are never gathered), the RoPE table, the
// sampler's segment offsets and the pad token in every input id.
void CudaBackend::Impl::initialise_buffers() {
  const cudaStream_t s = stream.get();
  if (shard.degree > 1) LS_CUDA(cudaMemsetAsync(lm_head.get(), 0, lm_head.bytes(), s));
  LS_CUDA(cudaMemsetAsync(k_cache.get(), 0, k_cache.bytes(), s));
  LS_CUDA(cudaMemsetAsync(v_cache.get(), 0, v_cache.bytes(), s));
  // The same table as the CPU reference's: one function of the model's rope parameters.
  const RopeTable rope = build_rope_table(model.rope(), model.rotary_dim(), positions_count);
  LS_ASSERT(rope.cos.size() == rope_cos.count() && rope.sin.size() == rope_sin.count(),
            "RoPE table of {} entries, buffers of {}", rope.cos.size(), rope_cos.count());
  LS_CUDA(cudaMemcpy(rope_cos.get(), rope.cos.data(), rope_cos.bytes(), cudaMemcpyHostToDevice));
  LS_CUDA(cudaMemcpy(rope_sin.get(), rope.sin.data(), rope_sin.bytes(), cudaMemcpyHostToDevice));
  std::vector<int32_t> offsets(segment_offsets.count());
  for (size_t i = 0; i < offsets.size(); ++i) offsets[i] = static_cast<int32_t>(i * vocab);
  LS_CUDA(cudaMemcpy(segment_offsets.get(), offsets.data(), segment_offsets.bytes(),
                     cudaMemcpyHostToDevice));
  for (DeviceArray<int32_t>* a : {&table, &vcl, &future_inputs, &vcl_before, &positions}) {
    LS_CUDA(cudaMemsetAsync(a->get(), 0, a->bytes(), s));
  }
  LS_CUDA(cudaMemsetAsync(slots.get(), 0, slots.bytes(), s));
  if (drafting) {
    LS_CUDA(cudaMemsetAsync(history.get(), 0, history.bytes(), s));
    LS_CUDA(cudaMemsetAsync(history_begin.get(), 0, history_begin.bytes(), s));
  }
  const std::vector<int32_t> pads(input_ids.count(), kernels::kPadInputId);
  LS_CUDA(cudaMemcpy(input_ids.get(), pads.data(), input_ids.bytes(), cudaMemcpyHostToDevice));
  LS_CUDA(cudaMemsetAsync(staging.get(), 0, staging.bytes(), s));
  initialise_mamba();
}

CudaBackend::Impl::~Impl() {
  // Nothing may still read a buffer when the members free it.
  if (stream.get() != nullptr) cudaStreamSynchronize(stream.get());
}

CudaKvSizing cuda_kv_sizing(const ModelConfig& model, const ExecutorConfig& config,
                            const CudaBackendOptions& options) {
  LS_REQUIRE(options.kv_memory_fraction > 0.0 && options.kv_memory_fraction < 1.0,
             "cuda backend: kv_memory_fraction {} is outside (0, 1)", options.kv_memory_fraction);
  LS_REQUIRE(cuda_device_available(), "no CUDA device is available");
  LS_CUDA(cudaSetDevice(options.device));
  size_t free_bytes = 0, total_bytes = 0;
  LS_CUDA(cudaMemGetInfo(&free_bytes, &total_bytes));
  const FixedBytes fixed = fixed_bytes(model, config, options);
  CudaKvSizing s;
  s.free_bytes = static_cast<int64_t>(free_bytes);
  s.weight_bytes = fixed.weights;
  s.workspace_bytes = fixed.workspace;
  const int64_t elem = options.precision == CudaPrecision::kFp32 ? 4 : 2;
  // A TP rank's pages hold its kv heads.
  const int64_t kv_size = rank_model_config(model, rank_shard(model, options)).kv_size();
  const int64_t kv_layers = model.layers_count - model.mamba_layers_count();  // attention layers
  LS_REQUIRE(kv_layers > 0, "cuda backend: model '{}' has no attention layer to size KV pages for",
             model.name);
  s.page_bytes = 2 * kv_layers * config.page_size * kv_size * elem;
  const int64_t left = s.free_bytes - s.weight_bytes - s.workspace_bytes;
  LS_REQUIRE(left > 0, "cuda backend: weights ({} B) and workspaces ({} B) exceed the {} B free",
             s.weight_bytes, s.workspace_bytes, s.free_bytes);
  s.kv_budget_bytes = static_cast<int64_t>(options.kv_memory_fraction * static_cast<double>(left));
  const int64_t pages = std::min<int64_t>(s.kv_budget_bytes / s.page_bytes, kCudaKvPagesMax);
  LS_REQUIRE(pages >= 2, "cuda backend: {} B for KV hold {} pages of {} B; at least 2 are needed",
             s.kv_budget_bytes, pages, s.page_bytes);
  s.pages_count = static_cast<int32_t>(pages);
  return s;
}

}  // namespace ls
