// CudaBackend::Impl, private to kernels/: what the backend holds and the functions of its step,
// defined by subject in
//   cuda_backend_setup.cpp   limits checked, every buffer allocated (cuda_workspace.h sizes them)
//   cuda_weights.cpp         weights uploaded from the host or generated from a seed
//   cuda_step_stager.cpp     a StepPlan packed, staged, and its results unpacked
//   cuda_model_runner.cpp    the forward: layers, linear layers, the LM head
//   cuda_sampling_tail.cpp   rules 5–9: guard, sampler, finish, drafter
//   cuda_graphs.cpp          the decode graphs: capture and replay
//   cuda_profiler.cpp        phase marks and step timing
//   cuda_mamba.cpp           a hybrid's Mamba2 layers: their weights, the state pool and its rules
// and the public CudaBackend in cuda_backend.cpp.
#pragma once

#include "core/check.h"
#include "core/ops/seeded_weights.h"
#include "kernels/attention.h"
#include "kernels/cuda_backend.h"
#include "kernels/cuda_mamba.h"
#include "kernels/cuda_workspace.h"
#include "kernels/decode_gemv.h"
#include "kernels/device_memory.h"
#include "kernels/gemm_plans.h"
#include "kernels/launch.h"
#include "kernels/mamba_ops.h"
#include "kernels/mamba_scan.h"
#include "kernels/record_ops.h"
#include "kernels/step_layout.h"
#include "kernels/tp_rank.h"
#include "kernels/weight_init.h"

#include <array>
#include <cstdint>
#include <memory>
#include <span>
#include <vector>

namespace ls {

// The phase profile (options.profile): timing events recorded between phases, captured into the
// graphs as external event nodes. Mark 0 opens the step; mark k closes phase phases[k].
struct PhaseMarks {
  std::vector<CudaEvent> events;  // [marks_max]; empty when not profiling
  std::vector<CudaPhase> phases;  // [marks_max]
  int32_t count = 0;
  std::vector<int32_t> graph_ends;  // count after each bucket's forward graph (its own marks: a
                                   // bucket on the fused GEMV path records fewer)
  bool capturing = false;
  CudaPhaseTimes totals;

  bool on() const { return !events.empty(); }
  void create(size_t marks_max);
  // A timing event between two phases; inside a capture, an external event node.
  void mark(cudaStream_t stream, CudaPhase phase);
  // After the step completed: the time between consecutive marks, summed per phase.
  void collect();
};

// Device time around each step (options.time_steps): where step k's stream work begins and ends,
// in slot k % kSlots. Step k − 1's end is read when step k is collected, after at most step k + 1
// was enqueued, so three slots would do.
struct StepTimer {
  static constexpr int64_t kSlots = 4;
  bool on = false;
  std::array<CudaEvent, kSlots> begin_marks;
  std::array<CudaEvent, kSlots> end_marks;
  CudaStepTiming last;

  void create();
  void record_begin(int64_t step, cudaStream_t stream);
  void record_end(int64_t step, cudaStream_t stream);
  // After step `step` completed: the device's idle time before it and its busy time.
  void collect(int64_t step);
};

struct CudaBackend::Impl {
  Impl(const ModelConfig& model_config, const ExecutorConfig& executor_config,
       const CudaBackendOptions& backend_options);
  ~Impl();
  Impl(const Impl&) = delete;
  Impl& operator=(const Impl&) = delete;

  // cuda_backend_setup.cpp
  void refuse_unsupported() const;
  void refuse_context_past_attention() const;  // on the device: after cudaSetDevice
  void initialise_buffers();
  void create_host_side();

  // cuda_weights.cpp
  void upload_weights(const ModelWeights& weights);
  void generate_weights(uint64_t seed);
  void upload_features(size_t layer, const LayerWeights& w);
  void generate_features(uint64_t seed);
  // Writes elements [offset, offset + src.size()) of a typed-by-precision buffer.
  void upload_tensor(const DeviceArray<uint8_t>& dst, size_t offset, std::span<const float> src);
  void seed_tensor(const DeviceArray<uint8_t>& dst, size_t offset, kernels::SeededBlock block,
                   uint64_t seed, uint32_t tensor_index, ops::SeededRange range);
  void seed_fp32(float* dst, kernels::SeededBlock block, uint64_t seed, uint32_t tensor_index,
                 ops::SeededRange range);
  template <typename T>
  static T* as(const DeviceArray<uint8_t>& a) {
    return reinterpret_cast<T*>(a.get());
  }

