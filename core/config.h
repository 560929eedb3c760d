// Model shape and executor limits. Every buffer in lockstep is sized from these once, at start-up
// (DESIGN.md "Limits"); input that exceeds one is rejected with an error naming the limit.
#pragma once

#include "core/limits.h"

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace ls {

// The checkpoint families lockstep computes exactly as Hugging Face does. Each is a Llama-shaped
// decoder; the differences are data in ModelConfig (qkv_bias, qk_norm, the layer-kind table),
// decided once at load.
enum class ModelFamily : uint8_t {
  kLlama = 0,    // LlamaForCausalLM (Llama 2, 3.x)
  kQwen2 = 1,    // Qwen2ForCausalLM (Qwen2.5): q/k/v projection biases
  kQwen3 = 2,    // Qwen3ForCausalLM: per-head RMSNorm on q and k before RoPE
  kMistral = 3,  // MistralForCausalLM
  kBamba = 4,    // BambaForCausalLM: Mamba2 mixer layers, attention at attn_layer_indices
};
std::string_view to_string(ModelFamily family);
// The HF architecture name ("LlamaForCausalLM", ...).
std::string_view architecture_name(ModelFamily family);

// How the RoPE inverse frequencies are derived from theta (transformers' rope_type).
enum class RopeType : uint8_t {
  kDefault = 0,  // inv_freq_i = theta^(−2i/d)
  kLinear = 1,   // inv_freq / factor
  kLlama3 = 2,   // Llama 3.1's band-wise scaling (factor, low/high frequency factors, original max)
};
std::string_view to_string(RopeType type);

// What mixes the tokens in one decoder layer (the FFN after it is the same SwiGLU for both).
enum class LayerKind : uint8_t {
  kAttention = 0,  // GQA attention over the paged KV
  kMamba2 = 1,     // Mamba2 mixer: a per-request recurrent state (conv window + SSM state)
};
std::string_view to_string(LayerKind kind);

// The Mamba2 mixer's shape (transformers' BambaMixer, its torch_forward path):
//   in_proj: hidden → [gate (inner) | xBC (conv_dim) | dt (heads)], inner = heads · head_dim,
//   conv_dim = inner + 2 · groups · state_size; a causal depthwise conv1d of `conv_kernel` taps
//   (bias when conv_bias) then SiLU over xBC; split into x (inner), B and C (groups · state each);
//   per head h (group g = h / (heads / groups)): dt = clamp(softplus(dt + dt_bias), dt_min,
//   dt_max), state = state · exp(dt · −exp(A_log)) + dt · B_g · x, y = state · C_g + D · x;
//   then RMSNorm(y · silu(gate)) over all of inner, and out_proj: inner → hidden.
struct MambaConfig {
  int32_t heads_count = 0;
  int32_t head_dim = 0;
  int32_t groups_count = 0;
  int32_t state_size = 0;
  int32_t conv_kernel = 0;
  bool conv_bias = true;
  float dt_min = 0.0f;        // time_step_limit[0]
  float dt_max = 0.0f;        // time_step_limit[1]

  int32_t inner_size() const { return heads_count * head_dim; }
  int32_t conv_dim() const { return inner_size() + 2 * groups_count * state_size; }
  int32_t in_proj_size() const { return inner_size() + conv_dim() + heads_count; }
  // One request's recurrent state in one Mamba layer: the conv window [conv_dim, conv_kernel]
  // (the last conv_kernel xBC inputs, oldest first, as transformers keeps it) and the SSM state
  // [heads, head_dim, state_size].
  int64_t conv_state_floats() const { return int64_t{conv_dim()} * conv_kernel; }
  int64_t ssm_state_floats() const { return int64_t{heads_count} * head_dim * state_size; }
  bool operator==(const MambaConfig&) const = default;
};

struct RopeConfig {
  RopeType type = RopeType::kDefault;
  float theta = 10000.0f;
  float factor = 1.0f;                     // linear, llama3
  float low_freq_factor = 1.0f;            // llama3
  float high_freq_factor = 4.0f;           // llama3
  int32_t original_max_positions = 8192;   // llama3
  bool operator==(const RopeConfig&) const = default;
};

// A decoder: RMSNorm, GQA attention with RoPE (HF rotate-half convention), SwiGLU; per family,
// q/k/v biases and q/k head norms.
struct ModelConfig {
  std::string name;
  ModelFamily family = ModelFamily::kLlama;
  int32_t hidden_size = 0;
  int32_t layers_count = 0;
  int32_t query_heads_count = 0;
  int32_t kv_heads_count = 0;
  int32_t head_dim = 0;
  int32_t ffn_size = 0;
  int32_t vocab_size = 0;
  float rope_theta = 10000.0f;  // RoPE base (rope_parameters.rope_theta)
  float rms_eps = 1e-5f;
  bool tied_embeddings = false;
  // RoPE frequency scaling. Its theta is rope_theta above (one value, never two).
  RopeType rope_type = RopeType::kDefault;
  float rope_factor = 1.0f;
  float rope_low_freq_factor = 1.0f;
  float rope_high_freq_factor = 4.0f;
  int32_t rope_original_max_positions = 8192;
  // Partial rotary (Bamba's partial_rotary_factor): RoPE rotates only the first
  // partial_rotary_dim dims of each q/k head (rotate-half within them, frequencies over that
  // dim) and passes the rest through. 0 = the whole head, the one spelling of "full rotary".
  int32_t partial_rotary_dim = 0;
  bool qkv_bias = false;  // q/k/v projections carry biases (Qwen2)
  bool qk_norm = false;   // per-head RMSNorm on q and k before RoPE (Qwen3)
  // max_position_embeddings: the context length the checkpoint was made for; 0 = no bound (the
  // named random shapes). A longer context needs an explicit override (check_context_length).
  int32_t max_positions = 0;
  // A sliding attention window over all layers (Mistral's sliding_window, Qwen's with
  // use_sliding_window); 0 = none. Not implemented: a context longer than it is refused.
  int32_t sliding_window = 0;
  // The layer-kind table: [layers_count] for a hybrid model; empty means every layer attends (the
  // Llama-shaped families).
  std::vector<LayerKind> layer_kinds;
  MambaConfig mamba;  // used by the kMamba2 layers only

  LayerKind layer_kind(int32_t layer) const {
    return layer_kinds.empty() ? LayerKind::kAttention : layer_kinds[static_cast<size_t>(layer)];
  }
  int32_t mamba_layers_count() const;
  bool has_recurrent_state() const { return mamba_layers_count() > 0; }

  int32_t q_size() const { return query_heads_count * head_dim; }
  int32_t kv_size() const { return kv_heads_count * head_dim; }
  // The dims of each q/k head that RoPE rotates (the first ones).
  int32_t rotary_dim() const { return partial_rotary_dim == 0 ? head_dim : partial_rotary_dim; }
  RopeConfig rope() const {
    return RopeConfig{rope_type, rope_theta, rope_factor, rope_low_freq_factor,
                      rope_high_freq_factor, rope_original_max_positions};
  }
  // Parameters, for reports; counts the LM head once when tied.
  int64_t parameters_count() const;
  // Throws ls::Error naming the first field that is out of range or inconsistent.
  void validate() const;
};

// Refuses (ls::Error naming the field and both values) a context length the model cannot run as
// Hugging Face would: past a sliding window (not implemented), or past max_positions unless
// `allow_beyond_max_positions` (the caller warns).
void check_context_length(const ModelConfig& model, int32_t context_length,
                          bool allow_beyond_max_positions);

// The named shapes: `tiny` (CI-sized), `tiny-hybrid` (CI-sized Bamba: Mamba2, attention, Mamba2),
// `llama-1b` and `llama-8b` (GPU.md's shapes), `qwen3-0.6b`
// and `qwen2.5-7b` (a second and third family for the benchmarks).
ModelConfig model_config_named(std::string_view name);
std::vector<std::string> model_config_names();

// An executor's configuration is its limits (core/limits.h): every buffer is sized from them.
struct ExecutorConfig : Limits {};

}  // namespace ls
