#include "kernels/cuda_backend.h"

#include "core/check.h"
#include "core/drafter.h"
#include "core/model/rope.h"
#include "core/ops/seeded_weights.h"
#include "kernels/attention.h"
#include "kernels/cuda_check.h"
#include "kernels/device_memory.h"
#include "kernels/drafter_ops.h"
#include "kernels/gemm.h"
#include "kernels/gemm_plans.h"
#include "kernels/layer_ops.h"
#include "kernels/logits_ops.h"
#include "kernels/record_ops.h"
#include "kernels/sampling_ops.h"
#include "kernels/state_ops.h"
#include "kernels/step_layout.h"
#include "kernels/tp_rank.h"
#include "kernels/weight_init.h"

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <cstring>
#include <fstream>
#include <functional>
#include <map>
#include <regex>
#include <type_traits>
#include <utility>

namespace ls {

namespace {

using kernels::bf16;

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
// (ExecutorOptions::record): digests and top-k pairs by logits row, then vcl, future inputs and
// table row by op row, the table last so that a step copies back only its own rows of it.
struct ResultsLayout {
  size_t base_words, digests, top, vcl, future_inputs, table, words;
  int32_t table_width;

  ResultsLayout(int32_t rows_max, int32_t logits_rows_max, int32_t verify_width, int32_t width)
      : table_width(width) {
    const size_t b = static_cast<size_t>(rows_max);
    const size_t r = static_cast<size_t>(logits_rows_max);
    base_words = 2 * r + 3 * b;
    size_t at = (base_words + 1) / 2 * 2;  // the digests are 8-byte words
    auto take = [&at](size_t count) { return std::exchange(at, at + count); };
    digests = take(2 * r);
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

// fp32 → bf16 bits, round to nearest even (NaN stays a quiet NaN).
uint16_t bf16_bits(float x) {
  uint32_t u = 0;
  std::memcpy(&u, &x, sizeof(u));
  if ((u & 0x7fffffffu) > 0x7f800000u) return 0x7fc0;
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}

// Batch sizes that decode steps are padded to (and graphs captured at): 1, 2, 4, 8, then
// multiples of 8, and max_batch_rows itself.
std::vector<int32_t> decode_buckets(int32_t rows_max) {
  std::vector<int32_t> sizes;
  for (int32_t s : {1, 2, 4}) {
    if (s < rows_max) sizes.push_back(s);
  }
  for (int32_t s = 8; s < rows_max; s += 8) sizes.push_back(s);
  sizes.push_back(rows_max);
  return sizes;
}

static_assert(kernels::kDraftNgramMax == NgramDrafter::kNgramMax,
              "the device drafter matches the suffixes NgramDrafter matches");

// Whether a backend of these options drafts: the n-gram drafter with W > 1 (with W = 1 a drafter
// has no columns to fill, as on the CPU).
bool drafts_ngram(const ExecutorConfig& config, const CudaBackendOptions& options) {
  return options.drafter == "ngram" && config.verify_width > 1;
}

// Device bytes of the weights and of every workspace for one configuration: what the Impl's
// constructor allocates (it asserts the two agree), everything but the KV cache, whose size is
// the only one that depends on pages_count.
struct FixedBytes {
  int64_t weights = 0;
  int64_t workspace = 0;
};

// The shard of `model` a backend of `options` holds (the whole model at TP 1).
TpRankShard rank_shard(const ModelConfig& model, const CudaBackendOptions& options) {
  return make_rank_shard(model, options.tp_degree, options.tp_rank);
}

// `full_model`: the whole model; a TP rank holds its shard (rank_model_config) and, at TP > 1,
// an LM head shard whether or not the embeddings are tied, plus TpRank's buffers.
FixedBytes fixed_bytes(const ModelConfig& full_model, const ExecutorConfig& config,
                       const CudaBackendOptions& options) {
  const TpRankShard shard = rank_shard(full_model, options);
  const ModelConfig model = rank_model_config(full_model, shard);
  const int64_t e = options.precision == CudaPrecision::kFp32 ? 4 : 2;
  const int64_t h = model.hidden_size, l = model.layers_count, v = model.vocab_size;
  const int64_t qs = model.q_size(), kvs = model.kv_size(), f = model.ffn_size;
  const int64_t t = config.step_tokens_max(), r = config.logits_rows_max();
  const int64_t b = config.max_batch_rows, pool = config.pool_rows_count();
  const int64_t tw = config.table_width();
  const int64_t positions = tw * config.page_size;
  FixedBytes out;
  const int64_t head_rows = shard.degree > 1 ? shard.vocab_rows : model.tied_embeddings ? 0 : v;
  out.weights = e * (v * h + head_rows * h + l * (qs + 2 * kvs) * h +
                     l * h * qs + l * 2 * f * h + l * h * f) +
                4 * (2 * l * h + h) +
                4 * l * ((model.qkv_bias ? qs + 2 * kvs : 0) + (model.qk_norm ? 2 * model.head_dim : 0));
  const kernels::AttentionShape shape{model.query_heads_count, model.kv_heads_count,
                                      model.head_dim, config.table_width(), config.page_size,
                                      config.table_width() * config.page_size};
  const size_t decode_floats = kernels::attention_workspace_floats(
      shape, config.max_batch_rows * config.verify_width);
  const size_t all_floats = kernels::attention_workspace_floats(shape, config.step_tokens_max());
  const size_t cap_floats = static_cast<size_t>(options.attention_workspace_bytes_max) / 4;
  const int64_t attention =
      static_cast<int64_t>(std::max(decode_floats, std::min(all_floats, cap_floats)));
  const StagingLayout layout(config.max_batch_rows, config.logits_rows_max(),
                             config.prefill_chunk_tokens, config.table_width());
  out.workspace =
      4 * 2 * positions * (model.head_dim / 2)                            // RoPE tables
      + 4 * t * h + e * t * h + 4 * t * (qs + 2 * kvs) + 4 * t * qs       // residual .. q
      + e * t * qs + 4 * t * 2 * f + e * t * f                            // attn_out .. act
      + 4 * attention + e * r * h + 4 * r * v + options.cublas_workspace_bytes
      + static_cast<int64_t>(kernels::logits_pass_workspace_bytes(config.logits_rows_max(),
                                                                  model.vocab_size))
      + 4 * 4 * r + 8 * 2 * r * v + 4 * (r + 1)                          // guard .. offsets
      + static_cast<int64_t>(kernels::sort_sampling_keys_temp_bytes(config.logits_rows_max(),
                                                                    model.vocab_size))
      + 4 * (pool * tw + pool + pool * config.verify_width + b)          // table .. vcl_before
      + 4 * t * 3 + 8 * t                                                 // ids, positions, ...
      + 4 * static_cast<int64_t>(layout.words)                            // staging
      + 4 * static_cast<int64_t>(ResultsLayout(config.max_batch_rows, config.logits_rows_max(),
                                               config.verify_width, config.table_width())
                                     .words);                             // results
  if (shard.degree > 1) {
    out.workspace += TpRank::workspace_bytes(shard, config.step_tokens_max(),
                                             config.logits_rows_max(), model.hidden_size);
  }
  if (drafts_ngram(config, options)) {
    out.workspace += 4 * pool * (int64_t{config.context_length} + config.verify_width)  // history
                     + 4 * pool;                                                         // begins
  }
  return out;
}

std::string version_string(int32_t v) {
  return fmt::format("{}.{}", v / 1000, (v % 1000) / 10);
}

}  // namespace

struct CudaBackend::Impl {
  Impl(const ModelConfig& model_config, const ExecutorConfig& executor_config,
       const CudaBackendOptions& backend_options);
  ~Impl();
  Impl(const Impl&) = delete;
  Impl& operator=(const Impl&) = delete;

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
  DeviceArray<uint8_t> elements(size_t count, int64_t& account) const {
    return DeviceArray<uint8_t>(count * elem_bytes, account);
  }
  template <typename T>
  static T* as(const DeviceArray<uint8_t>& a) {
    return reinterpret_cast<T*>(a.get());
  }
  void capture_graphs();
  void mark(CudaPhase phase);
  void collect_marks();