  // cuda_step_stager.cpp
  int32_t rows_grid_for(const StepPlan& plan) const;
  void stage(const StepPlan& plan);
  int32_t pack(const StepPlan& plan, int32_t rows_grid, int32_t* words, size_t* pages_count) const;
  void enqueue_table_writes(int32_t rows_grid);
  void enqueue_resets();
  void enqueue_fill(int32_t rows_grid);
  void unpack(const StepPlan& plan, size_t parity, StepResult& result);
  void unpack_record(const StepPlan& plan, const int32_t* words, StepResult& result) const;
  kernels::DeviceState device_state() const;
  kernels::TokenBuffers token_buffers() const;
  kernels::ResultBuffers result_buffers() const;
  kernels::RecordBuffers record_buffers() const;
  kernels::StepInputs step_inputs() const { return layout.inputs(staging.get()); }
  int64_t steps_in_flight() const { return steps_count - collected_count; }

  // cuda_model_runner.cpp
  // A linear layer's product: rows of w (out), its columns (in), and whether it adds into y.
  struct LinearShape {
    int32_t out = 0;
    int32_t in = 0;
    bool accumulate = false;
    int32_t small_m_tokens_max = 0;  // small_m_gemm_tokens_max_for the shape, found once
  };
  struct LinearShapes {
    LinearShape qkv, o, gate_up, down, lm_head;
    LinearShape in_proj, out_proj;  // a hybrid's Mamba layers ({0, 0} without them)
  };
  // The shapes of a rank's model (`model` is rank_model_config of the shard) under `options`: the
  // forward runs them, plan_gemms plans them, lay_out_buffers sizes the small-M GEMM's workspace
  // for them.
  static LinearShapes linear_shapes_of(const ModelConfig& model, const TpRankShard& shard,
                                       const CudaBackendOptions& options);
  // Whether a bf16 product of `tokens` tokens over `in` runs on lockstep's GEMV, else on its
  // small-M GEMM (up to the shape's small_m_tokens_max), else on a cuBLASLt plan.
  bool uses_gemv(int32_t tokens, int32_t in) const;
  bool uses_small_m_gemm(int32_t tokens, const LinearShape& shape) const;
  // Whether linear() runs a product of `tokens` rows of `shape` on the small-M GEMM.
  bool linear_by_small_m_gemm(int32_t tokens, const LinearShape& shape) const;
  void plan_gemms();
  // prefill_tokens: the first tokens of the step that are prefill chunks' (0 at decode), which
  // attention may take through its tile kernel (attention_prefill).
  void enqueue_forward(int32_t tokens, int32_t logits_rows, int32_t prefill_tokens);
  template <typename T>
  void enqueue_forward_as(int32_t tokens, int32_t logits_rows, int32_t prefill_tokens);
  template <typename T>
  void enqueue_layer(int32_t layer, int32_t tokens, int32_t prefill_tokens);
  template <typename T>
  void enqueue_mamba_layer(int32_t layer, int32_t tokens);
  template <typename T>
  bool enqueue_qkv(int32_t layer, int32_t tokens, T* k_layer, T* v_layer);
  template <typename T>
  void enqueue_ffn(int32_t layer, int32_t tokens);
  template <typename T>
  void enqueue_gate_up(int32_t layer, int32_t tokens);
  // The decode GEMV's fused forms (kernels/decode_gemv.h, options.fuse_decode): whether a step of
  // `tokens` tokens folds the layer norms into the products that read them.
  bool fuses_decode(int32_t tokens) const;
  // Whether RoPE and the KV write can be a q/k/v product's epilogue: nothing comes between them
  // (no q/k/v bias or head norm) and whole heads rotate.
  bool rope_follows_qkv() const;
  // How far one fused launch took a layer's attention input (fp32 never fuses).
  enum class QkvFused { kNone, kProduct, kThroughKv };
  QkvFused enqueue_fused_qkv(int32_t layer, int32_t tokens, float* k_layer, float* v_layer);
  QkvFused enqueue_fused_qkv(int32_t layer, int32_t tokens, __nv_bfloat16* k_layer,
                             __nv_bfloat16* v_layer);
  // Norm, gate/up and SwiGLU into act in one launch; false (nothing launched) when not fused.
  bool enqueue_fused_gate_up(int32_t layer, int32_t tokens, float* act_out);
  bool enqueue_fused_gate_up(int32_t layer, int32_t tokens, __nv_bfloat16* act_out);
  // The small-M GEMM's epilogues (options.fuse_decode, the steps linear() gives the small-M GEMM,
  // bf16): gate/up with SwiGLU into act, and (no q/k/v bias or head norm, whole heads rotating)
  // QKV with RoPE and the KV write, each one launch a 64-token block; at one token the layer's
  // norm folds into them too (kernels/gemm_small_m.h). Whether they run (each where linear()
  // would give its product the small-M GEMM):
  bool small_m_epilogue_runs(int32_t tokens, const LinearShape& shape) const;
  bool small_m_swiglu_runs(int32_t tokens) const;
  bool small_m_rope_kv_runs(int32_t tokens) const;
  bool small_m_folds_norm(int32_t tokens) const;
  // Launch them (where they run): x the normed input, or with norm_weight the residual through
  // that norm (where small_m_folds_norm).
  void enqueue_small_m_gate_up_swiglu(int32_t layer, int32_t tokens, const float* x,
                                      const float* norm_weight, float* act_out);
  void enqueue_small_m_gate_up_swiglu(int32_t layer, int32_t tokens, const __nv_bfloat16* x,
                                      const float* norm_weight, __nv_bfloat16* act_out);
  void enqueue_small_m_qkv_rope_kv(int32_t layer, int32_t tokens, const float* x,
                                   const float* norm_weight, float* k_layer, float* v_layer);
  void enqueue_small_m_qkv_rope_kv(int32_t layer, int32_t tokens, const __nv_bfloat16* x,
                                   const float* norm_weight, __nv_bfloat16* k_layer,
                                   __nv_bfloat16* v_layer);
  // Where RoPE and the KV write put the step's tokens from `first` on (their q rows, positions and
  // slots): the target of the fused GEMV's epilogue and of the small-M GEMM's alike.
  template <typename T>
  kernels::RopeKvTarget rope_kv_target(int32_t first, T* k_layer, T* v_layer) const;
  // Layer `layer`'s q/k/v [q + 2·kv, hidden] and gate/up [2·ffn, hidden] weights.
  template <typename T>
  const T* qkv_weight(int32_t layer) const;
  template <typename T>
  const T* gate_up_weight(int32_t layer) const;
  template <typename T>
  void linear(const T* x, const T* w, float* y, int32_t tokens, LinearShape shape);
  template <typename T>
  void row_parallel(const T* x, const T* w, int32_t tokens, LinearShape shape);
  template <typename T>
  void lm_head_logits(int32_t logits_rows);
  // The step stream as the forward's kernels are launched on it (options.overlap_kernels).
  kernels::LaunchStream forward_stream() const { return {stream.get(), options.overlap_kernels}; }

