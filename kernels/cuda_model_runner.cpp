// The model runner: the forward's kernels for one step (embedding, every layer, final norm and LM
// head) and its linear layers (GEMV, small-M GEMM, pinned cuBLASLt plans, or pedantic fp32
// cuBLAS).
#include "kernels/cuda_backend_impl.h"

#include "kernels/decode_gemv.h"
#include "kernels/gemm.h"
#include "kernels/gemm_small_m.h"
#include "kernels/layer_ops.h"
#include "kernels/seams.h"

#include <type_traits>

namespace ls {

using kernels::bf16;

// The linear layers' shapes, one place for the forward that runs them and plan_gemms that plans
// them: at TP 1 the o and down products add into the residual stream (beta = 1); at TP > 1 they
// write this rank's partial (row_parallel), and the LM head this rank's vocabulary rows.
CudaBackend::Impl::LinearShapes CudaBackend::Impl::linear_shapes_of(
    const ModelConfig& model, const TpRankShard& shard, const CudaBackendOptions& options) {
  const bool into_residual = shard.degree == 1;
  const bool hybrid = model.mamba_layers_count() > 0;
  const int32_t hidden = model.hidden_size, q_size = model.q_size(), kv_size = model.kv_size();
  LinearShapes s{
      .qkv = {.out = q_size + 2 * kv_size, .in = hidden, .accumulate = false},
      .o = {.out = hidden, .in = q_size, .accumulate = into_residual},
      .gate_up = {.out = 2 * model.ffn_size, .in = hidden, .accumulate = false},
      .down = {.out = hidden, .in = model.ffn_size, .accumulate = into_residual},
      .lm_head = {.out = shard.degree > 1 ? shard.vocab_rows : model.vocab_size, .in = hidden,
                  .accumulate = false},
      .in_proj = {.out = hybrid ? model.mamba.in_proj_size() : 0, .in = hidden,
                  .accumulate = false},
      .out_proj = {.out = hybrid ? hidden : 0, .in = model.mamba.inner_size(),
                   .accumulate = true},
  };
  for (LinearShape* shape :
       {&s.qkv, &s.o, &s.gate_up, &s.down, &s.lm_head, &s.in_proj, &s.out_proj}) {
    shape->small_m_tokens_max = small_m_gemm_tokens_max_for(options, shape->out, shape->in);
  }
  return s;
}

bool CudaBackend::Impl::uses_gemv(int32_t tokens, int32_t in) const {
  return tokens >= 1 && tokens <= options.gemv_tokens_max && in % 8 == 0;
}

bool CudaBackend::Impl::uses_small_m_gemm(int32_t tokens, const LinearShape& shape) const {
  return !uses_gemv(tokens, shape.in) && tokens >= 1 &&
         tokens <= shape.small_m_tokens_max && shape.in % 8 == 0;
}

// Batch-invariant mode: a wider step too, in blocks of the kernel's most tokens
// (in_small_m_blocks), each row summed as at any other token count.
bool CudaBackend::Impl::linear_by_small_m_gemm(int32_t tokens, const LinearShape& shape) const {
  return uses_small_m_gemm(tokens, shape) ||
         (options.batch_invariant && tokens > 0 && !uses_gemv(tokens, shape.in));
}

namespace {

// launch(first, count) for each block of at most kSmallMGemmTokensMax of a step's `tokens`, in
// order: how a wider step runs on the small-M GEMM.
template <typename Launch>
void in_small_m_blocks(int32_t tokens, Launch&& launch) {
  for (int32_t first = 0; first < tokens; first += kernels::kSmallMGemmTokensMax) {
    launch(first, std::min(kernels::kSmallMGemmTokensMax, tokens - first));
  }
}

}  // namespace

template <typename T>
kernels::RopeKvTarget CudaBackend::Impl::rope_kv_target(int32_t first, T* k_layer,
                                                        T* v_layer) const {
  return kernels::RopeKvTarget{
      .positions = positions.get() + first,
      .slots = slots.get() + first,
      .query_heads = model.query_heads_count,
      .kv_heads = model.kv_heads_count,
      .head_dim = model.head_dim,
      .cos = rope_cos.get(),
      .sin = rope_sin.get(),
      .positions_count = positions_count,
      .q_out = q.get() + int64_t{first} * q_size,
      .k_cache = k_layer,
      .v_cache = v_layer,
  };
}

template <typename T>
const T* CudaBackend::Impl::qkv_weight(int32_t layer) const {
  return as<T>(w_qkv) + static_cast<size_t>(layer) * static_cast<size_t>(linears.qkv.out) *
                            static_cast<size_t>(hidden);
}

template <typename T>
const T* CudaBackend::Impl::gate_up_weight(int32_t layer) const {
  return as<T>(w_gate_up) + static_cast<size_t>(layer) * static_cast<size_t>(linears.gate_up.out) *
                                static_cast<size_t>(hidden);
}

// Every bf16 product a step can ask linear() for, planned at construction so that a step's
// launches only look plans up: each layer product at every token count a step may carry (decode
// buckets × W, and any prefill or mixed count up to step_tokens_max), the LM head at every count
// of logits rows; the counts the GEMV or the small-M GEMM runs need none. fp32 runs pedantic
// cuBLAS, unplanned.
void CudaBackend::Impl::plan_gemms() {
  if (options.precision == CudaPrecision::kFp32 || options.batch_invariant) return;
  const LinearShape layer_shapes[] = {linears.qkv, linears.o, linears.gate_up, linears.down};
  const auto plan_all = [this](const LinearShape& shape, int32_t tokens_count) {
    for (int32_t t = 1; t <= tokens_count; ++t) {
      if (uses_gemv(t, shape.in) || uses_small_m_gemm(t, shape)) continue;
      LS_CUBLAS(gemm_plans->prepare(t, shape.out, shape.in, shape.accumulate));
    }
  };
  for (const LinearShape& shape : layer_shapes) plan_all(shape, tokens_max);
  if (hybrid()) {
    plan_all(linears.in_proj, tokens_max);
    plan_all(linears.out_proj, tokens_max);
  }
  plan_all(linears.lm_head, logits_rows_max);
}

// y[tokens, shape.out] = x[tokens, shape.in] · wᵀ (+ y when shape.accumulate).
template <typename T>
void CudaBackend::Impl::linear(const T* x, const T* w, float* y, int32_t tokens,
                               LinearShape shape) {
  const float beta = shape.accumulate ? 1.0f : 0.0f;
  const int32_t out = shape.out, in = shape.in;
  if constexpr (std::is_same_v<T, float>) {
    LS_CUBLAS(kernels::gemm_f32_rowmajor(cublas.get(), x, w, y, tokens, out, in, beta));
  } else {
    if (uses_gemv(tokens, in)) {
      LS_CUDA(kernels::launch_gemv_bf16(x, w, y, tokens, out, in, beta, forward_stream()));
    } else if (linear_by_small_m_gemm(tokens, shape)) {
      in_small_m_blocks(tokens, [&](int32_t first, int32_t count) {
        LS_CUDA(kernels::launch_gemm_small_m_bf16(
            x + int64_t{first} * in, w, y + int64_t{first} * out, count, out, in, beta,
            small_m_gemm_workspace.get(), small_m_gemm_workspace.bytes(), forward_stream()));
      });
    } else if (tokens > 0) {
      kernels::GemmPlans::Plan* plan = gemm_plans->find(tokens, out, in, shape.accumulate);
      LS_ASSERT(plan != nullptr, "no GEMM plan for {} tokens × [out {}, in {}]{}: plan_gemms "
                "plans every shape at construction, a step never makes one", tokens, out, in,
                shape.accumulate ? " accumulating" : "");
      LS_CUBLAS(gemm_plans->run(*plan, x, w, y, beta));
    }
  }
}

// The attention input's norm, the QKV product, RoPE and the KV write (folded together where the
// step's products allow); whether the norm was folded (the activation capture reads `normed`
// only where it was not).
template <typename T>
bool CudaBackend::Impl::enqueue_qkv(int32_t i, int32_t tokens, T* k_layer, T* v_layer) {
  const kernels::LaunchStream s = forward_stream();
  const size_t li = static_cast<size_t>(i);
  const size_t h = static_cast<size_t>(hidden);
  QkvFused fused = enqueue_fused_qkv(i, tokens, k_layer, v_layer);
  bool norm_fused = fused != QkvFused::kNone;
  if (!norm_fused) {
    T* x = as<T>(normed);
    const float* norm_weight = attn_norm.get() + li * h;
    const bool through_kv = small_m_rope_kv_runs(tokens);
    norm_fused = through_kv && small_m_folds_norm(tokens);
    if (!norm_fused) {
      LS_CUDA(kernels::launch_rms_norm(residual.get(), nullptr, tokens, hidden, norm_weight,
                                       model.rms_eps, x, s));
      mark(CudaPhase::kNorms);
    }
    if (through_kv) {
      enqueue_small_m_qkv_rope_kv(i, tokens, x, norm_fused ? norm_weight : nullptr, k_layer,
                                  v_layer);
      fused = QkvFused::kThroughKv;
    } else {
      linear(x, qkv_weight<T>(i), qkv.get(), tokens, linears.qkv);
    }
  }
  mark(CudaPhase::kGemmQkv);
  if (fused != QkvFused::kThroughKv) {
    // Qwen2's biases and Qwen3's head norms in RoPE's launch (none for Llama).
    const size_t d = static_cast<size_t>(model.head_dim);
    const kernels::QkvHeadPrep prep{
        model.qkv_bias ? qkv_bias.get() + li * linears.qkv.out : nullptr,
        model.qk_norm ? q_norm.get() + li * d : nullptr,
        model.qk_norm ? k_norm.get() + li * d : nullptr, model.rms_eps};
    LS_CUDA(kernels::launch_qkv_prep_rope(qkv.get(), prep, positions.get(), slots.get(), tokens,
                                          model.query_heads_count, model.kv_heads_count,
                                          model.head_dim, model.rotary_dim(), rope_cos.get(),
                                          rope_sin.get(), positions_count, q.get(), k_layer,
                                          v_layer, s));
    mark(CudaPhase::kRope);
  }
  return norm_fused;
}

// The parts of decode attention options.leave_out names, as kernels/attention.h's bits. Leaving
// the split kernel's body or arithmetic out leaves the combine out too: it would merge partials no
// split wrote (NaN from the zeros of an unwritten workspace), where without it `attn_out` keeps
// finite values.
uint32_t CudaBackend::Impl::attention_leave_out() const {
  uint32_t bits = 0;
  if (leaves_out(LeaveOut::kCombine)) bits |= kernels::kAttentionCombine;
  if (leaves_out(LeaveOut::kAttentionBody)) {
    bits |= kernels::kAttentionSplitBody | kernels::kAttentionCombine;
  }
  if (leaves_out(LeaveOut::kAttentionKvReads)) bits |= kernels::kAttentionKvReads;
  if (leaves_out(LeaveOut::kAttentionArithmetic)) {
    bits |= kernels::kAttentionArithmetic | kernels::kAttentionCombine;
  }
  return bits;
}

// An attention layer; the kernels options.leave_out names are left out (the benchmark's profile).
template <typename T>
void CudaBackend::Impl::enqueue_layer(int32_t i, int32_t tokens, int32_t prefill_tokens) {
  const size_t li = static_cast<size_t>(i);
  const size_t h = static_cast<size_t>(hidden);
  const size_t kv_layer = static_cast<size_t>(slots_count) * kv_size;
  const size_t kv_at = static_cast<size_t>(kv_index[li]) * kv_layer;
  T* k_layer = as<T>(k_cache) + kv_at;
  T* v_layer = as<T>(v_cache) + kv_at;
  const bool norm_fused =
      !leaves_out(LeaveOut::kQkv) && enqueue_qkv<T>(i, tokens, k_layer, v_layer);
  if (!leaves_out(LeaveOut::kAttention)) {
    LS_CUDA(kernels::launch_paged_attention(
        attention_shape, q.get(), k_layer, v_layer, positions.get(), token_pool_rows.get(),
        table.get(), tokens, prefill_tokens, attention_prefill, attention_workspace.get(),
        attention_workspace.count(), as<T>(attn_out), forward_stream(), attention_leave_out()));
    mark(CudaPhase::kAttention);
  }
  if (activation_capture) capture_attention<T>(i, norm_fused, k_layer, v_layer);
  if (!leaves_out(LeaveOut::kO)) {
    row_parallel(as<T>(attn_out), as<T>(w_o) + li * h * q_size, tokens, linears.o);
    mark(CudaPhase::kGemmO);
  }
  enqueue_ffn<T>(i, tokens);
}

// A hybrid's Mamba2 layer: the input norm, in_proj, the mixer over each row's tokens in order
// (updating each row's working slot; padded rows' slot −1 touches none), out_proj into the
// residual, then the FFN as an attention layer's. The profile counts in_proj as the QKV GEMM,
// the mixer as attention and out_proj as the o GEMM.
template <typename T>
void CudaBackend::Impl::enqueue_mamba_layer(int32_t i, int32_t tokens) {
  const kernels::LaunchStream s = forward_stream();
  const size_t li = static_cast<size_t>(i);
  const size_t h = static_cast<size_t>(hidden);
  const int32_t mi = mamba_index[li];  // among the Mamba layers: its weights and its state pool
  const size_t m = static_cast<size_t>(mi);  // the same, for the weight offsets
  const size_t in_proj_size = static_cast<size_t>(linears.in_proj.out);
  const size_t inner = static_cast<size_t>(linears.out_proj.in);
  T* x = as<T>(normed);
  LS_CUDA(kernels::launch_rms_norm(residual.get(), nullptr, tokens, hidden,
                                   attn_norm.get() + li * h, model.rms_eps, x, s));
  mark(CudaPhase::kNorms);
  linear(x, as<T>(w_in_proj) + m * in_proj_size * h, mamba_proj.get(), tokens, linears.in_proj);
  mark(CudaPhase::kGemmQkv);
  if (mamba_chunked) {
    LS_CUDA(kernels::launch_mamba_mixer_chunked(mamba_shape(), mamba_params(mi), mamba_state(mi),
                                                mamba_rows(), positions.get(), mamba_proj.get(),
                                                tokens, mamba_workspace.get(),
                                                mamba_workspace.count(), as<T>(mamba_y), s));
  } else {
    LS_CUDA(kernels::launch_mamba_mixer(mamba_shape(), mamba_params(mi), mamba_state(mi),
                                        mamba_rows(), mamba_proj.get(), tokens,
                                        mamba_workspace.get(), mamba_workspace.count(),
                                        as<T>(mamba_y), s));
  }
  mark(CudaPhase::kAttention);
  row_parallel(as<T>(mamba_y), as<T>(w_out_proj) + m * h * inner, tokens, linears.out_proj);
  mark(CudaPhase::kGemmO);
  enqueue_ffn<T>(i, tokens);
}

// Every layer's FFN: its norm, gate/up, SwiGLU and down into the residual (the kernels
// options.leave_out names left out: the benchmark's profile).
template <typename T>
void CudaBackend::Impl::enqueue_ffn(int32_t i, int32_t tokens) {
  if (!leaves_out(LeaveOut::kGateUp)) enqueue_gate_up<T>(i, tokens);
  if (!leaves_out(LeaveOut::kDown)) {
    const size_t li = static_cast<size_t>(i);
    const size_t h = static_cast<size_t>(hidden);
    row_parallel(as<T>(act), as<T>(w_down) + li * h * ffn, tokens, linears.down);
    mark(CudaPhase::kGemmDown);
  }
}

// The FFN's norm, gate/up and SwiGLU into `act` (folded together where the step's products allow).
template <typename T>
void CudaBackend::Impl::enqueue_gate_up(int32_t i, int32_t tokens) {
  if (enqueue_fused_gate_up(i, tokens, as<T>(act))) {
    mark(CudaPhase::kGemmGateUp);
    return;
  }
  const kernels::LaunchStream s = forward_stream();
  T* x = as<T>(normed);
  const float* norm_weight = ffn_norm.get() + static_cast<size_t>(i) * static_cast<size_t>(hidden);
  const bool swiglu = small_m_swiglu_runs(tokens);
  const bool fold = swiglu && small_m_folds_norm(tokens);
  if (!fold) {
    LS_CUDA(kernels::launch_rms_norm(residual.get(), nullptr, tokens, hidden, norm_weight,
                                     model.rms_eps, x, s));
    mark(CudaPhase::kNorms);
  }
  if (swiglu) {
    enqueue_small_m_gate_up_swiglu(i, tokens, x, fold ? norm_weight : nullptr, as<T>(act));
    mark(CudaPhase::kGemmGateUp);
    return;
  }
  linear(x, gate_up_weight<T>(i), gate_up.get(), tokens, linears.gate_up);
  mark(CudaPhase::kGemmGateUp);
  LS_CUDA(kernels::launch_swiglu(gate_up.get(), tokens, ffn, as<T>(act), s));
  mark(CudaPhase::kSwiglu);
}

bool CudaBackend::Impl::fuses_decode(int32_t tokens) const {
  return options.fuse_decode && options.precision == CudaPrecision::kBf16 &&
         uses_gemv(tokens, hidden) && kernels::gemv_norm_fits(hidden);
}

bool CudaBackend::Impl::rope_follows_qkv() const {
  return !model.qkv_bias && !model.qk_norm && model.rotary_dim() == model.head_dim;
}

CudaBackend::Impl::QkvFused CudaBackend::Impl::enqueue_fused_qkv(int32_t, int32_t, float*,
                                                                 float*) {
  return QkvFused::kNone;
}

// The attention input's norm folded into the QKV product; RoPE and the KV write too where
// nothing comes between them (no q/k/v bias or head norm) and whole heads rotate.
CudaBackend::Impl::QkvFused CudaBackend::Impl::enqueue_fused_qkv(int32_t i, int32_t tokens,
                                                                 bf16* k_layer, bf16* v_layer) {
  if (!fuses_decode(tokens)) return QkvFused::kNone;
  const size_t li = static_cast<size_t>(i);
  const size_t h = static_cast<size_t>(hidden);
  const kernels::GemvNorm norm{residual.get(), attn_norm.get() + li * h, model.rms_eps,
                               options.fused_gemv_block_per_group};
  const bf16* w = qkv_weight<bf16>(i);
  if (!rope_follows_qkv()) {
    LS_CUDA(kernels::launch_gemv_norm_bf16(norm, w, qkv.get(), tokens, linears.qkv.out, hidden,
                                           forward_stream()));
    return QkvFused::kProduct;
  }
  const kernels::RopeKvTarget target = rope_kv_target(0, k_layer, v_layer);
  LS_CUDA(kernels::launch_gemv_norm_rope_kv_bf16(norm, w, target, tokens, hidden,
                                                 forward_stream()));
  return QkvFused::kThroughKv;
}

bool CudaBackend::Impl::enqueue_fused_gate_up(int32_t, int32_t, float*) { return false; }

bool CudaBackend::Impl::enqueue_fused_gate_up(int32_t i, int32_t tokens, bf16* act_out) {
  if (!fuses_decode(tokens)) return false;
  const size_t li = static_cast<size_t>(i);
  const size_t h = static_cast<size_t>(hidden);
  const kernels::GemvNorm norm{residual.get(), ffn_norm.get() + li * h, model.rms_eps,
                               options.fused_gemv_block_per_group};
  const bf16* w = gate_up_weight<bf16>(i);
  LS_CUDA(kernels::launch_gemv_norm_swiglu_bf16(norm, w, act_out, tokens, ffn, hidden,
                                                forward_stream()));
  return true;
}

bool CudaBackend::Impl::small_m_epilogue_runs(int32_t tokens, const LinearShape& shape) const {
  return options.fuse_decode && options.precision == CudaPrecision::kBf16 &&
         linear_by_small_m_gemm(tokens, shape);
}

bool CudaBackend::Impl::small_m_swiglu_runs(int32_t tokens) const {
  return small_m_epilogue_runs(tokens, linears.gate_up);
}

bool CudaBackend::Impl::small_m_rope_kv_runs(int32_t tokens) const {
  return small_m_epilogue_runs(tokens, linears.qkv) && rope_follows_qkv();
}

bool CudaBackend::Impl::small_m_folds_norm(int32_t tokens) const {
  return tokens == 1 && kernels::small_m_norm_fits(hidden);
}

void CudaBackend::Impl::enqueue_small_m_gate_up_swiglu(int32_t, int32_t, const float*,
                                                       const float*, float*) {
  LS_ASSERT(false, "the small-M GEMM's epilogues run in bf16 only");
}

// What linear() would run as the small-M GEMM into gate_up, then launch_swiglu (after
// launch_rms_norm, where folded): the same bits.
void CudaBackend::Impl::enqueue_small_m_gate_up_swiglu(int32_t i, int32_t tokens, const bf16* x,
                                                       const float* norm_weight, bf16* act_out) {
  LS_ASSERT(small_m_swiglu_runs(tokens), "the small-M SwiGLU epilogue asked for where it does "
            "not run");
  const bf16* w = gate_up_weight<bf16>(i);
  if (norm_weight != nullptr) {
    const kernels::SmallMNorm norm{residual.get(), norm_weight, model.rms_eps};
    LS_CUDA(kernels::launch_gemm_small_m_norm_swiglu_bf16(
        norm, w, act_out, ffn, hidden, small_m_gemm_workspace.get(),
        small_m_gemm_workspace.bytes(), forward_stream()));
    return;
  }
  in_small_m_blocks(tokens, [&](int32_t first, int32_t count) {
    LS_CUDA(kernels::launch_gemm_small_m_swiglu_bf16(
        x + int64_t{first} * hidden, w, act_out + int64_t{first} * ffn, count, ffn, hidden,
        small_m_gemm_workspace.get(), small_m_gemm_workspace.bytes(), forward_stream()));
  });
}

void CudaBackend::Impl::enqueue_small_m_qkv_rope_kv(int32_t, int32_t, const float*, const float*,
                                                    float*, float*) {
  LS_ASSERT(false, "the small-M GEMM's epilogues run in bf16 only");
}

// What linear() would run as the small-M GEMM into qkv, then launch_rope_qkv (after
// launch_rms_norm, where folded): the same bits.
void CudaBackend::Impl::enqueue_small_m_qkv_rope_kv(int32_t i, int32_t tokens, const bf16* x,
                                                    const float* norm_weight, bf16* k_layer,
                                                    bf16* v_layer) {
  LS_ASSERT(small_m_rope_kv_runs(tokens), "the small-M RoPE epilogue asked for where it does "
            "not run");
  const bf16* w = qkv_weight<bf16>(i);
  if (norm_weight != nullptr) {
    const kernels::SmallMNorm norm{residual.get(), norm_weight, model.rms_eps};
    LS_CUDA(kernels::launch_gemm_small_m_norm_rope_kv_bf16(
        norm, w, rope_kv_target(0, k_layer, v_layer), hidden, small_m_gemm_workspace.get(),
        small_m_gemm_workspace.bytes(), forward_stream()));
    return;
  }
  in_small_m_blocks(tokens, [&](int32_t first, int32_t count) {
    LS_CUDA(kernels::launch_gemm_small_m_rope_kv_bf16(
        x + int64_t{first} * hidden, w, rope_kv_target(first, k_layer, v_layer), count, hidden,
        small_m_gemm_workspace.get(), small_m_gemm_workspace.bytes(), forward_stream()));
  });
}

template <typename T>
void CudaBackend::Impl::enqueue_forward_as(int32_t tokens, int32_t logits_rows,
                                           int32_t prefill_tokens) {
  const kernels::LaunchStream s = forward_stream();
  LS_CUDA(kernels::launch_embedding(as<T>(embedding), input_ids.get(), tokens, hidden,
                                    residual.get(), s));
  mark(CudaPhase::kEmbedding);
  const int32_t layers_run = leaves_out(LeaveOut::kLayers) ? 0 : layers;
  for (int32_t i = 0; i < layers_run; ++i) {
    if (model.layer_kind(i) == LayerKind::kMamba2) {
      enqueue_mamba_layer<T>(i, tokens);
    } else {
      enqueue_layer<T>(i, tokens, prefill_tokens);
    }
    seams::cuda_layer_output(i, residual.get(), tokens, hidden, stream.get());
    if (activation_capture) capture_layer_output(i);
  }
  LS_CUDA(kernels::launch_rms_norm(residual.get(), step_inputs().logits_token_index, logits_rows,
                                   hidden, final_norm.get(), model.rms_eps, as<T>(final_normed),
                                   s));
  lm_head_logits<T>(logits_rows);
  mark(CudaPhase::kLmHead);
  if (activation_capture) capture_head<T>();
}

// The o and down projections into the residual stream: fused into the GEMM (beta = 1) at TP 1;
// at TP > 1 this rank's partial over its `in` columns, all-reduced, then added.
template <typename T>
void CudaBackend::Impl::row_parallel(const T* x, const T* w, int32_t tokens, LinearShape shape) {
  if (!tp) {
    linear(x, w, residual.get(), tokens, shape);
    return;
  }
  linear(x, w, tp->partial(), tokens, shape);
  tp->reduce_into_residual(residual.get(), tokens, stream.get());
}

// logits [rows, vocab]: at TP > 1 this rank's vocabulary shard, all-gathered from every rank.
template <typename T>
void CudaBackend::Impl::lm_head_logits(int32_t logits_rows) {
  if (!tp) {
    const T* head = as<T>(model.tied_embeddings ? embedding : lm_head);
    linear(as<T>(final_normed), head, logits.get(), logits_rows, linears.lm_head);
    return;
  }
  linear(as<T>(final_normed), as<T>(lm_head), tp->head_shard(), logits_rows, linears.lm_head);
  tp->gather_logits(logits.get(), logits_rows, stream.get());
}

void CudaBackend::Impl::enqueue_forward(int32_t tokens, int32_t logits_rows,
                                        int32_t prefill_tokens) {
  LS_ASSERT(prefill_tokens >= 0 && prefill_tokens <= tokens, "prefill tokens {} of {}",
            prefill_tokens, tokens);
  if (tp) tp->begin_forward();
  if (options.precision == CudaPrecision::kFp32) {
    enqueue_forward_as<float>(tokens, logits_rows, prefill_tokens);
  } else {
    enqueue_forward_as<bf16>(tokens, logits_rows, prefill_tokens);
  }
}

}  // namespace ls
