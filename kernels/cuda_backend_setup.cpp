// CudaBackend::Impl's construction: the limits it refuses, then every buffer allocated once from
// the ExecutorConfig (cuda_workspace.h plans the same bytes); and cuda_kv_sizing.
#include "kernels/cuda_backend_impl.h"

#include "core/drafter.h"
#include "core/model/rope.h"
#include "kernels/gemm.h"
#include "kernels/layer_ops.h"
#include "kernels/logits_ops.h"
#include "kernels/sampling_ops.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <vector>

namespace ls {

using kernels::bf16;

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
      layout(config.max_batch_rows, config.logits_rows_max(), config.prefill_chunk_tokens,
             config.table_width()),
      results_layout(config.max_batch_rows, config.logits_rows_max(), config.verify_width,
                     config.table_width()) {
  model.validate();
  config.validate();
  check_context_length(model, config.context_length, /*allow_beyond_max_positions=*/true);
  // TODO(perf): the chunked scan and single-step update kernels (issue 19).
  LS_REQUIRE(!model.has_recurrent_state(), "cuda backend: model '{}' has {} Mamba2 layers, which "
             "the CUDA backend does not implement yet (run it with --backend cpu)", model.name,
             model.mamba_layers_count());
  // The RoPE kernel pairs dim i with i + head_dim/2 over the whole head: a partial rotary would
  // need a table of rotary_dim/2 columns and pass-through dims it does not have.
  LS_REQUIRE(model.rotary_dim() == model.head_dim, "cuda backend: model '{}' rotates {} of its "
             "head_dim {} (partial_rotary_dim), which the CUDA RoPE kernel does not implement "
             "(run it with --backend cpu)", model.name, model.rotary_dim(), model.head_dim);
  LS_REQUIRE(options.drafter.empty() || options.drafter == kNoDrafterName ||
                 options.drafter == "ngram",
             "cuda backend: unknown drafter '{}'; the CUDA backend runs 'none' and 'ngram' "
             "(oracle-mix is the simulator's and runs on the CPU reference only)",
             options.drafter);
  LS_REQUIRE(int64_t{logits_rows_max} * vocab < (int64_t{1} << 31),
             "cuda backend: logits rows ({}) × vocab ({}) exceed 2^31", logits_rows_max, vocab);
  LS_REQUIRE(options.gemv_tokens_max >= 0 && options.gemv_tokens_max <= kernels::kGemvTokensMax,
             "cuda backend: gemv_tokens_max {} is outside [0, {}]", options.gemv_tokens_max,
             kernels::kGemvTokensMax);
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
  LS_CUDA(cudaSetDevice(options.device));
  stream = CudaStream::create();
  record_stream = CudaStream::create();
  record_fork = CudaEvent::create();
  record_join = CudaEvent::create();
  cublas = CublasHandle::create(stream.get());

  const auto t = static_cast<size_t>(tokens_max);
  const auto h = static_cast<size_t>(hidden);
  const auto l = static_cast<size_t>(layers);
  const auto v = static_cast<size_t>(vocab);
  const auto r = static_cast<size_t>(logits_rows_max);
  const auto pool = static_cast<size_t>(config.pool_rows_count());
  auto& w = ledger.weights;
  embedding = elements(v * h, w);
  if (shard.degree > 1) {
    lm_head = elements(static_cast<size_t>(shard.vocab_rows) * h, w);
    // The last rank's rows past the vocabulary stay zero (their logits are never gathered).
    LS_CUDA(cudaMemsetAsync(lm_head.get(), 0, lm_head.bytes(), stream.get()));
  } else if (!model.tied_embeddings) {
    lm_head = elements(v * h, w);
  }
  w_qkv = elements(l * (q_size + 2 * kv_size) * h, w);
  w_o = elements(l * h * q_size, w);
  w_gate_up = elements(l * 2 * ffn * h, w);
  w_down = elements(l * h * ffn, w);
  attn_norm = DeviceArray<float>(l * h, w);
  ffn_norm = DeviceArray<float>(l * h, w);
  final_norm = DeviceArray<float>(h, w);
  if (model.qkv_bias) qkv_bias = DeviceArray<float>(l * (q_size + 2 * kv_size), w);
  if (model.qk_norm) {
    q_norm = DeviceArray<float>(l * model.head_dim, w);
    k_norm = DeviceArray<float>(l * model.head_dim, w);
  }

  const size_t kv_elems = l * static_cast<size_t>(slots_count) * kv_size;
  k_cache = elements(kv_elems, ledger.kv);
  v_cache = elements(kv_elems, ledger.kv);
  LS_CUDA(cudaMemsetAsync(k_cache.get(), 0, k_cache.bytes(), stream.get()));
  LS_CUDA(cudaMemsetAsync(v_cache.get(), 0, v_cache.bytes(), stream.get()));
  host_kv = PinnedArray<uint8_t>(static_cast<size_t>(config.host_pages_count) * 2 * l *
                                 config.page_size * kv_size * elem_bytes);
  // The same table as the CPU reference's: one function of the model's rope parameters.
  const RopeTable rope = build_rope_table(model.rope(), model.rotary_dim(), positions_count);
  auto& ws = ledger.workspace;
  rope_cos = DeviceArray<float>(rope.cos.size(), ws);
  rope_sin = DeviceArray<float>(rope.sin.size(), ws);
  LS_CUDA(cudaMemcpy(rope_cos.get(), rope.cos.data(), rope_cos.bytes(), cudaMemcpyHostToDevice));
  LS_CUDA(cudaMemcpy(rope_sin.get(), rope.sin.data(), rope_sin.bytes(), cudaMemcpyHostToDevice));

  residual = DeviceArray<float>(t * h, ws);
  normed = elements(t * h, ws);
  qkv = DeviceArray<float>(t * (q_size + 2 * kv_size), ws);
  q = DeviceArray<float>(t * q_size, ws);
  attn_out = elements(t * q_size, ws);
  gate_up = DeviceArray<float>(t * 2 * ffn, ws);
  act = elements(t * ffn, ws);
  // Decode steps (rows_max · W tokens) must fit in one attention launch (graphs); prefill may
  // be chunked under the cap.
  const size_t decode_floats = kernels::attention_workspace_floats(
      attention_shape, rows_max * config.verify_width);
  const size_t all_floats = kernels::attention_workspace_floats(attention_shape, tokens_max);
  const size_t cap_floats = static_cast<size_t>(options.attention_workspace_bytes_max) / 4;
  attention_workspace =
      DeviceArray<float>(std::max(decode_floats, std::min(all_floats, cap_floats)), ws);
  final_normed = elements(r * h, ws);
  logits = DeviceArray<float>(r * v, ws);
  cublas_workspace = DeviceArray<uint8_t>(static_cast<size_t>(options.cublas_workspace_bytes), ws);
  LS_CUBLAS(cublasSetWorkspace(cublas.get(), cublas_workspace.get(), cublas_workspace.bytes()));
  gemm_plans = std::make_unique<kernels::GemmPlans>(stream.get(), cublas_workspace.get(),
                                                    cublas_workspace.bytes());
  if (shard.degree > 1) {
    tp = std::make_unique<TpRank>(full_model, shard, *options.tp_comm, tokens_max,
                                  logits_rows_max, ws);
  }
  linears = linear_shapes();
  plan_gemms();

  logits_workspace =
      DeviceArray<uint8_t>(kernels::logits_pass_workspace_bytes(logits_rows_max, vocab), ws);
  argmax = DeviceArray<int32_t>(r, ws);
  row_nan_flags = DeviceArray<int32_t>(r, ws);
  row_max = DeviceArray<float>(r, ws);
  row_sum = DeviceArray<float>(r, ws);
  keys = DeviceArray<uint64_t>(r * v, ws);
  sorted_keys = DeviceArray<uint64_t>(r * v, ws);
  std::vector<int32_t> offsets(r + 1);
  for (size_t i = 0; i <= r; ++i) offsets[i] = static_cast<int32_t>(i * v);
  segment_offsets = DeviceArray<int32_t>(r + 1, ws);
  LS_CUDA(cudaMemcpy(segment_offsets.get(), offsets.data(), segment_offsets.bytes(),
                     cudaMemcpyHostToDevice));
  const size_t sort_bytes = kernels::sort_sampling_keys_temp_bytes(logits_rows_max, vocab);
  LS_REQUIRE(sort_bytes > 0, "cuda backend: the sampler's sort reported no workspace size");
  sort_temp = DeviceArray<uint8_t>(sort_bytes, ws);

  table = DeviceArray<int32_t>(pool * table_width, ws);
  vcl = DeviceArray<int32_t>(pool, ws);
  future_inputs = DeviceArray<int32_t>(pool * config.verify_width, ws);
  vcl_before = DeviceArray<int32_t>(static_cast<size_t>(rows_max), ws);
  input_ids = DeviceArray<int32_t>(t, ws);
  positions = DeviceArray<int32_t>(t, ws);
  slots = DeviceArray<int64_t>(t, ws);
  token_pool_rows = DeviceArray<int32_t>(t, ws);
  for (DeviceArray<int32_t>* a : {&table, &vcl, &future_inputs, &vcl_before, &positions}) {
    LS_CUDA(cudaMemsetAsync(a->get(), 0, a->bytes(), stream.get()));
  }
  LS_CUDA(cudaMemsetAsync(slots.get(), 0, slots.bytes(), stream.get()));
  drafting = drafts_ngram(config, options);
  if (drafting) {
    history_capacity = config.context_length + config.verify_width;
    history = DeviceArray<int32_t>(pool * static_cast<size_t>(history_capacity), ws);
    history_begin = DeviceArray<int32_t>(pool, ws);
    LS_CUDA(cudaMemsetAsync(history.get(), 0, history.bytes(), stream.get()));
    LS_CUDA(cudaMemsetAsync(history_begin.get(), 0, history_begin.bytes(), stream.get()));
  }
  std::vector<int32_t> pads(t, kernels::kPadInputId);
  LS_CUDA(cudaMemcpy(input_ids.get(), pads.data(), input_ids.bytes(), cudaMemcpyHostToDevice));

  staging = DeviceArray<int32_t>(layout.words, ws);
  LS_CUDA(cudaMemsetAsync(staging.get(), 0, staging.bytes(), stream.get()));
  for (auto& buffer : host_staging) buffer = PinnedArray<int32_t>(layout.words);
  for (auto& event : upload_done) event = CudaEvent::create();
  results = DeviceArray<int32_t>(results_layout.words, ws);
  for (auto& buffer : host_results) buffer = PinnedArray<int32_t>(results.count());
  for (auto& event : step_done) event = CudaEvent::create();
  if (options.time_steps) {
    for (auto& event : step_begin_marks) event = CudaEvent::create(true);
    for (auto& event : step_end_marks) event = CudaEvent::create(true);
  }
  buckets = decode_buckets(rows_max);
  const FixedBytes planned = fixed_bytes(full_model, config, options);
  LS_ASSERT(planned.weights == ledger.weights, "weight bytes {} planned {}", ledger.weights,
            planned.weights);
  LS_ASSERT(planned.workspace == ledger.workspace, "workspace bytes {} planned {}",
            ledger.workspace, planned.workspace);
  if (options.profile) {
    const size_t marks_max = 16 + 9 * l;  // start, state ops, embedding, 9 per layer, head, tail
    for (size_t i = 0; i < marks_max; ++i) mark_events.push_back(CudaEvent::create(true));
    mark_phases.assign(marks_max, CudaPhase::kCount);
  }
  LS_CUDA(cudaStreamSynchronize(stream.get()));
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
  s.page_bytes = 2 * int64_t{model.layers_count} * config.page_size * kv_size * elem;
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