  // cuda_mamba.cpp: the hybrid's Mamba2 layers; every one is a no-op for a model without them.
  bool hybrid() const { return mamba_layers > 0; }
  void refuse_unsupported_hybrid() const;
  void refuse_what_batch_invariance_cannot_cover() const;  // cuda_backend_setup.cpp
  void refuse_what_leave_out_cannot_cover() const;          // cuda_backend_setup.cpp
  // Whether every step leaves `what` out (options.leave_out: the benchmark's profile).
  bool leaves_out(LeaveOut what) const {
    return (options.leave_out & static_cast<uint32_t>(what)) != 0;
  }
  uint32_t attention_leave_out() const;  // cuda_model_runner.cpp
  void index_layer_kinds();
  void initialise_mamba();
  void enqueue_state_copy(const CacheOp& op);
  void upload_mamba_layer(int32_t layer, const LayerWeights& w);
  kernels::MambaShape mamba_shape() const;
  kernels::MambaLayerParams mamba_params(int32_t mamba_index) const;
  kernels::MambaStateView mamba_state(int32_t mamba_index) const;
  kernels::MambaRows mamba_rows() const;
  std::vector<int32_t> token_mamba_slots() const;
  void stage_mamba(const StepPlan& plan, size_t parity);
  void enqueue_mamba_rules();
  void enqueue_mamba_snapshots();
  void enqueue_mamba_digests(const int32_t* state_slots, int32_t count, uint64_t* digests) const;
  std::vector<uint64_t> read_mamba_digests(std::span<const int32_t> wanted) const;
  std::vector<float> read_mamba_slot(int32_t slot) const;

  // cuda_sampling_tail.cpp
  void enqueue_tail(const StepPlan& plan);
  // record_k: the top-k pairs a recorded step writes a logits row; kNotRecorded: none.
  static constexpr int32_t kNotRecorded = -1;
  void enqueue_tail_kernels(int32_t logits_rows, int32_t rows, bool stochastic, bool sums,
                            int32_t record_k);
  void check_step_launches() const;