  int32_t rows_grid_for(const StepPlan& plan) const;
  void stage(const StepPlan& plan);
  int32_t pack(const StepPlan& plan, int32_t rows_grid, int32_t* words, size_t* pages_count) const;
  void enqueue_table_writes(int32_t rows_grid);
  void enqueue_resets();
  void enqueue_fill(int32_t rows_grid);
  void enqueue_forward(int32_t tokens, int32_t logits_rows);
  template <typename T>
  void enqueue_forward_as(int32_t tokens, int32_t logits_rows);
  template <typename T>
  void enqueue_layer(int32_t layer, int32_t tokens);
  // The step stream as the forward's kernels are launched on it (options.overlap_kernels).
  kernels::LaunchStream forward_stream() const { return {stream.get(), options.overlap_kernels}; }
  template <typename T>
  void linear(const T* x, const T* w, float* y, int32_t tokens, int32_t out, int32_t in,
              float beta);
  template <typename T>
  void row_parallel(const T* x, const T* w, int32_t tokens, int32_t in);
  template <typename T>
  void lm_head_logits(int32_t logits_rows);
  void enqueue_tail(const StepPlan& plan);
  // record_k: the top-k pairs a recorded step writes a logits row; kNotRecorded: none.
  static constexpr int32_t kNotRecorded = -1;
  void enqueue_tail_kernels(int32_t logits_rows, int32_t rows, bool stochastic, bool sums,
                            int32_t record_k);
  bool graph_step() const { return graph_index_ >= 0; }
  void check_step_launches() const;
  void unpack(const StepPlan& plan, size_t parity, StepResult& result);
  void collect_step_timing();
  int64_t steps_in_flight() const { return steps_count - collected_count; }

