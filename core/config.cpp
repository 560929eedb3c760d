#include "core/config.h"

#include "core/check.h"

#include <fmt/ranges.h>

#include <cmath>

namespace ls {

std::string_view to_string(ModelFamily family) {
  switch (family) {
    case ModelFamily::kLlama: return "llama";
    case ModelFamily::kQwen2: return "qwen2";
    case ModelFamily::kQwen3: return "qwen3";
    case ModelFamily::kMistral: return "mistral";
    case ModelFamily::kBamba: return "bamba";
  }
  return "unknown";
}

std::string_view architecture_name(ModelFamily family) {
  switch (family) {
    case ModelFamily::kLlama: return "LlamaForCausalLM";
    case ModelFamily::kQwen2: return "Qwen2ForCausalLM";
    case ModelFamily::kQwen3: return "Qwen3ForCausalLM";
    case ModelFamily::kMistral: return "MistralForCausalLM";
    case ModelFamily::kBamba: return "BambaForCausalLM";
  }
  return "unknown";
}

std::string_view to_string(RopeType type) {
  switch (type) {
    case RopeType::kDefault: return "default";
    case RopeType::kLinear: return "linear";
    case RopeType::kLlama3: return "llama3";
  }
  return "unknown";
}

std::string_view to_string(LayerKind kind) {
  switch (kind) {
    case LayerKind::kAttention: return "attention";
    case LayerKind::kMamba2: return "mamba2";
  }
  return "unknown";
}

int32_t ModelConfig::mamba_layers_count() const {
  int32_t count = 0;
  for (const LayerKind kind : layer_kinds) count += kind == LayerKind::kMamba2 ? 1 : 0;
  return count;
}

int64_t ModelConfig::parameters_count() const {
  const int64_t h = hidden_size;
  const int64_t biases = qkv_bias ? int64_t{q_size()} + 2 * kv_size() : 0;
  const int64_t head_norms = qk_norm ? 2 * int64_t{head_dim} : 0;
  const int64_t attention = h * q_size() + 2 * h * kv_size() + int64_t{q_size()} * h + biases +
                            head_norms;
  const MambaConfig& m = mamba;
  const int64_t mixer = h * m.in_proj_size() + m.conv_state_floats() +
                        (m.conv_bias ? m.conv_dim() : 0) + 3 * int64_t{m.heads_count} +
                        m.inner_size() + int64_t{m.inner_size()} * h;
  const int64_t common = 2 * h + 3 * h * ffn_size;
  const int64_t mambas = mamba_layers_count();
  const int64_t per_layers = common * layers_count + attention * (layers_count - mambas) +
                             mixer * mambas;
  const int64_t embeddings = int64_t{vocab_size} * h * (tied_embeddings ? 1 : 2);
  return embeddings + h + per_layers;
}

namespace {

// The layer-kind table and the Mamba shape: a table for every layer when the family is hybrid,
// none otherwise; the mixer's sizes in range and consistent.
void validate_layer_kinds(const ModelConfig& c) {
  const std::string& name = c.name;
  if (c.family != ModelFamily::kBamba) {
    LS_REQUIRE(c.layer_kinds.empty(), "model config '{}': family {} has no layer-kind table", name,
               to_string(c.family));
    return;
  }
  LS_REQUIRE(static_cast<int64_t>(c.layer_kinds.size()) == c.layers_count,
             "model config '{}': the layer-kind table has {} entries for layers_count {}", name,
             c.layer_kinds.size(), c.layers_count);
  for (size_t i = 0; i < c.layer_kinds.size(); ++i) {
    LS_REQUIRE(static_cast<uint8_t>(c.layer_kinds[i]) <= static_cast<uint8_t>(LayerKind::kMamba2),
               "model config '{}': layer {} has an unknown kind {}", name, i,
               static_cast<int>(c.layer_kinds[i]));
  }
  if (!c.has_recurrent_state()) return;
  const MambaConfig& m = c.mamba;
  auto in_range = [&](int64_t value, int64_t max, const char* field) {
    LS_REQUIRE(value > 0 && value <= max, "model config '{}': mamba {} must be in [1, {}], got {}",
               name, field, max, value);
  };
  in_range(m.heads_count, 1 << 12, "heads_count");
  in_range(m.head_dim, 1 << 12, "head_dim");
  in_range(m.groups_count, 1 << 12, "groups_count");
  in_range(m.state_size, 1 << 12, "state_size");
  in_range(m.conv_kernel, 64, "conv_kernel");
  in_range(m.inner_size(), 1 << 18, "inner size (heads_count · head_dim)");
  LS_REQUIRE(m.heads_count % m.groups_count == 0,
             "model config '{}': mamba heads_count {} is not a multiple of groups_count {}", name,
             m.heads_count, m.groups_count);
  LS_REQUIRE(m.dt_min >= 0.0f && m.dt_min <= m.dt_max,
             "model config '{}': mamba time-step limit [{}, {}] must satisfy 0 <= min <= max",
             name, m.dt_min, m.dt_max);
}

}  // namespace

void ModelConfig::validate() const {
  // Upper bounds far above any real Llama keep every size product inside int64 and stop a
  // corrupt header from asking for absurd allocations.
  auto in_range = [&](int64_t value, int64_t max, const char* field) {
    LS_REQUIRE(value > 0 && value <= max, "model config '{}': {} must be in [1, {}], got {}", name,
               field, max, value);
  };
  in_range(hidden_size, 1 << 17, "hidden_size");
  in_range(layers_count, 1 << 12, "layers_count");
  in_range(query_heads_count, 1 << 12, "query_heads_count");
  in_range(kv_heads_count, 1 << 12, "kv_heads_count");
  in_range(head_dim, 1 << 12, "head_dim");
  in_range(ffn_size, 1 << 20, "ffn_size");
  in_range(vocab_size, 1 << 22, "vocab_size");
  LS_REQUIRE(head_dim % 2 == 0, "model config '{}': head_dim must be even for RoPE, got {}", name,
             head_dim);
  LS_REQUIRE(query_heads_count % kv_heads_count == 0,
             "model config '{}': query_heads_count {} is not a multiple of kv_heads_count {}",
             name, query_heads_count, kv_heads_count);
  LS_REQUIRE(rope_theta > 0.0f, "model config '{}': rope_theta must be > 0, got {}", name,
             rope_theta);
  LS_REQUIRE(rms_eps > 0.0f, "model config '{}': rms_eps must be > 0, got {}", name, rms_eps);
  LS_REQUIRE(static_cast<uint8_t>(family) <= static_cast<uint8_t>(ModelFamily::kBamba),
             "model config '{}': unknown family {}", name, static_cast<int>(family));
  LS_REQUIRE(static_cast<uint8_t>(rope_type) <= static_cast<uint8_t>(RopeType::kLlama3),
             "model config '{}': unknown rope type {}", name, static_cast<int>(rope_type));
  LS_REQUIRE(rope_type == RopeType::kDefault || (rope_factor > 0.0f && std::isfinite(rope_factor)),
             "model config '{}': rope factor must be > 0, got {}", name, rope_factor);
  if (rope_type == RopeType::kLlama3) {
    LS_REQUIRE(rope_low_freq_factor > 0.0f && rope_high_freq_factor > rope_low_freq_factor,
               "model config '{}': llama3 rope needs 0 < low_freq_factor < high_freq_factor, got "
               "{} and {}", name, rope_low_freq_factor, rope_high_freq_factor);
    LS_REQUIRE(rope_original_max_positions > 0,
               "model config '{}': llama3 rope original_max_position_embeddings must be > 0, got {}",
               name, rope_original_max_positions);
  }
  LS_REQUIRE(partial_rotary_dim == 0 || (partial_rotary_dim > 0 && partial_rotary_dim < head_dim &&
                                          partial_rotary_dim % 2 == 0),
             "model config '{}': partial_rotary_dim must be 0 (the whole head) or even and in "
             "[2, head_dim = {}), got {}", name, head_dim, partial_rotary_dim);
  LS_REQUIRE(max_positions >= 0, "model config '{}': max_positions must be >= 0, got {}", name,
             max_positions);
  LS_REQUIRE(sliding_window >= 0, "model config '{}': sliding_window must be >= 0, got {}", name,
             sliding_window);
  validate_layer_kinds(*this);
}

void check_context_length(const ModelConfig& model, int32_t context_length,
                          bool allow_beyond_max_positions) {
  // A window at least as long as the context never drops a key: attention is unchanged.
  LS_REQUIRE(model.sliding_window == 0 || context_length <= model.sliding_window,
             "model '{}': sliding_window = {} is shorter than the context length {}; sliding-window "
             "attention is not implemented (use --context-length {} or less)", model.name,
             model.sliding_window, context_length, model.sliding_window);
  LS_REQUIRE(model.max_positions == 0 || context_length <= model.max_positions ||
                 allow_beyond_max_positions,
             "model '{}': context length {} exceeds max_position_embeddings = {} (pass "
             "--context-beyond-max-positions to run it anyway)", model.name, context_length,
             model.max_positions);
}

ModelConfig model_config_named(std::string_view name) {
  ModelConfig c;
  c.name = std::string(name);
  if (name == "tiny") {
    c.hidden_size = 64, c.layers_count = 2, c.query_heads_count = 4, c.kv_heads_count = 2;
    c.head_dim = 16, c.ffn_size = 128, c.vocab_size = 512, c.rope_theta = 10000.0f;
    c.rms_eps = 1e-5f, c.tied_embeddings = false;
  } else if (name == "tiny-hybrid") {
    // A CI-sized BambaForCausalLM: Mamba2, attention, Mamba2 (the simulator's and the properties'
    // hybrid). BambaConfig's forced partial rotary (0.5 of head_dim 16); a time-step clamp that
    // bites on both sides; no max_position_embeddings bound (a named random shape).
    c.family = ModelFamily::kBamba;
    c.hidden_size = 64, c.layers_count = 3, c.query_heads_count = 4, c.kv_heads_count = 2;
    c.head_dim = 16, c.ffn_size = 128, c.vocab_size = 512, c.rope_theta = 10000.0f;
    c.rms_eps = 1e-5f, c.tied_embeddings = false, c.partial_rotary_dim = 8;
    c.layer_kinds = {LayerKind::kMamba2, LayerKind::kAttention, LayerKind::kMamba2};
    c.mamba = MambaConfig{.heads_count = 4, .head_dim = 16, .groups_count = 2, .state_size = 8,
                          .conv_kernel = 4, .conv_bias = true, .dt_min = 0.05f, .dt_max = 2.0f};
  } else if (name == "llama-1b") {
    c.hidden_size = 2048, c.layers_count = 16, c.query_heads_count = 32, c.kv_heads_count = 8;
    c.head_dim = 64, c.ffn_size = 8192, c.vocab_size = 128256, c.rope_theta = 500000.0f;
    c.rms_eps = 1e-5f, c.tied_embeddings = true;
  } else if (name == "llama-8b") {
    c.hidden_size = 4096, c.layers_count = 32, c.query_heads_count = 32, c.kv_heads_count = 8;
    c.head_dim = 128, c.ffn_size = 14336, c.vocab_size = 128256, c.rope_theta = 500000.0f;
    c.rms_eps = 1e-5f, c.tied_embeddings = false;
  } else if (name == "qwen3-0.6b") {
    c.family = ModelFamily::kQwen3, c.qk_norm = true;
    c.hidden_size = 1024, c.layers_count = 28, c.query_heads_count = 16, c.kv_heads_count = 8;
    c.head_dim = 128, c.ffn_size = 3072, c.vocab_size = 151936, c.rope_theta = 1000000.0f;
    c.rms_eps = 1e-6f, c.tied_embeddings = true;
  } else if (name == "qwen2.5-7b") {
    c.family = ModelFamily::kQwen2, c.qkv_bias = true;
    c.hidden_size = 3584, c.layers_count = 28, c.query_heads_count = 28, c.kv_heads_count = 4;
    c.head_dim = 128, c.ffn_size = 18944, c.vocab_size = 152064, c.rope_theta = 1000000.0f;
    c.rms_eps = 1e-6f, c.tied_embeddings = false;
  } else {
    throw Error(fmt::format("unknown model shape '{}'; known shapes: {}", name,
                            fmt::join(model_config_names(), ", ")));
  }
  return c;
}

std::vector<std::string> model_config_names() {
  return {"tiny", "tiny-hybrid", "llama-1b", "llama-8b", "qwen3-0.6b", "qwen2.5-7b"};
}

}  // namespace ls