  // cuda_activations.cpp: the per-layer capture (Backend::capture_activations); every step
  // runs eager while it is on (choose_graph).
  bool activation_capture = false;       // capture_mode != kOff
  ActivationCapture capture_mode = ActivationCapture::kOff;
  StepActivations captured_activations;  // the last forward's (kDigests: digests filled at take)
  int32_t capture_tokens = 0;            // the step's real tokens (no padded rows)
  int32_t capture_logits_rows = 0;
  // kDigests: [layers·6·tokens_max + 2·logits_rows_max] the forward's row digests in capture
  // order, allocated when the mode is first asked for; how many the forward enqueued.
  DeviceArray<uint64_t> activation_digests;
  int64_t activation_digests_enqueued = 0;
  void begin_activation_capture(const StepPlan& plan);
  // One tensor of the capture: kValues copies its rows to the host now; kDigests enqueues their
  // digests (rows `row_index[r]` of x when given).
  template <typename T>
  void capture_tensor(int32_t layer, ActivationKind kind, const T* x, const int64_t* row_index,
                      int32_t rows, int32_t width);
  StepActivations take_captured_activations();
  template <typename T>
  void capture_attention(int32_t layer, bool norm_fused, const T* k_layer, const T* v_layer);
  void capture_layer_output(int32_t layer);
  template <typename T>
  void capture_head();

  // cuda_graphs.cpp
  void capture_graphs();
  void choose_graph(const StepPlan& plan);
  void launch_graph();
  bool graph_step() const { return graph_index_ >= 0; }

  // cuda_profiler.cpp (PhaseMarks, StepTimer)
  void mark(CudaPhase phase) { phase_marks.mark(stream.get(), phase); }

  // This rank's shard and the whole model; `model` is the shard's config (rank_model_config): its
  // heads and ffn columns. At TP 1 the shard is the whole model and `model` equals full_model.
  TpRankShard shard;
  ModelConfig full_model;
  ModelConfig model;
  ExecutorConfig config;
  CudaBackendOptions options;
  size_t elem_bytes;  // of weights, KV and GEMM inputs: 2 (bf16) or 4 (fp32)
  int32_t hidden, q_size, kv_size, ffn, vocab, layers, table_width, positions_count;
  int32_t tokens_max, rows_max, logits_rows_max;
  int64_t slots_count;
  kernels::AttentionShape attention_shape;
  // Which kernel takes prefill chunks' attention (options.prefill_attention_by_decode_kernel): the
  // tile kernel by default; the decode kernel in batch-invariant mode, so a token has the same
  // bits in a chunk as at decode.
  kernels::AttentionPrefill attention_prefill;
  StagingLayout layout;
  ResultsLayout results_layout;
  MemoryLedger ledger;

  CudaStream stream;
  // A recorded step's record combine runs on record_stream, forked after the logits pass and
  // joined before the copy back, beside the guard's combine, the finish and the drafter.
  CudaStream record_stream;
  CudaEvent record_fork;
  CudaEvent record_join;
  CublasHandle cublas;