  kernels::DeviceState device_state() const;
  kernels::TokenBuffers token_buffers() const;
  kernels::ResultBuffers result_buffers() const;
  kernels::RecordBuffers record_buffers() const;
  void unpack_record(const StepPlan& plan, const int32_t* words, StepResult& result) const;
  kernels::StepInputs step_inputs() const { return layout.inputs(staging.get()); }

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
  // KV and RoPE.
  DeviceArray<uint8_t> k_cache;    // [layers, slots, kv] E
  DeviceArray<uint8_t> v_cache;    // [layers, slots, kv] E
  PinnedArray<uint8_t> host_kv;    // [host pages, 2, layers, P, kv] E
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
  std::unique_ptr<kernels::GemmPlans> gemm_plans;  // bf16 linear layers: pinned per shape
  std::unique_ptr<TpRank> tp;      // TP > 1: the collectives and their buffers
  // Guard and sampler.
  DeviceArray<uint8_t> logits_workspace;  // the logits pass's segment partials (guard, record)
  DeviceArray<int32_t> argmax;         // [logits_rows_max]
  DeviceArray<int32_t> row_nan_flags;  // [logits_rows_max]
  DeviceArray<float> row_max;          // [logits_rows_max]
  DeviceArray<float> row_sum;          // [logits_rows_max]
  DeviceArray<uint64_t> keys;          // [logits_rows_max, vocab]
  DeviceArray<uint64_t> sorted_keys;   // [logits_rows_max, vocab]
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
  // Step timing (options.time_steps): where step k's stream work begins and ends, in slot
  // k % kTimingSlots. Step k − 1's end is read when step k is collected, after at most step k + 1
  // was enqueued, so three slots would do.
  static constexpr int64_t kTimingSlots = 4;
  std::array<CudaEvent, kTimingSlots> step_begin_marks;
  std::array<CudaEvent, kTimingSlots> step_end_marks;
  CudaStepTiming last_timing;

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
  int32_t graph_index_ = -1;  // this step's graph, or −1 for eager
  bool tail_in_graph = false;  // this step replays tail_graphs[graph_index_]
  bool record_in_graph = false;  // ... or record_tail_graphs[graph_index_]
  // Phase profile (options.profile): timing events recorded between phases, captured into the
  // graphs as external event nodes. Mark 0 opens the step; mark k closes phase mark_phases[k].
  std::vector<CudaEvent> mark_events;   // [marks_max]
  std::vector<CudaPhase> mark_phases;   // [marks_max]
  int32_t marks_count = 0;
  int32_t graph_marks_end = 0;          // marks_count after a graph's forward
  bool capturing = false;
  CudaPhaseTimes phase_totals;
};

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

void CudaBackend::Impl::upload_tensor(const DeviceArray<uint8_t>& dst, size_t offset,
                                      std::span<const float> src) {
  LS_ASSERT((offset + src.size()) * elem_bytes <= dst.bytes(), "upload past the buffer");
  if (options.precision == CudaPrecision::kFp32) {
    LS_CUDA(cudaMemcpy(as<float>(dst) + offset, src.data(), src.size_bytes(),
                       cudaMemcpyHostToDevice));
    return;
  }
  constexpr size_t kChunk = size_t{1} << 22;
  std::vector<uint16_t> bits(std::min(src.size(), kChunk));
  for (size_t begin = 0; begin < src.size(); begin += kChunk) {
    const size_t n = std::min(kChunk, src.size() - begin);
    for (size_t i = 0; i < n; ++i) bits[i] = bf16_bits(src[begin + i]);
    LS_CUDA(cudaMemcpy(as<bf16>(dst) + offset + begin, bits.data(), n * sizeof(uint16_t),
                       cudaMemcpyHostToDevice));
  }
}

void CudaBackend::Impl::seed_tensor(const DeviceArray<uint8_t>& dst, size_t offset,
                                    kernels::SeededBlock block, uint64_t seed,
                                    uint32_t tensor_index, ops::SeededRange range) {
  const float center = range.center, half_width = range.half_width;
  LS_ASSERT((offset + static_cast<size_t>(block.rows * block.cols)) * elem_bytes <= dst.bytes(),
            "seed past the buffer");
  if (options.precision == CudaPrecision::kFp32) {
    LS_CUDA(kernels::launch_seeded_f32(as<float>(dst) + offset, block, seed, tensor_index, center,
                                       half_width, stream.get()));
  } else {
    LS_CUDA(kernels::launch_seeded_bf16(as<bf16>(dst) + offset, block, seed, tensor_index, center,
                                        half_width, stream.get()));
  }
}

void CudaBackend::Impl::upload_weights(const ModelWeights& weights) {
  LS_REQUIRE(weights.config.hidden_size == hidden && weights.config.layers_count == layers &&
                 weights.config.vocab_size == vocab && weights.config.ffn_size == full_model.ffn_size,
             "cuda backend: the weights' shape does not match the model config");
  weights.validate();
  LS_REQUIRE(weights.config.qkv_bias == model.qkv_bias && weights.config.qk_norm == model.qk_norm,
             "cuda backend: the weights' family features do not match the model config");
  const size_t h = static_cast<size_t>(hidden);
  const int32_t d = model.head_dim;
  const ShardRange q_rows = head_elements(shard.query_heads, d);
  const ShardRange kv_rows = head_elements(shard.kv_heads, d);
  upload_tensor(embedding, 0, weights.embedding);
  if (shard.degree > 1) {
    upload_tensor(lm_head, 0, shard_rows(weights.lm_head_view(), hidden, shard.vocab));
  } else if (!model.tied_embeddings) {
    upload_tensor(lm_head, 0, weights.lm_head);
  }
  const size_t qkv_rows = static_cast<size_t>(q_size + 2 * kv_size);
  std::vector<float> columns;  // a column shard's copy (TP > 1)
  for (int32_t i = 0; i < layers; ++i) {
    const LayerWeights& w = weights.layers[i];
    const size_t li = static_cast<size_t>(i);
    const size_t qkv_at = li * qkv_rows * h;
    upload_tensor(w_qkv, qkv_at, shard_rows(w.wq, hidden, q_rows));
    upload_tensor(w_qkv, qkv_at + static_cast<size_t>(q_size) * h, shard_rows(w.wk, hidden, kv_rows));
    upload_tensor(w_qkv, qkv_at + static_cast<size_t>(q_size + kv_size) * h,
                  shard_rows(w.wv, hidden, kv_rows));
    upload_tensor(w_o, li * h * q_size,
                  shard_columns(w.wo, hidden, full_model.q_size(), q_rows, columns));
    const size_t gu_at = li * 2 * ffn * h;
    upload_tensor(w_gate_up, gu_at, shard_rows(w.w_gate, hidden, shard.ffn));
    upload_tensor(w_gate_up, gu_at + static_cast<size_t>(ffn) * h,
                  shard_rows(w.w_up, hidden, shard.ffn));
    upload_tensor(w_down, li * h * ffn,
                  shard_columns(w.w_down, hidden, full_model.ffn_size, shard.ffn, columns));
    LS_CUDA(cudaMemcpy(attn_norm.get() + li * h, w.attn_norm.data(), h * 4, cudaMemcpyHostToDevice));
    LS_CUDA(cudaMemcpy(ffn_norm.get() + li * h, w.ffn_norm.data(), h * 4, cudaMemcpyHostToDevice));
    upload_features(li, w);
  }
  LS_CUDA(cudaMemcpy(final_norm.get(), weights.final_norm.data(), h * 4, cudaMemcpyHostToDevice));
}

// Qwen2's biases side by side in QKV order (this rank's heads); Qwen3's head norms.
void CudaBackend::Impl::upload_features(size_t li, const LayerWeights& w) {
  auto copy = [](float* dst, std::span<const float> src) {
    LS_CUDA(cudaMemcpy(dst, src.data(), src.size_bytes(), cudaMemcpyHostToDevice));
  };
  if (model.qkv_bias) {
    const ShardRange q_rows = head_elements(shard.query_heads, model.head_dim);
    const ShardRange kv_rows = head_elements(shard.kv_heads, model.head_dim);
    float* bias = qkv_bias.get() + li * static_cast<size_t>(q_size + 2 * kv_size);
    copy(bias, shard_rows(w.q_bias, 1, q_rows));
    copy(bias + q_size, shard_rows(w.k_bias, 1, kv_rows));
    copy(bias + q_size + kv_size, shard_rows(w.v_bias, 1, kv_rows));
  }
  if (model.qk_norm) {
    copy(q_norm.get() + li * model.head_dim, w.q_norm);
    copy(k_norm.get() + li * model.head_dim, w.k_norm);
  }
}

// weights_from_seed's tensors generated on the device, at the indices and in the ranges of
// core/ops/seeded_weights.h. Norms, biases and head norms stay fp32 at every precision.
void CudaBackend::Impl::seed_fp32(float* dst, kernels::SeededBlock block, uint64_t seed,
                                  uint32_t tensor_index, ops::SeededRange range) {
  LS_CUDA(kernels::launch_seeded_f32(dst, block, seed, tensor_index, range.center, range.half_width,
                                     stream.get()));
}

namespace {

// The seeded elements of rows `rows` of a [*, cols] tensor, and of columns `columns` of a
// [rows, cols] one: a rank's shard of the TP-1 tensor, element for element.
kernels::SeededBlock seeded_rows(ShardRange rows, int64_t cols) {
  return {rows.count, cols, int64_t{rows.begin} * cols, cols};
}
kernels::SeededBlock seeded_columns(int64_t rows, int64_t cols, ShardRange columns) {
  return {rows, columns.count, columns.begin, cols};
}

}  // namespace

// The family tensors: Qwen2's biases side by side in QKV order, Qwen3's head norms.
void CudaBackend::Impl::generate_features(uint64_t seed) {
  const int64_t d = model.head_dim;
  const auto index = [&](int32_t layer, ops::SeededFeatureTensor k) {
    return ops::seeded_feature_tensor_index(static_cast<uint32_t>(layers),
                                            static_cast<uint32_t>(layer), k);
  };
  const ShardRange q_rows = head_elements(shard.query_heads, model.head_dim);
  const ShardRange kv_rows = head_elements(shard.kv_heads, model.head_dim);
  for (int32_t i = 0; i < layers; ++i) {
    if (model.qkv_bias) {
      float* bias = qkv_bias.get() + static_cast<size_t>(i) * (q_size + 2 * kv_size);
      seed_fp32(bias, seeded_rows(q_rows, 1), seed, index(i, ops::kSeededQBias),
                ops::kSeededBiasRange);
      seed_fp32(bias + q_size, seeded_rows(kv_rows, 1), seed, index(i, ops::kSeededKBias),
                ops::kSeededBiasRange);
      seed_fp32(bias + q_size + kv_size, seeded_rows(kv_rows, 1), seed,
                index(i, ops::kSeededVBias), ops::kSeededBiasRange);
    }
    if (model.qk_norm) {
      const kernels::SeededBlock head{1, d, 0, d};
      seed_fp32(q_norm.get() + i * d, head, seed, index(i, ops::kSeededQNorm), ops::kSeededNormRange);
      seed_fp32(k_norm.get() + i * d, head, seed, index(i, ops::kSeededKNorm), ops::kSeededNormRange);
    }
  }
}

// This rank's shard of each seeded tensor: the elements of weights_from_seed's TP-1 tensor that
// the shard holds, so TP N's weights equal TP 1's. Ranges are the whole tensor's (1/sqrt(in) of
// TP 1's in).
void CudaBackend::Impl::generate_weights(uint64_t seed) {
  const int64_t h = hidden;
  auto linear = [](int64_t in) {
    return ops::SeededRange{0.0f, 1.0f / std::sqrt(static_cast<float>(in))};
  };
  auto at = [](int64_t elements) { return static_cast<size_t>(elements); };
  const int64_t full_q = full_model.q_size(), full_ffn = full_model.ffn_size;
  const ShardRange q_rows = head_elements(shard.query_heads, model.head_dim);
  const ShardRange kv_rows = head_elements(shard.kv_heads, model.head_dim);
  const auto whole = [](int64_t rows, int64_t cols) { return kernels::SeededBlock{rows, cols, 0, cols}; };
  seed_tensor(embedding, 0, whole(vocab, h), seed, ops::kSeededEmbeddingIndex,
              ops::kSeededEmbeddingRange);
  const int64_t qkv_rows = q_size + 2 * kv_size;
  for (int32_t i = 0; i < layers; ++i) {
    const auto index = [i](ops::SeededLayerTensor k) {
      return ops::seeded_layer_tensor_index(static_cast<uint32_t>(i), k);
    };
    const int64_t qkv_at = i * qkv_rows * h;
    seed_fp32(attn_norm.get() + i * h, whole(1, h), seed, index(ops::kSeededAttnNorm),
              ops::kSeededNormRange);
    seed_tensor(w_qkv, at(qkv_at), seeded_rows(q_rows, h), seed, index(ops::kSeededWq), linear(h));
    seed_tensor(w_qkv, at(qkv_at + q_size * h), seeded_rows(kv_rows, h), seed,
                index(ops::kSeededWk), linear(h));
    seed_tensor(w_qkv, at(qkv_at + (q_size + kv_size) * h), seeded_rows(kv_rows, h), seed,
                index(ops::kSeededWv), linear(h));
    seed_tensor(w_o, at(i * h * q_size), seeded_columns(h, full_q, q_rows), seed,
                index(ops::kSeededWo), linear(full_q));
    seed_fp32(ffn_norm.get() + i * h, whole(1, h), seed, index(ops::kSeededFfnNorm),
              ops::kSeededNormRange);
    const int64_t gu_at = i * 2 * ffn * h;
    seed_tensor(w_gate_up, at(gu_at), seeded_rows(shard.ffn, h), seed, index(ops::kSeededWGate),
                linear(h));
    seed_tensor(w_gate_up, at(gu_at + ffn * h), seeded_rows(shard.ffn, h), seed,
                index(ops::kSeededWUp), linear(h));
    seed_tensor(w_down, at(i * h * ffn), seeded_columns(h, full_ffn, shard.ffn), seed,
                index(ops::kSeededWDown), linear(full_ffn));
  }
  const auto layers_count = static_cast<uint32_t>(layers);
  seed_fp32(final_norm.get(), whole(1, h), seed, ops::seeded_final_norm_index(layers_count),
            ops::kSeededNormRange);
  if (shard.degree > 1) {
    // Tied: the head is the embedding's rows, seeded as the embedding.
    const bool tied = model.tied_embeddings;
    seed_tensor(lm_head, 0, seeded_rows(shard.vocab, h), seed,
                tied ? ops::kSeededEmbeddingIndex : ops::seeded_lm_head_index(layers_count),
                tied ? ops::kSeededEmbeddingRange : linear(h));
  } else if (!model.tied_embeddings) {
    seed_tensor(lm_head, 0, whole(vocab, h), seed, ops::seeded_lm_head_index(layers_count),
                linear(h));
  }
  generate_features(seed);
  LS_CUDA(cudaStreamSynchronize(stream.get()));
}

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
  const size_t bucket =
      static_cast<size_t>(std::lower_bound(buckets.begin(), buckets.end(), rows_grid) - buckets.begin());
  graph_index_ = plan.mode == ForwardMode::kDecode && !graphs.empty() ? static_cast<int32_t>(bucket) : -1;
  // The tail joins the graph when every row is greedy (the sampler's weights and sort are not in
  // it) and no fault poisons the logits between the forward and the guard; a recorded step's tail
  // only when a record tail graph writes its count of top-k pairs (the record is in the guard).
  const bool greedy_tail =
      graph_index_ >= 0 && !tail_graphs.empty() && !plan.logits_poisoned &&
      std::all_of(plan.sampling.begin(), plan.sampling.end(),
                  [](const ResolvedSampling& x) { return x.top_k == 1; });
  record_in_graph = greedy_tail && plan.record && !record_tail_graphs.empty() &&
                    plan.top_logits_count == record_graph_k;
  tail_in_graph = greedy_tail && (!plan.record || record_in_graph);
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
  if (options.time_steps) {
    // After the pack: a device waiting for the host's planning and packing waits idle.
    const size_t slot = static_cast<size_t>(steps_count % kTimingSlots);
    LS_CUDA(cudaEventRecord(step_begin_marks[slot].get(), s));
  }
  LS_CUDA(cudaMemcpyAsync(staging.get(), words, static_cast<size_t>(head_words) * 4,
                          cudaMemcpyHostToDevice, s));
  if (pages > 0) {
    LS_CUDA(cudaMemcpyAsync(staging.get() + layout.table_pages, words + layout.table_pages,
                            pages * 4, cudaMemcpyHostToDevice, s));
  }
  LS_CUDA(cudaEventRecord(upload_done[parity].get(), s));
  staged = true;
  marks_count = 0;
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

template <typename T>
void CudaBackend::Impl::linear(const T* x, const T* w, float* y, int32_t tokens, int32_t out,
                               int32_t in, float beta) {
  if constexpr (std::is_same_v<T, float>) {
    LS_CUBLAS(kernels::gemm_f32_rowmajor(cublas.get(), x, w, y, tokens, out, in, beta));
  } else {
    if (tokens >= 1 && tokens <= options.gemv_tokens_max && in % 8 == 0) {
      LS_CUDA(kernels::launch_gemv_bf16(x, w, y, tokens, out, in, beta, forward_stream()));
    } else {
      LS_CUBLAS(gemm_plans->run(x, w, y, tokens, out, in, beta));
    }
  }
}

template <typename T>
void CudaBackend::Impl::enqueue_layer(int32_t i, int32_t tokens) {
  const kernels::LaunchStream s = forward_stream();
  const size_t li = static_cast<size_t>(i);
  const size_t h = static_cast<size_t>(hidden);
  const int32_t qkv_rows = q_size + 2 * kv_size;
  const size_t kv_layer = static_cast<size_t>(slots_count) * kv_size;
  T* k_layer = as<T>(k_cache) + li * kv_layer;
  T* v_layer = as<T>(v_cache) + li * kv_layer;
  T* x = as<T>(normed);
  LS_CUDA(kernels::launch_rms_norm(residual.get(), nullptr, tokens, hidden,
                                   attn_norm.get() + li * h, model.rms_eps, x, s));
  mark(CudaPhase::kNorms);
  linear(x, as<T>(w_qkv) + li * qkv_rows * h, qkv.get(), tokens, qkv_rows, hidden, 0.0f);
  mark(CudaPhase::kGemmQkv);
  if (model.qkv_bias || model.qk_norm) {
    const size_t d = static_cast<size_t>(model.head_dim);
    LS_CUDA(kernels::launch_qkv_bias_head_norm(
        qkv.get(), tokens, model.query_heads_count, model.kv_heads_count, model.head_dim,
        model.qkv_bias ? qkv_bias.get() + li * qkv_rows : nullptr,
        model.qk_norm ? q_norm.get() + li * d : nullptr,
        model.qk_norm ? k_norm.get() + li * d : nullptr, model.rms_eps, s));
  }
  LS_CUDA(kernels::launch_rope_qkv(qkv.get(), positions.get(), slots.get(), tokens,
                                   model.query_heads_count, model.kv_heads_count, model.head_dim,
                                   rope_cos.get(), rope_sin.get(), positions_count, q.get(),
                                   k_layer, v_layer, s));
  mark(CudaPhase::kRope);
  LS_CUDA(kernels::launch_paged_attention(attention_shape, q.get(), k_layer, v_layer,
                                          positions.get(), token_pool_rows.get(), table.get(),
                                          tokens, attention_workspace.get(),
                                          attention_workspace.count(), as<T>(attn_out), s));
  mark(CudaPhase::kAttention);
  row_parallel(as<T>(attn_out), as<T>(w_o) + li * h * q_size, tokens, q_size);
  mark(CudaPhase::kGemmO);
  LS_CUDA(kernels::launch_rms_norm(residual.get(), nullptr, tokens, hidden,
                                   ffn_norm.get() + li * h, model.rms_eps, x, s));
  mark(CudaPhase::kNorms);
  linear(x, as<T>(w_gate_up) + li * 2 * ffn * h, gate_up.get(), tokens, 2 * ffn, hidden, 0.0f);
  mark(CudaPhase::kGemmGateUp);
  LS_CUDA(kernels::launch_swiglu(gate_up.get(), tokens, ffn, as<T>(act), s));
  mark(CudaPhase::kSwiglu);
  row_parallel(as<T>(act), as<T>(w_down) + li * h * ffn, tokens, ffn);
  mark(CudaPhase::kGemmDown);
}

template <typename T>
void CudaBackend::Impl::enqueue_forward_as(int32_t tokens, int32_t logits_rows) {
  const kernels::LaunchStream s = forward_stream();
  LS_CUDA(kernels::launch_embedding(as<T>(embedding), input_ids.get(), tokens, hidden,
                                    residual.get(), s));
  mark(CudaPhase::kEmbedding);
  for (int32_t i = 0; i < layers; ++i) enqueue_layer<T>(i, tokens);
  LS_CUDA(kernels::launch_rms_norm(residual.get(), step_inputs().logits_token_index, logits_rows,
                                   hidden, final_norm.get(), model.rms_eps, as<T>(final_normed),
                                   s));
  lm_head_logits<T>(logits_rows);
  mark(CudaPhase::kLmHead);
}

// The o and down projections into the residual stream: fused into the GEMM (beta = 1) at TP 1;
// at TP > 1 this rank's partial over its `in` columns, all-reduced, then added.
template <typename T>
void CudaBackend::Impl::row_parallel(const T* x, const T* w, int32_t tokens, int32_t in) {
  if (!tp) {
    linear(x, w, residual.get(), tokens, hidden, in, 1.0f);
    return;
  }
  linear(x, w, tp->partial(), tokens, hidden, in, 0.0f);
  tp->reduce_into_residual(residual.get(), tokens, stream.get());
}

// logits [rows, vocab]: at TP > 1 this rank's vocabulary shard, all-gathered from every rank.
template <typename T>
void CudaBackend::Impl::lm_head_logits(int32_t logits_rows) {
  if (!tp) {
    const T* head = as<T>(model.tied_embeddings ? embedding : lm_head);
    linear(as<T>(final_normed), head, logits.get(), logits_rows, vocab, hidden, 0.0f);
    return;
  }
  linear(as<T>(final_normed), as<T>(lm_head), tp->head_shard(), logits_rows, shard.vocab_rows,
         hidden, 0.0f);
  tp->gather_logits(logits.get(), logits_rows, stream.get());
}

void CudaBackend::Impl::enqueue_forward(int32_t tokens, int32_t logits_rows) {
  if (tp) tp->begin_forward();
  if (options.precision == CudaPrecision::kFp32) {
    enqueue_forward_as<float>(tokens, logits_rows);
  } else {
    enqueue_forward_as<bf16>(tokens, logits_rows);
  }
}

// A timing event between two phases (options.profile); inside a capture, an external event node.
void CudaBackend::Impl::mark(CudaPhase phase) {
  if (!options.profile) return;
  LS_ASSERT(marks_count < static_cast<int32_t>(mark_events.size()), "{} phase marks",
            marks_count);
  const size_t k = static_cast<size_t>(marks_count++);
  mark_phases[k] = phase;
  LS_CUDA(cudaEventRecordWithFlags(mark_events[k].get(), stream.get(),
                                   capturing ? cudaEventRecordExternal : cudaEventRecordDefault));
}

// After the step completed: the time between consecutive marks, summed per phase.
void CudaBackend::Impl::collect_marks() {
  if (!options.profile || !phase_totals.available || marks_count < 2) return;
  for (int32_t k = 1; k < marks_count; ++k) {
    float ms = 0.0f;
    const cudaError_t status = cudaEventElapsedTime(&ms, mark_events[k - 1].get(),
                                                    mark_events[k].get());
    if (status != cudaSuccess) {
      (void)cudaGetLastError();  // not sticky: the profile is given up, the step is fine
      phase_totals.available = false;
      return;
    }
    phase_totals.ms[static_cast<size_t>(mark_phases[static_cast<size_t>(k)])] += ms;
  }
  ++phase_totals.steps;
}

// Rules 5–9: guard, (stochastic rows: weights and sort), finish, drafter, one packed copy back.
// A step whose tail is in its graph only copies back here.
void CudaBackend::Impl::enqueue_tail(const StepPlan& plan) {
  if (!tail_in_graph) {
    const bool stochastic = std::any_of(plan.sampling.begin(), plan.sampling.end(),
                                        [](const ResolvedSampling& x) { return x.top_k != 1; });
    enqueue_tail_kernels(plan.logits_rows_count(), plan.rows_count, stochastic,
                         plan.want_logprobs, plan.record ? plan.top_logits_count : kNotRecorded);
  }
  // Into this step's pinned buffer; enqueue_finish records its step_done after this copy.
  LS_CUDA(cudaMemcpyAsync(host_results[static_cast<size_t>(steps_count & 1)].get(), results.get(),
                          results_layout.copy_words(plan) * sizeof(int32_t),
                          cudaMemcpyDeviceToHost, stream.get()));
  mark(CudaPhase::kCopyBack);
}

// The tail's kernels over `logits_rows` logits rows and `rows` rows (a graph's: its bucket's,
// padding included — the finish and drafter kernels skip rows past the staged header's count,
// the guard's work on padding rows is never read). `sums`: the guard's row max and sum of
// exponentials, for log-probabilities (a graph always computes them; the header says whether
// the finish uses them). Greedy rows read the guard's argmax: the sampler's weights and sort run
// only when a row samples (top_k != 1). A recorded step's digests and top-k pairs come from the
// guard's pass over the logits (their combine beside the finish, on record_stream); its rows'
// state is snapshotted by the finish, or after the drafter when one runs, so the one packed copy
// brings back all a record needs (issue 12).
void CudaBackend::Impl::enqueue_tail_kernels(int32_t logits_rows, int32_t rows, bool stochastic,
                                             bool sums, int32_t record_k) {
  const cudaStream_t s = stream.get();
  const bool record = record_k != kNotRecorded;
  const kernels::RecordBuffers recorded = record_buffers();
  const kernels::LogitsPassArgs pass{
      .logits = logits.get(),
      .rows = logits_rows,
      .vocab = vocab,
      .workspace = logits_workspace.get(),
      .nan_flags = row_nan_flags.get(),
      .argmax = argmax.get(),
      .row_max = sums ? row_max.get() : nullptr,
      .row_sum = sums ? row_sum.get() : nullptr,
      .digests = record ? recorded.digests : nullptr,
      .top = record ? recorded.top : nullptr,
      .top_k = record ? record_k : 0,
  };
  const kernels::RecordFork fork{record_stream.get(), record_fork.get()};
  LS_CUDA(kernels::launch_logits_pass(pass, s, record ? &fork : nullptr));
  mark(CudaPhase::kGuard);
  const kernels::SamplingKeys sampler{keys.get(), sorted_keys.get()};
  if (stochastic) {
    LS_CUDA(kernels::launch_sampling_weights(step_inputs(), logits.get(), logits_rows, vocab,
                                             sampler, s));
    LS_CUDA(kernels::launch_sort_sampling_keys(sort_temp.get(), sort_temp.bytes(), sampler,
                                               logits_rows, vocab, segment_offsets.get(), s));
  }
  const kernels::FinishArgs args{
      .in = step_inputs(),
      .state = device_state(),
      .out = result_buffers(),
      .logits = logits.get(),
      .vocab = vocab,
      .argmax = argmax.get(),
      .row_nan_flags = row_nan_flags.get(),
      .row_max = row_max.get(),
      .row_sum = row_sum.get(),
      .keys = sampler,
      .input_ids = input_ids.get(),
      .snapshot = record && !drafting ? recorded : kernels::RecordBuffers{},
  };
  LS_CUDA(kernels::launch_finish_rows(args, rows, s));
  if (drafting) {
    // The next round's drafts from the committed history (CpuBackend::write_next_inputs).
    const kernels::TokenHistory token_history{history.get(), history_begin.get(),
                                              history_capacity};
    LS_CUDA(kernels::launch_record_and_draft(step_inputs(), device_state(), token_buffers(),
                                             token_history, rows, s));
  }
  if (record && drafting) {  // the drafts rewrote the future inputs after the finish's snapshot
    LS_CUDA(kernels::launch_record_state(step_inputs(), device_state(), rows, recorded, s));
  }
  if (record) {
    LS_CUDA(cudaEventRecord(record_join.get(), record_stream.get()));
    LS_CUDA(cudaStreamWaitEvent(s, record_join.get()));
  }
  mark(CudaPhase::kSampling);
}

void CudaBackend::Impl::check_step_launches() const { LS_CUDA(cudaGetLastError()); }

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
}

// After the step completed (options.time_steps): the device's idle time before it and its busy
// time, from the events stage() and enqueue_finish recorded.
void CudaBackend::Impl::collect_step_timing() {
  last_timing = CudaStepTiming{};
  if (!options.time_steps) return;
  const int64_t k = collected_count;
  auto elapsed_ms = [](const CudaEvent& from, const CudaEvent& to) {
    float ms = 0.0f;
    if (cudaEventElapsedTime(&ms, from.get(), to.get()) != cudaSuccess) {
      (void)cudaGetLastError();  // not sticky: the figure is given up, the step is fine
      return std::numeric_limits<double>::quiet_NaN();
    }
    return static_cast<double>(ms);
  };
  const CudaEvent& begin = step_begin_marks[static_cast<size_t>(k % kTimingSlots)];
  last_timing.busy_ms = elapsed_ms(begin, step_end_marks[static_cast<size_t>(k % kTimingSlots)]);
  if (k > 0) {
    last_timing.idle_before_ms =
        elapsed_ms(step_end_marks[static_cast<size_t>((k - 1) % kTimingSlots)], begin);
  }
}

CudaBackend::CudaBackend(const ModelWeights& weights, const ExecutorConfig& config,
                         const CudaBackendOptions& options)
    : impl_(std::make_unique<Impl>(weights.config, config, options)) {
  impl_->upload_weights(weights);
  if (options.graphs) impl_->capture_graphs();
}

CudaBackend::CudaBackend(const DeviceSeededWeights& weights, const ExecutorConfig& config,
                         const CudaBackendOptions& options)
    : impl_(std::make_unique<Impl>(weights.config, config, options)) {
  impl_->generate_weights(weights.seed);
  if (options.graphs) impl_->capture_graphs();
}

CudaBackend::~CudaBackend() = default;

void CudaBackend::capture_graphs() {
  LS_ASSERT(impl_->steps_count == 0 && impl_->graphs.empty(), "graphs captured after {} steps",
            impl_->steps_count);
  impl_->capture_graphs();
}

// Warm-up eagerly at every bucket (module loading and cuBLAS's first calls stay out of capture),
// then capture rules 1–4 of a decode step per bucket. The staged header is all zeros here: no
// real rows, so the fill scrubs every token and the forward writes only the dummy page 0.
void CudaBackend::Impl::capture_graphs() {
  const cudaStream_t s = stream.get();
  LS_CUDA(cudaMemsetAsync(staging.get(), 0, staging.bytes(), s));
  graphs.clear();
  tail_graphs.clear();
  record_tail_graphs.clear();
  record_graph_k = std::min(kTopLogitsCountMax, vocab);
  // One graph: what it enqueues and where it goes.
  struct Capture {
    std::function<void()> enqueue;
    std::vector<CudaGraph>* into;
    bool forward_only;
  };
  std::vector<Capture> captures;
  for (const int32_t grid : buckets) {
    captures.push_back({[this, grid] {
                          marks_count = 1;  // after the step's opening mark, which stage() records eagerly
                          enqueue_table_writes(grid);
                          enqueue_resets();
                          enqueue_fill(grid);
                          mark(CudaPhase::kStateOps);
                          enqueue_forward(grid * config.verify_width, grid * config.verify_width);
                        },
                        &graphs, true});
  }
  // The same with the greedy tail (profiling keeps the tail eager: its phases stay measurable).
  for (const bool record : {false, true}) {
    for (const int32_t grid : options.profile ? std::vector<int32_t>{} : buckets) {
      captures.push_back({[this, grid, record] {
                            const int32_t tokens = grid * config.verify_width;
                            enqueue_table_writes(grid);
                            enqueue_resets();
                            enqueue_fill(grid);
                            enqueue_forward(tokens, tokens);
                            enqueue_tail_kernels(tokens, grid, /*stochastic=*/false, /*sums=*/true,
                                                 record ? record_graph_k : kNotRecorded);
                          },
                          record ? &record_tail_graphs : &tail_graphs, false});
    }
  }
  // Every warm-up eagerly first, then every capture: a TP rank's warm-ups run collectives that
  // wait for the other ranks, and none may still wait for this one while it instantiates and
  // uploads graphs. Ranks sharing a GPU also meet on the host around each collective of the
  // warm-ups (kernels/tp_collectives.cpp): their first cuBLASLt products, attention launches and
  // sorts here may wait for the device, which must then hold no barrier kernel waiting for them.
  for (const Capture& c : captures) c.enqueue();
  LS_CUDA(cudaStreamSynchronize(s));
  for (const Capture& c : captures) {
    capturing = true;
    try {
      c.into->push_back(CudaGraph::capture(s, c.enqueue));
    } catch (...) {
      capturing = false;
      throw;
    }
    capturing = false;
    if (c.forward_only) graph_marks_end = marks_count;
  }
  LS_CUDA(cudaStreamSynchronize(s));
  marks_count = 0;
}

void CudaBackend::apply_table_writes(const StepPlan& plan) {
  Impl& m = *impl_;
  m.stage(plan);
  if (m.graph_step()) return;
  if (!plan.table_writes.empty()) m.enqueue_table_writes(m.rows_grid);
}

void CudaBackend::reset_lengths(const StepPlan& plan) {
  Impl& m = *impl_;
  m.stage(plan);
  if (m.graph_step()) return;
  if (!plan.length_resets.empty()) m.enqueue_resets();
}

void CudaBackend::fill_inputs(const StepPlan& plan) {
  Impl& m = *impl_;
  m.stage(plan);
  if (m.graph_step()) return;
  m.enqueue_fill(m.rows_grid);
  m.mark(CudaPhase::kStateOps);
}

namespace {
// Writes the nanoseconds of its scope to *out when it ends (the benchmark's host-time split).
struct ScopeNanos {
  int64_t* out;
  std::chrono::steady_clock::time_point begin = std::chrono::steady_clock::now();
  ~ScopeNanos() {
    *out = std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() -
                                                                begin)
               .count();
  }
};
}  // namespace

void CudaBackend::forward(const StepPlan& plan) {
  Impl& m = *impl_;
  const ScopeNanos timer{&m.last_forward_ns};
  m.stage(plan);
  if (plan.rows_count == 0) {
    // An IDLE step at TP > 1 issues the busy step's collectives with no elements, so the ranks of
    // a data-parallel group stay in step (the CPU reference's IDLE forward).
    if (m.tp) {
      m.tp->begin_forward();
      m.tp->idle_collectives(m.stream.get());
    }
    return;
  }
  if (m.graph_step()) {
    const auto& graphs = m.record_in_graph ? m.record_tail_graphs
                         : m.tail_in_graph ? m.tail_graphs
                                           : m.graphs;
    LS_CUDA(cudaGraphLaunch(graphs[static_cast<size_t>(m.graph_index_)].get(), m.stream.get()));
    ++m.graph_replays;
    m.tail_graph_replays += m.tail_in_graph ? 1 : 0;
    if (m.options.profile) m.marks_count = m.graph_marks_end;  // the graph recorded them
    return;
  }
  const int32_t tokens = plan.mode == ForwardMode::kDecode ? m.rows_grid * plan.verify_width
                                                           : plan.tokens_count;
  const int32_t logits_rows = plan.mode == ForwardMode::kDecode ? tokens : plan.logits_rows_count();
  m.enqueue_forward(tokens, logits_rows);
}

void CudaBackend::poison_logits(std::span<const int32_t> logits_rows, float value) {
  Impl& m = *impl_;
  for (const int32_t r : logits_rows) {
    LS_ASSERT(r >= 0 && r < m.logits_rows_max, "logits row {}", r);
    LS_CUDA(kernels::launch_fill_float(m.logits.get() + static_cast<int64_t>(r) * m.vocab, m.vocab,
                                       value, m.stream.get()));
  }
}

void CudaBackend::finish_step(const StepPlan& plan, StepResult& result) {
  LS_ASSERT(impl_->steps_in_flight() == 0, "finish_step with {} steps in flight",
            impl_->steps_in_flight());
  enqueue_finish(plan);
  collect_finish(plan, result);
}

bool CudaBackend::can_run_ahead() const { return !impl_->options.profile; }

// Rules 5–9 launched behind the step's forward, then this parity's step_done; nothing waits.
void CudaBackend::enqueue_finish(const StepPlan& plan) {
  Impl& m = *impl_;
  const ScopeNanos timer{&m.last_enqueue_ns};
  m.stage(plan);
  // The phase marks are one set, read when the step is collected.
  LS_ASSERT(!m.options.profile || m.steps_in_flight() == 0, "profiling with {} steps in flight",
            m.steps_in_flight());
  const size_t parity = static_cast<size_t>(m.steps_count & 1);
  const cudaStream_t s = m.stream.get();
  if (plan.rows_count > 0) {
    m.enqueue_tail(plan);
    if (plan.capture_logits) {
      // Pageable memory: the call returns once the copy is done, so a step that captures logits
      // (tests, replays) completes here instead of running ahead.
      std::vector<float>& logits = m.host_logits[parity];
      logits.resize(static_cast<size_t>(plan.logits_rows_count()) * m.vocab);
      LS_CUDA(cudaMemcpyAsync(logits.data(), m.logits.get(), logits.size() * sizeof(float),
                              cudaMemcpyDeviceToHost, s));
    }
  }
  LS_CUDA(cudaEventRecord(m.step_done[parity].get(), s));
  if (m.options.time_steps) {
    LS_CUDA(cudaEventRecord(
        m.step_end_marks[static_cast<size_t>(m.steps_count % Impl::kTimingSlots)].get(), s));
  }
  m.check_step_launches();
  m.staged = false;
  ++m.steps_count;
}

// Waits for the oldest enqueued step (its parity's step_done) and unpacks its pinned results.
void CudaBackend::collect_finish(const StepPlan& plan, StepResult& result) {
  Impl& m = *impl_;
  const ScopeNanos timer{&m.last_collect_ns};
  LS_ASSERT(m.steps_in_flight() > 0, "collect_finish with no step in flight");
  const size_t parity = static_cast<size_t>(m.collected_count & 1);
  const auto wait_begin = std::chrono::steady_clock::now();
  LS_CUDA(cudaEventSynchronize(m.step_done[parity].get()));
  // The waits since the last collect: this one and an eager step's wait at staging.
  m.last_wait_ns = std::chrono::duration_cast<std::chrono::nanoseconds>(
                       std::chrono::steady_clock::now() - wait_begin)
                       .count() +
                   std::exchange(m.stage_wait_ns, 0);
  m.unpack(plan, parity, result);  // an IDLE step: every vector empty
  if (plan.capture_logits && plan.rows_count > 0) {
    result.logits.swap(m.host_logits[parity]);  // the old vector is this parity's next buffer
  } else {
    result.logits.clear();
  }
  if (plan.rows_count > 0) m.collect_marks();
  m.collect_step_timing();
  ++m.collected_count;
}

void CudaBackend::copy_pages(const CacheOp& op) {
  Impl& m = *impl_;
  LS_ASSERT(op.device_pages.size() == op.host_pages.size(), "unpaired page copy");
  // The executor refuses a state slot on a backend without recurrent state, and this one runs no
  // model with Mamba layers yet (issue 19): its swaps carry KV pages only.
  LS_ASSERT(op.state_slot == -1, "cuda backend: cache op with state slot {}", op.state_slot);
  const size_t p = static_cast<size_t>(m.config.page_size);
  const size_t kv = static_cast<size_t>(m.kv_size);
  const size_t l = static_cast<size_t>(m.layers);
  const size_t e = m.elem_bytes;
  const size_t page_bytes = p * kv * e;
  const size_t layer_pitch = static_cast<size_t>(m.slots_count) * kv * e;
  for (size_t i = 0; i < op.device_pages.size(); ++i) {
    LS_ASSERT(op.device_pages[i] >= 1 && op.device_pages[i] < m.config.pages_count,
              "device page {}", op.device_pages[i]);
    LS_ASSERT(op.host_pages[i] >= 0 && op.host_pages[i] < m.config.host_pages_count,
              "host page {}", op.host_pages[i]);
    const size_t first_slot = static_cast<size_t>(op.device_pages[i]) * p;
    uint8_t* host_page = m.host_kv.get() + static_cast<size_t>(op.host_pages[i]) * 2 * l * page_bytes;
    for (int which = 0; which < 2; ++which) {
      uint8_t* device = (which == 0 ? m.k_cache.get() : m.v_cache.get()) + first_slot * kv * e;
      uint8_t* host = host_page + static_cast<size_t>(which) * l * page_bytes;
      if (op.kind == CacheOpKind::kSwapOut) {
        LS_CUDA(cudaMemcpy2DAsync(host, page_bytes, device, layer_pitch, page_bytes, l,
                                  cudaMemcpyDeviceToHost, m.stream.get()));
      } else {
        LS_CUDA(cudaMemcpy2DAsync(device, layer_pitch, host, page_bytes, page_bytes, l,
                                  cudaMemcpyHostToDevice, m.stream.get()));
      }
    }
  }
}

StateSnapshot CudaBackend::read_state(std::span<const int32_t> pool_rows) const {
  const Impl& m = *impl_;
  LS_CUDA(cudaStreamSynchronize(m.stream.get()));
  const std::vector<int32_t> table = download(m.table);
  const std::vector<int32_t> vcl = download(m.vcl);
  const std::vector<int32_t> fim = download(m.future_inputs);
  const size_t w = static_cast<size_t>(m.config.verify_width);
  const size_t width = static_cast<size_t>(m.table_width);
  StateSnapshot s;
  for (const int32_t rpi : pool_rows) {
    LS_ASSERT(rpi >= 0 && rpi < m.config.pool_rows_count(), "pool row {}", rpi);
    const size_t row = static_cast<size_t>(rpi);
    s.pool_rows.push_back(rpi);
    s.valid_cache_length.push_back(vcl[row]);
    s.future_inputs.insert(s.future_inputs.end(), fim.begin() + row * w, fim.begin() + (row + 1) * w);
    s.table.insert(s.table.end(), table.begin() + row * width, table.begin() + (row + 1) * width);
  }
  return s;
}

InputSnapshot CudaBackend::read_inputs() const {
  const Impl& m = *impl_;
  LS_CUDA(cudaStreamSynchronize(m.stream.get()));
  return {download(m.input_ids), download(m.positions), download(m.slots)};
}

CudaMemoryReport CudaBackend::memory_report() const {
  const Impl& m = *impl_;
  return {m.ledger.weights, m.ledger.kv, m.ledger.workspace};
}

int64_t CudaBackend::graph_replays_count() const { return impl_->graph_replays; }

int64_t CudaBackend::tail_graph_replays_count() const { return impl_->tail_graph_replays; }

std::string CudaBackend::drafter_name() const {
  const std::string& name = impl_->options.drafter;
  return name.empty() ? std::string(kNoDrafterName) : name;
}

int64_t CudaBackend::last_wait_ns() const { return impl_->last_wait_ns; }

int64_t CudaBackend::last_forward_ns() const { return impl_->last_forward_ns; }

int64_t CudaBackend::last_finish_ns() const {
  return impl_->last_enqueue_ns + impl_->last_collect_ns;
}

CudaStepTiming CudaBackend::last_step_timing() const { return impl_->last_timing; }

DeviceStepTime CudaBackend::last_device_time() const {
  const auto ns = [](double ms) { return std::isnan(ms) ? int64_t{-1} : static_cast<int64_t>(std::llround(ms * 1e6)); };
  return DeviceStepTime{.busy_ns = ns(impl_->last_timing.busy_ms),
                        .idle_before_ns = ns(impl_->last_timing.idle_before_ms),
                        .wait_ns = impl_->last_wait_ns};
}

CudaPhaseTimes CudaBackend::phase_times() const { return impl_->phase_totals; }

std::vector<CollectiveCall> CudaBackend::collectives() const {
  return impl_->tp ? impl_->tp->calls() : std::vector<CollectiveCall>{};
}

void CudaBackend::reset_phase_times() {
  const bool available = impl_->phase_totals.available;
  impl_->phase_totals = CudaPhaseTimes{};
  impl_->phase_totals.available = available;
}

std::string_view to_string(CudaPrecision precision) {
  return precision == CudaPrecision::kFp32 ? "fp32" : "bf16";
}

std::string_view to_string(CudaPhase phase) {
  switch (phase) {
    case CudaPhase::kStateOps: return "state_ops";
    case CudaPhase::kEmbedding: return "embedding";
    case CudaPhase::kNorms: return "norms";
    case CudaPhase::kGemmQkv: return "gemm_qkv";
    case CudaPhase::kRope: return "rope_kv_write";
    case CudaPhase::kAttention: return "attention";
    case CudaPhase::kGemmO: return "gemm_o";
    case CudaPhase::kGemmGateUp: return "gemm_gate_up";
    case CudaPhase::kSwiglu: return "swiglu";
    case CudaPhase::kGemmDown: return "gemm_down";
    case CudaPhase::kLmHead: return "lm_head";
    case CudaPhase::kGuard: return "guard_argmax";
    case CudaPhase::kSampling: return "sampling_commit";
    case CudaPhase::kCopyBack: return "copy_back";
    case CudaPhase::kCount: break;
  }
  return "?";
}

std::unique_ptr<Backend> make_cuda_backend(const ModelWeights& weights,
                                           const ExecutorConfig& config) {
  return std::make_unique<CudaBackend>(weights, config);
}

std::unique_ptr<Backend> make_cuda_backend(const ModelWeights& weights,
                                           const ExecutorConfig& config,
                                           const CudaBackendOptions& options) {
  return std::make_unique<CudaBackend>(weights, config, options);
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

bool cuda_device_available() {
  int count = 0;
  return cudaGetDeviceCount(&count) == cudaSuccess && count > 0;
}

CudaMachineInfo cuda_machine_info(int32_t device) {
  LS_REQUIRE(cuda_device_available(), "no CUDA device is available");
  cudaDeviceProp props{};
  LS_CUDA(cudaGetDeviceProperties(&props, device));
  int driver = 0;
  int runtime = 0;
  LS_CUDA(cudaDriverGetVersion(&driver));
  LS_CUDA(cudaRuntimeGetVersion(&runtime));
  int major = 0, minor = 0, patch = 0;
  LS_CUBLAS(cublasGetProperty(MAJOR_VERSION, &major));
  LS_CUBLAS(cublasGetProperty(MINOR_VERSION, &minor));
  LS_CUBLAS(cublasGetProperty(PATCH_LEVEL, &patch));
  // The kernel module's version, when the proc file is there (Linux): the first dotted number
  // after "Kernel Module" ("... Open Kernel Module for x86_64  580.159.04  Release Build ...").
  std::string kernel_driver;
  std::ifstream proc("/proc/driver/nvidia/version");
  std::string line;
  if (proc && std::getline(proc, line)) {
    const size_t kernel_module = line.find("Kernel Module");
    const std::string rest = kernel_module == std::string::npos ? line : line.substr(kernel_module);
    std::smatch match;
    if (std::regex_search(rest, match, std::regex(R"(\b\d+\.\d+(\.\d+)?\b)"))) {
      kernel_driver = match.str();
    }
  }
  CudaMachineInfo info;
  info.gpu_name = props.name;
  info.sm_count = std::to_string(props.multiProcessorCount);
  info.driver_version = (kernel_driver.empty() ? std::string("unknown") : kernel_driver) +
                        " (CUDA " + version_string(driver) + ")";
  info.runtime_version = version_string(runtime);
  info.cublas_version = fmt::format("{}.{}.{}", major, minor, patch);
  return info;
}

}  // namespace ls
