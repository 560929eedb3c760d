#include "core/cpu_model.h"

#include "core/check.h"
#include "core/host_memory.h"
#include "core/ops/layer_math.h"
#include "core/step_plan.h"

#include <cmath>

namespace ls {

namespace {

// One fixed summation order (core/ops/layer_math.h): the result never depends on the batch.
float dot(const float* a, const float* b, int32_t n) { return ops::dot_fixed_order(a, b, n); }

// y[o] = W[o, :] · x for a row-major [out, in] matrix.
void matvec(const std::vector<float>& w, const float* x, int32_t out, int32_t in, float* y) {
  for (int32_t o = 0; o < out; ++o) y[o] = dot(w.data() + static_cast<size_t>(o) * in, x, in);
}

void rms_norm(const float* x, const std::vector<float>& weight, int32_t n, float eps, float* y) {
  ops::rms_norm_row(x, weight.data(), n, eps, y);
}

void add_bias(const std::vector<float>& bias, float* y) {
  for (size_t i = 0; i < bias.size(); ++i) y[i] += bias[i];
}

}  // namespace

CpuModel::CpuModel(const ModelWeights& weights, const ExecutorConfig& config)
    : weights_(weights),
      model_(weights.config),
      limits_(config),
      rope_(build_rope_table(model_.rope(), model_.head_dim,
                             config.table_width() * config.page_size)) {
  weights.validate();
  config.validate();
  check_context_length(model_, config.context_length, /*allow_beyond_max_positions=*/true);
  kv_slots_count_ = int64_t{config.pages_count} * config.page_size;
  const uint64_t slot_bytes = uint64_t{sizeof(float)} * model_.layers_count * 2 * model_.kv_size();
  require_host_memory(slot_bytes * static_cast<uint64_t>(kv_slots_count_ +
                                                         int64_t{config.host_pages_count} * config.page_size),
                      fmt::format("the CPU KV pools ({} device + {} host pages of {} tokens)",
                                  config.pages_count, config.host_pages_count, config.page_size));
  const size_t tokens = static_cast<size_t>(config.step_tokens_max());
  kv_.assign(static_cast<size_t>(kv_slots_count_) * model_.layers_count * 2 * model_.kv_size(),
             0.0f);
  host_kv_.assign(static_cast<size_t>(config.host_pages_count) * config.page_size *
                      model_.layers_count * 2 * model_.kv_size(),
                  0.0f);
  residual_.resize(tokens * model_.hidden_size);
  normed_.resize(tokens * model_.hidden_size);
  q_.resize(tokens * model_.q_size());
  attn_out_.resize(static_cast<size_t>(model_.q_size()));
  gate_.resize(static_cast<size_t>(model_.ffn_size));
  up_.resize(static_cast<size_t>(model_.ffn_size));
  scores_.resize(static_cast<size_t>(rope_.positions_count));
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
}

void CpuModel::forward(const ForwardTokens& tokens, std::span<const int32_t> table,
                       std::span<float> logits) {
  const int32_t count = static_cast<int32_t>(tokens.input_ids.size());
  const int32_t h = model_.hidden_size;
  const int32_t v = model_.vocab_size;
  LS_ASSERT(count <= limits_.step_tokens_max(), "{} tokens", count);
  LS_ASSERT(logits.size() >= tokens.logits_token_index.size() * v, "logits buffer too small");
  for (int32_t t = 0; t < count; ++t) {
    const float* row = weights_.embedding.data() + static_cast<size_t>(tokens.input_ids[t]) * h;
    std::copy(row, row + h, residual_.data() + static_cast<size_t>(t) * h);
  }
  for (int32_t layer = 0; layer < model_.layers_count; ++layer) {
    // All K/V of the layer are written before any token attends, so a token inside a prefill
    // chunk sees the earlier tokens of its own chunk exactly as a decode step would.
    attention_layer_qkv(layer, tokens);
    attention_layer_out(layer, tokens, table);
    ffn_layer(layer, count);
  }
  const std::span<const float> head = weights_.lm_head_view();
  std::vector<float>& normed = normed_;
  for (size_t r = 0; r < tokens.logits_token_index.size(); ++r) {
    const int32_t t = tokens.logits_token_index[r];
    rms_norm(residual_.data() + static_cast<size_t>(t) * h, weights_.final_norm, h, model_.rms_eps,
             normed.data());
    for (int32_t o = 0; o < v; ++o) {
      logits[r * v + o] = dot(head.data() + static_cast<size_t>(o) * h, normed.data(), h);
    }
  }
}

void CpuModel::attention_layer_qkv(int32_t layer, const ForwardTokens& tokens) {
  const LayerWeights& w = weights_.layers[layer];
  const int32_t h = model_.hidden_size;
  const int32_t d = model_.head_dim;
  const int32_t count = static_cast<int32_t>(tokens.input_ids.size());
  for (int32_t t = 0; t < count; ++t) {
    float* normed = normed_.data() + static_cast<size_t>(t) * h;
    rms_norm(residual_.data() + static_cast<size_t>(t) * h, w.attn_norm, h, model_.rms_eps, normed);
    float* q = q_.data() + static_cast<size_t>(t) * model_.q_size();
    float* k = kv_at(tokens.slots[t], layer, 0);
    float* v = kv_at(tokens.slots[t], layer, 1);
    matvec(w.wq, normed, model_.q_size(), h, q);
    matvec(w.wk, normed, model_.kv_size(), h, k);
    matvec(w.wv, normed, model_.kv_size(), h, v);
    if (model_.qkv_bias) {
      add_bias(w.q_bias, q), add_bias(w.k_bias, k), add_bias(w.v_bias, v);
    }
    if (model_.qk_norm) {
      // Qwen3: RMSNorm over each head's head_dim, one weight shared by the heads, before RoPE.
      for (int32_t head = 0; head < model_.query_heads_count; ++head) {
        rms_norm(q + head * d, w.q_norm, d, model_.rms_eps, q + head * d);
      }
      for (int32_t head = 0; head < model_.kv_heads_count; ++head) {
        rms_norm(k + head * d, w.k_norm, d, model_.rms_eps, k + head * d);
      }
    }
    const int32_t position = std::min(tokens.positions[t], rope_.positions_count - 1);
    for (int32_t head = 0; head < model_.query_heads_count; ++head) {
      apply_rope(rope_, position, q + head * d);
    }
    for (int32_t head = 0; head < model_.kv_heads_count; ++head) {
      apply_rope(rope_, position, k + head * d);
    }
  }
}

void CpuModel::attention_layer_out(int32_t layer, const ForwardTokens& tokens,
                                   std::span<const int32_t> table) {
  const LayerWeights& w = weights_.layers[layer];
  const int32_t h = model_.hidden_size;
  const int32_t width = limits_.table_width();
  const int32_t count = static_cast<int32_t>(tokens.input_ids.size());
  for (int32_t t = 0; t < count; ++t) {
    const std::span<const int32_t> table_row =
        table.subspan(static_cast<size_t>(tokens.pool_rows[t]) * width, width);
    attend(layer, t, tokens.positions[t], table_row, attn_out_.data());
    float* residual = residual_.data() + static_cast<size_t>(t) * h;
    float* projected = normed_.data() + static_cast<size_t>(t) * h;
    matvec(w.wo, attn_out_.data(), h, model_.q_size(), projected);
    for (int32_t i = 0; i < h; ++i) residual[i] += projected[i];
  }
}

// Causal attention for one token over positions 0..position of its own request, keys walked in
// ascending position: max, then exp and sum, then the weighted value sum — one fixed order.
void CpuModel::attend(int32_t layer, int32_t token, int32_t position,
                      std::span<const int32_t> table_row, float* out) {
  const int32_t d = model_.head_dim;
  const int32_t group = model_.query_heads_count / model_.kv_heads_count;
  const float scale = 1.0f / std::sqrt(static_cast<float>(d));
  const int32_t keys = std::min(position, rope_.positions_count - 1) + 1;
  const float* q_token = q_.data() + static_cast<size_t>(token) * model_.q_size();
  for (int32_t head = 0; head < model_.query_heads_count; ++head) {
    const int32_t kv_head = head / group;
    const float* q = q_token + head * d;
    float max_score = -INFINITY;
    for (int32_t p = 0; p < keys; ++p) {
      const float* k = kv_at(slot_for(table_row, limits_.page_size, p), layer, 0) + kv_head * d;
      scores_[p] = dot(q, k, d) * scale;
      max_score = std::max(max_score, scores_[p]);
    }
    float sum = 0.0f;
    for (int32_t p = 0; p < keys; ++p) {
      scores_[p] = std::exp(scores_[p] - max_score);
      sum += scores_[p];
    }
    float* o = out + head * d;
    std::fill(o, o + d, 0.0f);
    for (int32_t p = 0; p < keys; ++p) {
      const float* v = kv_at(slot_for(table_row, limits_.page_size, p), layer, 1) + kv_head * d;
      const float weight = scores_[p] / sum;
      for (int32_t i = 0; i < d; ++i) o[i] += weight * v[i];
    }
  }
}

void CpuModel::ffn_layer(int32_t layer, int32_t tokens_count) {
  const LayerWeights& w = weights_.layers[layer];
  const int32_t h = model_.hidden_size;
  const int32_t f = model_.ffn_size;
  for (int32_t t = 0; t < tokens_count; ++t) {
    float* residual = residual_.data() + static_cast<size_t>(t) * h;
    float* normed = normed_.data() + static_cast<size_t>(t) * h;
    rms_norm(residual, w.ffn_norm, h, model_.rms_eps, normed);
    matvec(w.w_gate, normed, f, h, gate_.data());
    matvec(w.w_up, normed, f, h, up_.data());
    for (int32_t i = 0; i < f; ++i) gate_[i] = ops::swiglu(gate_[i], up_[i]);
    matvec(w.w_down, gate_.data(), h, f, normed);
    for (int32_t i = 0; i < h; ++i) residual[i] += normed[i];
  }
}

}  // namespace ls