  // Weights, "E" = elements of the precision's storage type (bf16 or fp32). Linear layers of all
  // layers in one slab each: [layers, out, in] E.
  DeviceArray<uint8_t> embedding;  // [vocab, hidden] E
  DeviceArray<uint8_t> lm_head;    // [vocab, hidden] E; empty when tied; TP > 1: [vocab_rows, hidden]
  DeviceArray<uint8_t> w_qkv;      // [layers, q + 2·kv, hidden] E
  DeviceArray<uint8_t> w_o;        // [layers, hidden, q] E
  DeviceArray<uint8_t> w_gate_up;  // [layers, 2·ffn, hidden] E
  DeviceArray<uint8_t> w_down;     // [layers, hidden, ffn] E
  DeviceArray<float> attn_norm;    // [layers, hidden]
  DeviceArray<float> ffn_norm;     // [layers, hidden]
  DeviceArray<float> final_norm;   // [hidden]
  // Family features, fp32 (added to and multiplied into fp32 QKV); empty when off.
  DeviceArray<float> qkv_bias;     // [layers, q + 2·kv] (Qwen2)
  DeviceArray<float> q_norm;       // [layers, head_dim] (Qwen3)
  DeviceArray<float> k_norm;       // [layers, head_dim] (Qwen3)
  // A hybrid's Mamba2 layers (cuda_mamba.cpp), by Mamba index m (mamba_index[layer]); empty
  // without them. The mixer's small parameters are fp32 at both precisions.
  DeviceArray<uint8_t> w_in_proj;   // [M, in_proj_size, hidden] E
  DeviceArray<uint8_t> w_out_proj;  // [M, hidden, inner] E
  DeviceArray<float> mamba_conv_weight;  // [M, conv_dim, conv_kernel]
  DeviceArray<float> mamba_conv_bias;    // [M, conv_dim] when mamba.conv_bias
  DeviceArray<float> mamba_dt_bias;      // [M, heads]
  DeviceArray<float> mamba_a_log;        // [M, heads]
  DeviceArray<float> mamba_d_skip;       // [M, heads]
  DeviceArray<float> mamba_norm;         // [M, inner]
  // The recurrent-state pool, the CPU's layout: [mamba_slots_count, M, conv then SSM floats].
  DeviceArray<float> mamba_pool;
  DeviceArray<float> mamba_proj;         // [tokens_max, in_proj_size] the in_proj's output
  DeviceArray<uint8_t> mamba_y;          // [tokens_max, inner] E the out_proj's input
  DeviceArray<float> mamba_workspace;
  // The step's state lists (MambaStagingLayout), staged beside the step's words; then the
  // snapshot pairs the commit's rule writes.
  DeviceArray<int32_t> mamba_staging;
  // The state digests' chunk sums (launch_mamba_state_digests) over max_batch_rows slots.
  DeviceArray<uint32_t> mamba_digest_partials;
  std::array<PinnedArray<int32_t>, 2> host_mamba_staging;  // by step parity
  // [host_pages_count, mamba_slot_floats] fp32: a swapped-out request's working state, kept with
  // its first host page (CacheOp::state_slot).
  PinnedArray<float> host_mamba_states;
  int32_t mamba_layers = 0;
  std::vector<int32_t> mamba_index;  // [layers] the layer's Mamba index, or −1
  int32_t kv_layers = 0;             // the attention layers: every layer but a hybrid's Mamba ones
  std::vector<int32_t> kv_index;     // [layers] the layer's attention index (into the KV), or −1
  int64_t mamba_slot_floats = 0;     // one slot's state over every Mamba layer
  // KV and RoPE.
  // By attention layer (kv_index): a hybrid's Mamba layers hold no KV.
  DeviceArray<uint8_t> k_cache;    // [kv_layers, slots, kv] E
  DeviceArray<uint8_t> v_cache;    // [kv_layers, slots, kv] E
  PinnedArray<uint8_t> host_kv;    // [host pages, 2, kv_layers, P, kv] E
  DeviceArray<float> rope_cos;     // [positions, head_dim/2]
  DeviceArray<float> rope_sin;
  // Activations.
  DeviceArray<float> residual;     // [tokens_max, hidden]
  DeviceArray<uint8_t> normed;     // [tokens_max, hidden] E
  DeviceArray<float> qkv;          // [tokens_max, q + 2·kv]
  DeviceArray<float> q;            // [tokens_max, q]
  DeviceArray<uint8_t> attn_out;   // [tokens_max, q] E
  DeviceArray<float> gate_up;      // [tokens_max, 2·ffn]
  DeviceArray<uint8_t> act;        // [tokens_max, ffn] E
  DeviceArray<float> attention_workspace;
  DeviceArray<uint8_t> final_normed;  // [logits_rows_max, hidden] E
  DeviceArray<float> logits;       // [logits_rows_max, vocab]
  DeviceArray<uint8_t> cublas_workspace;
  // The small-M GEMM's split-K partials (kernels/gemm_small_m.h), for the largest of the linear
  // shapes; empty when no shape splits or the GEMM is off.
  DeviceArray<uint8_t> small_m_gemm_workspace;
  LinearShapes linears;
  // bf16 linear layers: a plan per shape and token count, all made at construction (plan_gemms).
  std::unique_ptr<kernels::GemmPlans> gemm_plans;
  std::unique_ptr<TpRank> tp;      // TP > 1: the collectives and their buffers
  // Guard and sampler.
  DeviceArray<uint8_t> logits_workspace;  // the logits pass's segment partials (guard, record)
  DeviceArray<int32_t> argmax;         // [logits_rows_max]
  DeviceArray<int32_t> row_nan_flags;  // [logits_rows_max]
  DeviceArray<float> row_max;          // [logits_rows_max]
  DeviceArray<float> row_sum;          // [logits_rows_max]
  DeviceArray<uint64_t> keys;          // [logits_rows_max, vocab]
  DeviceArray<uint64_t> sorted_keys;   // [logits_rows_max, vocab]
  DeviceArray<float> block_sums;       // [logits_rows_max, ops::order_sum_stride(vocab)]
  DeviceArray<float> block_prefixes;   // [logits_rows_max, ops::order_sum_stride(vocab)]
  DeviceArray<int32_t> segment_offsets;  // [logits_rows_max + 1]
  DeviceArray<uint8_t> sort_temp;
  // State and the step's token buffers.
  DeviceArray<int32_t> table;          // [pool rows, table_width]
  DeviceArray<int32_t> vcl;            // [pool rows]
  DeviceArray<int32_t> future_inputs;  // [pool rows, W]
  DeviceArray<int32_t> vcl_before;     // [rows_max]
  DeviceArray<int32_t> input_ids;      // [tokens_max]
  DeviceArray<int32_t> positions;      // [tokens_max]
  DeviceArray<int64_t> slots;          // [tokens_max]
  DeviceArray<int32_t> token_pool_rows;  // [tokens_max]
  // The drafter's token history (options.drafter "ngram" with W > 1; empty otherwise): what each
  // pool row's owner holds by position, as CpuBackend keeps it.
  bool drafting = false;
  int32_t history_capacity = 0;          // L + W
  DeviceArray<int32_t> history;          // [pool rows, L + W]
  DeviceArray<int32_t> history_begin;    // [pool rows] first position the row's owner wrote
  // Staging and results.
  DeviceArray<int32_t> staging;                    // [layout.words]
  std::array<PinnedArray<int32_t>, 2> host_staging;  // by step parity
  std::array<CudaEvent, 2> upload_done;
  DeviceArray<int32_t> results;                    // [results_layout.words] packed results
  // By step parity, so that with two steps in flight step k+1's copy never lands in the buffer
  // the host unpacks step k from. The device buffers (staging, results, activations) are single:
  // the one stream orders step k+1's writes after step k's reads.
  std::array<PinnedArray<int32_t>, 2> host_results;  // [results.count()] each
  std::array<CudaEvent, 2> step_done;                // after the step's last copy
  std::array<std::vector<float>, 2> host_logits;     // [logits rows, vocab] when captured
  StepTimer step_timer;

