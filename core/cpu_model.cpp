#include "core/cpu_model.h"

#include "core/check.h"
#include "core/logits_digest.h"
#include "core/host_memory.h"
#include "core/host_threads.h"
#include "core/mamba_mixer.h"
#include "core/ops/layer_math.h"
#include "core/seams.h"
#include "core/step_plan.h"
#include "core/tensor_parallel.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <vector>

namespace ls {

namespace {

// One fixed summation order (core/ops/layer_math.h): the result never depends on the batch.
float dot(const float* a, const float* b, int32_t n) { return ops::dot_fixed_order(a, b, n); }

// Tokens a layer's products take together: each weight row is dotted with every token of a tile
// while it is in cache, so a step reads its weights once a tile instead of once a token — where
// a layer's weights outgrow the caches (CpuModel::token_tile_); below that (`tiny`, whose weights
// stay in the caches anyway) a token at a time, as the simulator's sweeps run fastest.
constexpr int32_t kTokenTile = 16;
constexpr int64_t kTiledLayerBytes = int64_t{4} << 20;

// y_t[o] = W[o, cols] · x_t[cols] for a tile's tokens t (x[t], y[t]) and the outputs o in `rows`,
// W row-major [out, in], on this thread. The AVX2 clone does dot_fixed_order's 8 accumulators in
// one 256-bit register instead of two SSE ones: the same multiplies and adds (host code never
// contracts them into FMAs), so the same bits.
[[gnu::target_clones("avx2", "default")]] void products_serial(
    const float* w, int32_t in, ShardRange rows, ShardRange cols, std::span<const float* const> x,
    std::span<float* const> y) {
  if (x.size() == 1) {  // a token alone: the pointers held in registers, not reloaded per row
    const float* x0 = x[0] + cols.begin;
    float* y0 = y[0];
    for (int32_t o = rows.begin; o < rows.end(); ++o) {
      y0[o] = dot(w + static_cast<size_t>(o) * in + cols.begin, x0, cols.count);
    }
    return;
  }
  for (int32_t o = rows.begin; o < rows.end(); ++o) {
    const float* row = w + static_cast<size_t>(o) * in + cols.begin;
    for (size_t t = 0; t < x.size(); ++t) y[t][o] = dot(row, x[t] + cols.begin, cols.count);
  }
}

// Multiply-adds a thread takes at the least, and the most threads a product uses: a product of a
// model whose layers outgrow the caches spreads its outputs over the machine's cores.
constexpr int64_t kThreadWork = int64_t{1} << 22;
constexpr int32_t kThreadsMax = 16;

int32_t cores() {
  static const int32_t count = std::min(host_cores(), kThreadsMax);
  return count;
}

// Threads worth giving `work` multiply-adds split into at most `items` parts.
int32_t threads_for(int64_t work, int64_t items) {
  if (work < 2 * kThreadWork) return 1;  // `tiny`'s every product and attention
  return static_cast<int32_t>(std::min<int64_t>({cores(), work / kThreadWork, items}));
}

// products_serial's outputs, split into contiguous runs of rows over up to cores() threads when the
// product is big enough to pay for them. Column-parallel shards take all of `cols` and their
// `rows`; row-parallel partials (the all-reduce adds the ranks') every row and their `cols`. Each
// output is the one dot product a token alone computes, on one thread: tiles and threads change
// no bit.
void products(const float* w, int32_t in, ShardRange rows, ShardRange cols,
              std::span<const float* const> x, std::span<float* const> y) {
  const int64_t work = int64_t{rows.count} * cols.count * static_cast<int64_t>(x.size());
  const auto run = [&](int64_t begin, int64_t end, int32_t) {
    const auto first = static_cast<int32_t>(begin);
    products_serial(w, in, ShardRange{rows.begin + first, static_cast<int32_t>(end) - first}, cols,
                    x, y);
  };
  in_thread_runs(rows.count, threads_for(work, rows.count), run);
}

// One token's column-parallel shard of y = W x: y[o] = W[o, :] · x for o in `rows`.
void matvec_rows(const std::vector<float>& w, const float* x, int32_t in, ShardRange rows,
                 float* y) {
  const float* const xs[] = {x};
  float* const ys[] = {y};
  products(w.data(), in, rows, ShardRange{0, in}, xs, ys);
}

// The tiles of `count` tokens: f(first, n) for [first, first + n), n <= tile <= kTokenTile.
template <typename F>
void for_each_tile(int32_t count, int32_t tile, F&& f) {
  for (int32_t first = 0; first < count; first += tile) f(first, std::min(tile, count - first));
}

void rms_norm(const float* x, const std::vector<float>& weight, int32_t n, float eps, float* y) {
  ops::rms_norm_row(x, weight.data(), n, eps, y);
}

void add_bias(const std::vector<float>& bias, ShardRange rows, float* y) {
  for (int32_t i = rows.begin; i < rows.end(); ++i) y[i] += bias[i];
}

}  // namespace

CpuModel::CpuModel(const ModelWeights& weights, const ExecutorConfig& config, int32_t tp_degree)
    : weights_(weights),
      model_(weights.config),
      limits_(config),
      rope_(build_rope_table(model_.rope(), model_.rotary_dim(),
                             config.table_width() * config.page_size)),
      tp_(make_tp_layout(weights.config, tp_degree)),
      group_(tp_degree, kCollectivesPerLayer * weights.config.layers_count + 1) {
  weights.validate();
  config.validate();
  check_context_length(model_, config.context_length, /*allow_beyond_max_positions=*/true);
  // TODO(perf): a hybrid's Mamba layers keep K/V slots they never write (one layout for all layers).
  kv_slots_count_ = int64_t{config.pages_count} * config.page_size;
  const uint64_t slot_bytes = uint64_t{sizeof(float)} * model_.layers_count * 2 * model_.kv_size();
  require_host_memory(slot_bytes * static_cast<uint64_t>(kv_slots_count_ +
                                                         int64_t{config.host_pages_count} * config.page_size),
                      fmt::format("the CPU KV pools ({} device + {} host pages of {} tokens)",
                                  config.pages_count, config.host_pages_count, config.page_size));
  const size_t tokens = static_cast<size_t>(config.step_tokens_max());
  kv_ = ZeroedFloats(static_cast<size_t>(kv_slots_count_) * model_.layers_count * 2 *
                     model_.kv_size());
  host_kv_ = ZeroedFloats(static_cast<size_t>(config.host_pages_count) * config.page_size *
                          model_.layers_count * 2 * model_.kv_size());
  residual_.resize(tokens * model_.hidden_size);
  normed_.resize(tokens * model_.hidden_size);
  partials_.resize(static_cast<size_t>(tp_degree) * tokens * model_.hidden_size);
  reduced_.resize(tokens * model_.hidden_size);
  q_.resize(tokens * model_.q_size());
  const int64_t ffn_bytes = int64_t{4} * model_.hidden_size * model_.ffn_size;
  token_tile_ = ffn_bytes >= kTiledLayerBytes ? kTokenTile : 1;
  attn_out_.resize(static_cast<size_t>(token_tile_) * model_.q_size());
  gate_.resize(static_cast<size_t>(token_tile_) * model_.ffn_size);
  up_.resize(static_cast<size_t>(token_tile_) * model_.ffn_size);
  scores_.resize(static_cast<size_t>(cores()) * rope_.positions_count);
  init_mamba_pool(config, tp_degree);
}

// The recurrent-state pool, sized once from mamba_slots_count, plus the verify-state slots of
// speculative decoding (core/limits.h mamba_verify_slots_count: B·W when W > 1, so a rejected
// draft never reaches the working state). Refused: tensor parallelism, which the reference does
// not implement for Mamba layers.
void CpuModel::init_mamba_pool(const ExecutorConfig& config, int32_t tp_degree) {
  mamba_index_.assign(static_cast<size_t>(model_.layers_count), -1);
  if (!model_.has_recurrent_state()) return;
  LS_REQUIRE(tp_degree == 1, "--tp {}: model '{}' has Mamba2 layers; tensor parallelism is not "
             "implemented for them", tp_degree, model_.name);
  LS_REQUIRE(config.mamba_slots_count >= 1, "model '{}' has {} Mamba2 layers but "
             "mamba_slots_count is 0: its requests need recurrent-state slots", model_.name,
             model_.mamba_layers_count());
  int32_t next = 0;
  for (int32_t l = 0; l < model_.layers_count; ++l) {
    if (model_.layer_kind(l) == LayerKind::kMamba2) mamba_index_[static_cast<size_t>(l)] = next++;
  }
  const MambaConfig& m = model_.mamba;
  mamba_layer_floats_ = m.conv_state_floats() + m.ssm_state_floats();
  mamba_slot_floats_ = mamba_layer_floats_ * next;
  // The host side: one state for every host page, so a request swapped out keeps its state with
  // its first host page (CacheOp::state_slot).
  mamba_pool_slots_ = config.mamba_slots_count + config.mamba_verify_slots_count();
  const uint64_t floats = static_cast<uint64_t>(mamba_slot_floats_) * mamba_pool_slots_;
  const uint64_t host_floats = static_cast<uint64_t>(mamba_slot_floats_) * config.host_pages_count;
  require_host_memory((floats + host_floats) * sizeof(float),
                      fmt::format("the CPU recurrent-state pools ({} slots, {} verify-state "
                                  "slots, {} host states)", config.mamba_slots_count,
                                  config.mamba_verify_slots_count(), config.host_pages_count));
  mamba_states_ = ZeroedFloats(static_cast<size_t>(floats));
  host_mamba_states_ = ZeroedFloats(static_cast<size_t>(host_floats));
  proj_.resize(static_cast<size_t>(m.in_proj_size()));
  mamba_scratch_ = make_mamba_scratch(m);
  mamba_y_.resize(static_cast<size_t>(m.inner_size()));
}

float* CpuModel::mamba_state_at(int32_t slot, int32_t layer) {
  LS_ASSERT(slot >= 0 && slot < mamba_pool_slots_, "mamba slot {} of {}", slot, mamba_pool_slots_);
  const int32_t index = mamba_index_[static_cast<size_t>(layer)];
  LS_ASSERT(index >= 0, "layer {} is not a Mamba layer", layer);
  return mamba_states_.data() + static_cast<size_t>(slot) * mamba_slot_floats_ +
         static_cast<size_t>(index) * mamba_layer_floats_;
}

void CpuModel::zero_mamba_state(int32_t slot) {
  LS_ASSERT(slot >= 0 && slot < limits_.mamba_slots_count, "mamba slot {}", slot);
  float* begin = mamba_states_.data() + static_cast<size_t>(slot) * mamba_slot_floats_;
  std::fill(begin, begin + mamba_slot_floats_, 0.0f);
}

void CpuModel::copy_mamba_state(int32_t src, int32_t dst) {
  LS_ASSERT(src >= 0 && src < mamba_pool_slots_, "mamba slot {}", src);
  LS_ASSERT(dst >= 0 && dst < mamba_pool_slots_, "mamba slot {}", dst);
  const float* from = mamba_states_.data() + static_cast<size_t>(src) * mamba_slot_floats_;
  std::copy(from, from + mamba_slot_floats_,
            mamba_states_.data() + static_cast<size_t>(dst) * mamba_slot_floats_);
}

std::vector<float> CpuModel::read_mamba_state(int32_t slot) const {
  LS_ASSERT(slot >= 0 && slot < limits_.mamba_slots_count, "mamba slot {}", slot);
  const float* from = mamba_states_.data() + static_cast<size_t>(slot) * mamba_slot_floats_;
  return std::vector<float>(from, from + mamba_slot_floats_);
}

uint64_t CpuModel::mamba_state_digest(int32_t slot) const {
  LS_ASSERT(slot >= 0 && slot < limits_.mamba_slots_count, "mamba slot {}", slot);
  return ls::mamba_state_digest(std::span<const float>(
      mamba_states_.data() + static_cast<size_t>(slot) * mamba_slot_floats_,
      static_cast<size_t>(mamba_slot_floats_)));
}

float* CpuModel::kv_at(int64_t slot, int32_t layer, int32_t which) {
  LS_ASSERT(slot >= 0 && slot < kv_slots_count_, "slot {} of {}", slot, kv_slots_count_);
  const int64_t index = ((slot * model_.layers_count + layer) * 2 + which) * model_.kv_size();
  return kv_.data() + index;
}

void CpuModel::copy_pages(const CacheOp& op) {
  LS_ASSERT(op.device_pages.size() == op.host_pages.size(), "unpaired page copy");
  const size_t page_floats =
      static_cast<size_t>(limits_.page_size) * model_.layers_count * 2 * model_.kv_size();
  for (size_t i = 0; i < op.device_pages.size(); ++i) {
    LS_ASSERT(op.device_pages[i] >= 1 && op.device_pages[i] < limits_.pages_count, "device page {}",
              op.device_pages[i]);
    LS_ASSERT(op.host_pages[i] >= 0 && op.host_pages[i] < limits_.host_pages_count, "host page {}",
              op.host_pages[i]);
    float* device = kv_.data() + static_cast<size_t>(op.device_pages[i]) * page_floats;
    float* host = host_kv_.data() + static_cast<size_t>(op.host_pages[i]) * page_floats;
    if (op.kind == CacheOpKind::kSwapOut) {
      std::copy(device, device + page_floats, host);
    } else {
      std::copy(host, host + page_floats, device);
    }
  }
  if (op.state_slot >= 0) copy_host_state(op);
}

// The recurrent state of op.state_slot to or from the host state of the op's first host page.
void CpuModel::copy_host_state(const CacheOp& op) {
  LS_ASSERT(op.state_slot < limits_.mamba_slots_count && !op.host_pages.empty() &&
                !host_mamba_states_.empty(),
            "state slot {} of {}", op.state_slot, limits_.mamba_slots_count);
  const size_t n = static_cast<size_t>(mamba_slot_floats_);
  float* device = mamba_states_.data() + static_cast<size_t>(op.state_slot) * n;
  float* host = host_mamba_states_.data() + static_cast<size_t>(op.host_pages.front()) * n;
  if (op.kind == CacheOpKind::kSwapOut) {
    std::copy(device, device + n, host);
  } else {
    std::copy(host, host + n, device);
  }
}

void CpuModel::forward(const ForwardTokens& tokens, std::span<const int32_t> table,
                       std::span<float> logits) {
  const int32_t count = static_cast<int32_t>(tokens.input_ids.size());
  const int32_t h = model_.hidden_size;
  LS_ASSERT(count <= limits_.step_tokens_max(), "{} tokens", count);
  LS_ASSERT(logits.size() >= tokens.logits_token_index.size() * model_.vocab_size,
            "logits buffer too small");
  group_.begin_forward();
  if (capture_) capture_->tensors.clear();
  // The embedding is replicated on every rank (a vocabulary-parallel lookup adds one non-zero row
  // to zeros: the same bits).
  for (int32_t t = 0; t < count; ++t) {
    const float* row = weights_.embedding.data() + static_cast<size_t>(tokens.input_ids[t]) * h;
    std::copy(row, row + h, residual_.data() + static_cast<size_t>(t) * h);
  }
  // With no tokens (an IDLE forward) every layer still issues its collectives, with no rows.
  for (int32_t layer = 0; layer < model_.layers_count; ++layer) {
    // All K/V of the layer are written before any token attends, so a token inside a prefill
    // chunk sees the earlier tokens of its own chunk exactly as a decode step would.
    if (model_.layer_kind(layer) == LayerKind::kMamba2) {
      mamba_layer(layer, tokens);
    } else {
      attention_layer_qkv(layer, tokens);
      if (capture_) capture_qkv(layer, tokens);
      attention_layer_out(layer, tokens, table);
    }
    ffn_layer(layer, count);
    seams::cpu_layer_output(layer, std::span<float>(residual_.data(), static_cast<size_t>(count) * h));
    if (capture_) capture_rows(layer, ActivationKind::kMlpOut, residual_.data(), count, h);
  }
  lm_head(tokens.logits_token_index, logits);
  if (capture_) {
    const int32_t rows = static_cast<int32_t>(tokens.logits_token_index.size());
    capture_rows(-1, ActivationKind::kFinalNorm, normed_.data(), rows, h);
    capture_rows(-1, ActivationKind::kLogits, logits.data(), rows, model_.vocab_size);
  }
}

void CpuModel::capture_activations(StepActivations* sink) {
  LS_REQUIRE(sink == nullptr || !model_.has_recurrent_state(),
             "per-layer activations: model '{}' has Mamba2 layers, which the capture does not "
             "cover", model_.name);
  LS_REQUIRE(sink == nullptr || tp_.degree() == 1,
             "per-layer activations: not captured at tensor-parallel degree {} (TP 1 only)",
             tp_.degree());
  capture_ = sink;
}

void CpuModel::capture_rows(int32_t layer, ActivationKind kind, const float* rows, int32_t count,
                            int32_t width) {
  ActivationTensor& t = capture_->add(layer, kind, count, width);
  std::copy(rows, rows + t.values.size(), t.values.begin());
}

// attn_in, q, k and v of every token (k and v as written at its slot); attn_out's rows are filled
// as attention_layer_out computes them.
void CpuModel::capture_qkv(int32_t layer, const ForwardTokens& tokens) {
  const int32_t count = static_cast<int32_t>(tokens.input_ids.size());
  const int32_t kv = model_.kv_size();
  capture_rows(layer, ActivationKind::kAttnIn, normed_.data(), count, model_.hidden_size);
  capture_rows(layer, ActivationKind::kQ, q_.data(), count, model_.q_size());
  for (const int32_t which : {0, 1}) {
    ActivationTensor& t = capture_->add(layer, which == 0 ? ActivationKind::kK : ActivationKind::kV,
                                        count, kv);
    for (int32_t i = 0; i < count; ++i) {
      const float* row = kv_at(tokens.slots[i], layer, which);
      std::copy(row, row + kv, t.values.begin() + static_cast<ptrdiff_t>(i) * kv);
    }
  }
  attn_capture_ = &capture_->add(layer, ActivationKind::kAttnOut, count, model_.q_size());
}

// Each rank computes the logits of its vocabulary shard for every row, in place in `logits`
// [rows, V]; the all-gather puts the shards side by side, so the logits equal TP 1's bit for bit.
void CpuModel::lm_head(std::span<const int32_t> logits_token_index, std::span<float> logits) {
  const int32_t h = model_.hidden_size;
  const int32_t v = model_.vocab_size;
  const std::span<const float> head = weights_.lm_head_view();
  const size_t rows = logits_token_index.size();
  for (size_t r = 0; r < rows; ++r) {
    rms_norm(residual_.data() + static_cast<size_t>(logits_token_index[r]) * h,
             weights_.final_norm, h, model_.rms_eps, normed_.data() + r * h);
  }
  for (int32_t rank = 0; rank < tp_.degree(); ++rank) {
    const ShardRange shard = tp_.vocab(rank);
    for_each_tile(static_cast<int32_t>(rows), token_tile_, [&](int32_t first, int32_t n) {
      std::array<const float*, kTokenTile> x{};
      std::array<float*, kTokenTile> y{};
      for (int32_t i = 0; i < n; ++i) {
        x[i] = normed_.data() + static_cast<size_t>(first + i) * h;
        y[i] = logits.data() + static_cast<size_t>(first + i) * v;
      }
      const size_t tile = static_cast<size_t>(n);
      products(head.data(), h, shard, ShardRange{0, h}, std::span(x.data(), tile),
               std::span(y.data(), tile));
    });
  }
  group_.all_gather(static_cast<int64_t>(rows) * tp_.vocab(0).count);
}

// The all-reduce after a row-parallel layer: the ranks' partials [degree, tokens, h] summed in
// rank order into reduced_, then added to the residual stream.
void CpuModel::reduce_into_residual(int32_t tokens_count) {
  const size_t n = static_cast<size_t>(tokens_count) * model_.hidden_size;
  group_.all_reduce_sum(std::span<const float>(partials_.data(), n * tp_.degree()),
                        std::span<float>(reduced_.data(), n));
  for (size_t i = 0; i < n; ++i) residual_[i] += reduced_[i];
}

float* CpuModel::partial_at(int32_t rank, int32_t token, int32_t tokens_count) {
  return partials_.data() + (static_cast<size_t>(rank) * tokens_count + token) * model_.hidden_size;
}

// Column-parallel q/k/v: each rank computes its query heads and kv heads (whole heads, so the
// per-head norm and RoPE stay on the rank) from the replicated normed input.
void CpuModel::attention_layer_qkv(int32_t layer, const ForwardTokens& tokens) {
  const LayerWeights& w = weights_.layers[layer];
  const int32_t h = model_.hidden_size;
  const int32_t count = static_cast<int32_t>(tokens.input_ids.size());
  for (int32_t t = 0; t < count; ++t) {
    rms_norm(residual_.data() + static_cast<size_t>(t) * h, w.attn_norm, h, model_.rms_eps,
             normed_.data() + static_cast<size_t>(t) * h);
  }
  for_each_tile(count, token_tile_, [&](int32_t first, int32_t n) {
    std::array<const float*, kTokenTile> x{};
    std::array<float*, kTokenTile> q{}, k{}, v{};
    for (int32_t i = 0; i < n; ++i) {
      const int32_t t = first + i;
      x[i] = normed_.data() + static_cast<size_t>(t) * h;
      q[i] = q_.data() + static_cast<size_t>(t) * model_.q_size();
      k[i] = kv_at(tokens.slots[t], layer, 0);
      v[i] = kv_at(tokens.slots[t], layer, 1);
    }
    const size_t tile = static_cast<size_t>(n);
    for (int32_t rank = 0; rank < tp_.degree(); ++rank) {
      const ShardRange q_rows = head_elements(tp_.query_heads(rank), model_.head_dim);
      const ShardRange kv_rows = head_elements(tp_.kv_heads(rank), model_.head_dim);
      const std::span<const float* const> xs(x.data(), tile);
      products(w.wq.data(), h, q_rows, ShardRange{0, h}, xs, std::span(q.data(), tile));
      products(w.wk.data(), h, kv_rows, ShardRange{0, h}, xs, std::span(k.data(), tile));
      products(w.wv.data(), h, kv_rows, ShardRange{0, h}, xs, std::span(v.data(), tile));
      for (int32_t i = 0; i < n; ++i) {
        const int32_t position = rope_position(tokens.positions[first + i]);
        rank_qkv_heads(w, tp_.query_heads(rank), tp_.kv_heads(rank), position, q[i], k[i],
                       v[i]);
      }
    }
  });
}

// One rank's share of one token's q/k/v after their products: the biases, Qwen3's head norms and
// RoPE, on the heads `q_heads` of q and `kv_heads` of k and v.
void CpuModel::rank_qkv_heads(const LayerWeights& w, ShardRange q_heads, ShardRange kv_heads,
                              int32_t position, float* q, float* k, float* v) {
  const int32_t d = model_.head_dim;
  const ShardRange q_rows = head_elements(q_heads, d);
  const ShardRange kv_rows = head_elements(kv_heads, d);
  if (model_.qkv_bias) {
    add_bias(w.q_bias, q_rows, q), add_bias(w.k_bias, kv_rows, k), add_bias(w.v_bias, kv_rows, v);
  }
  if (model_.qk_norm) {
    // Qwen3: RMSNorm over each head's head_dim, one weight shared by the heads, before RoPE.
    for (int32_t head = q_heads.begin; head < q_heads.end(); ++head) {
      rms_norm(q + head * d, w.q_norm, d, model_.rms_eps, q + head * d);
    }
    for (int32_t head = kv_heads.begin; head < kv_heads.end(); ++head) {
      rms_norm(k + head * d, w.k_norm, d, model_.rms_eps, k + head * d);
    }
  }
  for (int32_t head = q_heads.begin; head < q_heads.end(); ++head) {
    apply_rope(rope_, position, q + head * d);
  }
  for (int32_t head = kv_heads.begin; head < kv_heads.end(); ++head) {
    apply_rope(rope_, position, k + head * d);
  }
}

// Each rank attends with its query heads (their kv heads are its own) and multiplies its slice of
// the attention output by its columns of o (row-parallel); the all-reduce sums the partials.
void CpuModel::attention_layer_out(int32_t layer, const ForwardTokens& tokens,
                                   std::span<const int32_t> table) {
  const LayerWeights& w = weights_.layers[layer];
  const int32_t h = model_.hidden_size;
  const int32_t count = static_cast<int32_t>(tokens.input_ids.size());
  const int32_t q_size = model_.q_size();
  for (int32_t rank = 0; rank < tp_.degree(); ++rank) {
    const ShardRange heads = tp_.query_heads(rank);
    for_each_tile(count, token_tile_, [&](int32_t first, int32_t n) {
      std::array<const float*, kTokenTile> x{};
      std::array<float*, kTokenTile> y{};
      attend_tile(layer, tokens, table, first, n, heads);
      for (int32_t i = 0; i < n; ++i) {
        const int32_t t = first + i;
        float* out = attn_out_.data() + static_cast<size_t>(i) * q_size;
        if (capture_) {  // TP 1 (capture_activations): the one rank computed every head
          std::copy(out, out + q_size,
                    attn_capture_->values.begin() + static_cast<ptrdiff_t>(t) * q_size);
        }
        x[i] = out;
        y[i] = partial_at(rank, t, count);
      }
      const size_t tile = static_cast<size_t>(n);
      products(w.wo.data(), q_size, ShardRange{0, h}, head_elements(heads, model_.head_dim),
               std::span(x.data(), tile), std::span(y.data(), tile));
    });
  }
  reduce_into_residual(count);
}

// Causal attention of query head `head` of token `token` over positions 0..position of its own
// request, keys walked in ascending position: max, then exp and sum, then the weighted value sum
// — one fixed order. `scores` holds keys_at(position) floats; `out` is the token's q-sized row.
// An AVX2 clone as products_serial's: the same operations, so the same bits. Defined before its
// caller, attend_tile: clang refuses a function made multiversioned after its first use.
[[gnu::target_clones("avx2", "default")]] void CpuModel::attend_head(
    int32_t layer, int32_t token, int32_t position, std::span<const int32_t> table_row,
    int32_t head, float* scores, float* out) {
  const int32_t d = model_.head_dim;
  const int32_t kv_head = head / (model_.query_heads_count / model_.kv_heads_count);
  const float scale = 1.0f / std::sqrt(static_cast<float>(d));
  const int32_t keys = keys_at(position);
  const float* q = q_.data() + static_cast<size_t>(token) * model_.q_size() + head * d;
  float max_score = -INFINITY;
  for (int32_t p = 0; p < keys; ++p) {
    const float* k = kv_at(slot_for(table_row, limits_.page_size, p), layer, 0) + kv_head * d;
    scores[p] = dot(q, k, d) * scale;
    max_score = std::max(max_score, scores[p]);
  }
  float sum = 0.0f;
  for (int32_t p = 0; p < keys; ++p) {
    scores[p] = std::exp(scores[p] - max_score);
    sum += scores[p];
  }
  float* o = out + head * d;
  std::fill(o, o + d, 0.0f);
  for (int32_t p = 0; p < keys; ++p) {
    const float* v = kv_at(slot_for(table_row, limits_.page_size, p), layer, 1) + kv_head * d;
    const float weight = scores[p] / sum;
    for (int32_t i = 0; i < d; ++i) o[i] += weight * v[i];
  }
}

// attn_out_'s rows [0, n): tokens first..first + n - 1 attending with `heads`, each (token, head)
// pair one attend_head, the pairs in contiguous runs over up to cores() threads when the tile's
// attention is big enough to pay for them; each pair is computed on one thread in its one order,
// so threads change no bit.
void CpuModel::attend_tile(int32_t layer, const ForwardTokens& tokens,
                           std::span<const int32_t> table, int32_t first, int32_t n,
                           ShardRange heads) {
  const int32_t width = limits_.table_width();
  const int64_t pairs = int64_t{n} * heads.count;
  int64_t keys = 0;
  for (int32_t t = first; t < first + n; ++t) keys += keys_at(tokens.positions[t]);
  const int64_t work = keys * heads.count * 2 * model_.head_dim;  // q·k and the weighted v
  const auto run = [&](int64_t begin, int64_t end, int32_t thread) {
    float* scores = scores_.data() + static_cast<size_t>(thread) * rope_.positions_count;
    for (int64_t pair = begin; pair < end; ++pair) {
      const auto i = static_cast<int32_t>(pair / heads.count);
      const int32_t head = heads.begin + static_cast<int32_t>(pair % heads.count);
      const int32_t t = first + i;
      const std::span<const int32_t> table_row =
          table.subspan(static_cast<size_t>(tokens.pool_rows[t]) * width, width);
      attend_head(layer, t, tokens.positions[t], table_row, head, scores,
                  attn_out_.data() + static_cast<size_t>(i) * model_.q_size());
    }
  };
  in_thread_runs(pairs, threads_for(work, pairs), run);
}

// `position` within the RoPE table (a position past it takes the table's last).
int32_t CpuModel::rope_position(int32_t position) const {
  return std::min(position, rope_.positions_count - 1);
}

// Keys a token at `position` attends to: positions 0..position, within the RoPE table.
int32_t CpuModel::keys_at(int32_t position) const { return rope_position(position) + 1; }

// Column-parallel gate/up and row-parallel down: each rank computes its ffn columns of the SwiGLU
// and their partial down projection; the all-reduce sums the partials.
void CpuModel::ffn_layer(int32_t layer, int32_t tokens_count) {
  const LayerWeights& w = weights_.layers[layer];
  const int32_t h = model_.hidden_size;
  const int32_t f = model_.ffn_size;
  for (int32_t t = 0; t < tokens_count; ++t) {
    const size_t offset = static_cast<size_t>(t) * h;
    rms_norm(residual_.data() + offset, w.ffn_norm, h, model_.rms_eps, normed_.data() + offset);
  }
  for (int32_t rank = 0; rank < tp_.degree(); ++rank) {
    const ShardRange columns = tp_.ffn(rank);
    for_each_tile(tokens_count, token_tile_, [&](int32_t first, int32_t n) {
      std::array<const float*, kTokenTile> x{}, activated{};
      std::array<float*, kTokenTile> gate{}, up{}, partial{};
      for (int32_t i = 0; i < n; ++i) {
        x[i] = normed_.data() + static_cast<size_t>(first + i) * h;
        gate[i] = gate_.data() + static_cast<size_t>(i) * f;
        up[i] = up_.data() + static_cast<size_t>(i) * f;
        activated[i] = gate[i];
        partial[i] = partial_at(rank, first + i, tokens_count);
      }
      const size_t tile = static_cast<size_t>(n);
      const std::span<const float* const> xs(x.data(), tile);
      products(w.w_gate.data(), h, columns, ShardRange{0, h}, xs, std::span(gate.data(), tile));
      products(w.w_up.data(), h, columns, ShardRange{0, h}, xs, std::span(up.data(), tile));
      for (int32_t i = 0; i < n; ++i) {
        for (int32_t c = columns.begin; c < columns.end(); ++c) {
          gate[i][c] = ops::swiglu(gate[i][c], up[i][c]);
        }
      }
      products(w.w_down.data(), f, ShardRange{0, h}, columns, std::span(activated.data(), tile),
               std::span(partial.data(), tile));
    });
  }
  reduce_into_residual(tokens_count);
}

}  // namespace ls