  std::vector<int32_t> buckets;
  std::vector<CudaGraph> graphs;  // [buckets], when options.graphs: rules 1–4
  // [buckets], when options.graphs and not profiling: rules 1–4 and the greedy tail (guard,
  // verify/commit, drafter) in one graph; the step's results copy stays outside (it targets the
  // step parity's pinned buffer).
  std::vector<CudaGraph> tail_graphs;
  // [buckets], as tail_graphs with the record in them (the logits pass's digests and top-k, their
  // forked combine, the finish's snapshot; ExecutorOptions::record with k = record_graph_k): a
  // recorded step adds no launch of its own and no gap after the graph.
  std::vector<CudaGraph> record_tail_graphs;
  int32_t record_graph_k = 0;
  int64_t steps_count = 0;      // steps whose finish was enqueued
  int64_t collected_count = 0;  // steps collected (≤ steps_count, at most two behind)
  int64_t graph_replays = 0;
  int64_t tail_graph_replays = 0;
  int64_t last_wait_ns = 0;
  int64_t stage_wait_ns = 0;  // an eager step's wait for the step in flight, until the next collect
  int64_t last_forward_ns = 0;  // host time of the last forward() (staging and launches)
  int64_t last_enqueue_ns = 0;  // host time of the last enqueue_finish (the tail's launches)
  int64_t last_collect_ns = 0;  // host time of the last collect_finish, its wait included
  bool staged = false;
  int32_t rows_grid = 0;     // this step's row launch size (padded for decode steps)
  // This step's Mamba2 mixer: the chunked scan (a prefill or mixed step) or the sequential one (a
  // decode step, every graph). A decode row, verified or not, has no complete block in the
  // chunked scan (kernels/mamba_rows.cuh cut_row): both give it the same bits.
  bool mamba_chunked = false;
  int32_t graph_index_ = -1;  // this step's graph, or −1 for eager
  bool tail_in_graph = false;  // this step replays tail_graphs[graph_index_]
  bool record_in_graph = false;  // ... or record_tail_graphs[graph_index_]
  PhaseMarks phase_marks;
};

}  // namespace ls