namespace ls {

// A Mamba2 layer (ModelConfig::mamba has the arithmetic): every token in buffer order, each a
// single-step update of its request's working state. A row's tokens are contiguous and ascending,
// so a prefill chunk runs exactly the steps decode would: one fixed sequential order, the same bits
// however the prompt was chunked or batched. The out projections meet in the all-reduce as the
// attention layer's do (TP 1 only: refused at construction otherwise).
void CpuModel::mamba_layer(int32_t layer, const ForwardTokens& tokens) {
  const LayerWeights& w = weights_.layers[static_cast<size_t>(layer)];
  const int32_t h = model_.hidden_size;
  const int32_t count = static_cast<int32_t>(tokens.input_ids.size());
  LS_ASSERT(tokens.mamba_slots.size() == static_cast<size_t>(count), "{} mamba slots for {} tokens",
            tokens.mamba_slots.size(), count);
  const bool verifying = !tokens.mamba_verify_slots.empty();
  LS_ASSERT(!verifying || tokens.mamba_verify_slots.size() == static_cast<size_t>(count),
            "{} verify-state slots for {} tokens", tokens.mamba_verify_slots.size(), count);
  for (int32_t t = 0; t < count; ++t) {
    float* normed = normed_.data() + static_cast<size_t>(t) * h;
    rms_norm(residual_.data() + static_cast<size_t>(t) * h, w.attn_norm, h, model_.rms_eps, normed);
    const int32_t verify_slot = verifying ? tokens.mamba_verify_slots[t] : -1;
    float* state = verify_slot < 0
                       ? mamba_state_at(tokens.mamba_slots[t], layer)
                       : verified_token_state(tokens.mamba_slots[t], verify_slot, layer);
    mamba_token(w, state, normed, partial_at(0, t, count));
  }
  reduce_into_residual(count);
}

// A verified decode row's token j (ForwardTokens::mamba_verify_slots): its verify-state slot,
// holding the state the token starts from — the working slot's for j = 0, else the previous
// token's verify state — which the token then updates in place. The same single-step updates in
// the same order as W tokens run on the working slot: only where the results land differs.
float* CpuModel::verified_token_state(int32_t working, int32_t verify_slot, int32_t layer) {
  const int32_t token = (verify_slot - limits_.mamba_slots_count) % limits_.verify_width;
  const float* from = mamba_state_at(token == 0 ? working : verify_slot - 1, layer);
  float* state = mamba_state_at(verify_slot, layer);
  std::copy(from, from + mamba_layer_floats_, state);
  return state;
}

// One token through in_proj, the mixer (core/mamba_mixer.h, updating `state` in place) and
// out_proj, written to `out` [hidden].
void CpuModel::mamba_token(const LayerWeights& w, float* state, const float* normed, float* out) {
  const MambaConfig& m = model_.mamba;
  const int32_t h = model_.hidden_size;
  matvec_rows(w.in_proj, normed, h, ShardRange{0, m.in_proj_size()}, proj_.data());
  mamba_mixer_token(m, w, model_.rms_eps, proj_.data(), state, mamba_scratch_, mamba_y_.data());
  matvec_rows(w.out_proj, mamba_y_.data(), m.inner_size(), ShardRange{0, h}, out);
}

}  // namespace ls
