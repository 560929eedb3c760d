// A tiny BambaForCausalLM checkpoint written by the test itself (config.json as BambaConfig saves
// it, fp32 safetensors with platform-stable seeded values), for the tests that need a hybrid model
// without the HF fixture: loading, the CPU reference's invariances and the state rules. Its values
// are not HF's; tests/hf_hybrid_test.cpp's oracle uses tests/fixtures/hf/bamba for that.
#pragma once

#include "core/model/safetensors.h"
#include "core/model/weights.h"
#include "core/ops/seeded_weights.h"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

namespace ls::testing {

// Four layers: mamba, attention, mamba, mamba; hidden 64; 8 Mamba heads of 16 in 2 groups, state
// 16, conv 4; the time-step clamp [0.05, 2] (values that clamp: softplus(dt + dt_bias) spreads
// over both sides).
inline nlohmann::json hybrid_config_json() {
  return {
      {"architectures", {"BambaForCausalLM"}},
      {"model_type", "bamba"},
      {"vocab_size", 512},
      {"tie_word_embeddings", false},
      {"hidden_size", 64},
      {"intermediate_size", 128},
      {"num_hidden_layers", 4},
      {"num_attention_heads", 4},
      {"num_key_value_heads", 2},
      {"hidden_act", "silu"},
      {"initializer_range", 0.1},
      {"rms_norm_eps", 1e-5},
      {"use_cache", true},
      {"num_logits_to_keep", 1},
      {"pad_token_id", 0},
      {"bos_token_id", 1},
      {"eos_token_id", 2},
      {"max_position_embeddings", 1024},
      {"attention_dropout", 0.0},
      {"attention_bias", false},
      {"mlp_bias", false},
      {"attn_layer_indices", {1}},
      {"mamba_n_heads", 8},
      {"mamba_d_head", 16},
      {"mamba_n_groups", 2},
      {"mamba_d_state", 16},
      {"mamba_d_conv", 4},
      {"mamba_expand", 2},
      {"mamba_chunk_size", 16},
      {"mamba_conv_bias", true},
      {"mamba_proj_bias", false},
      {"time_step_min", 0.001},
      {"time_step_max", 0.1},
      {"time_step_limit", {0.05, 2.0}},
      {"z_loss_coefficient", 0.0},
      {"partial_rotary_factor", 0.5},
      // As transformers 5.17 saves it: BambaConfig's forced 0.5, top-level and in rope_parameters.
      {"rope_parameters",
       {{"rope_type", "default"}, {"rope_theta", 10000.0}, {"partial_rotary_factor", 0.5}}},
      {"dtype", "float32"},
      {"transformers_version", "5.17.0"},
  };
}

struct SeededTensorWriter {
  uint64_t seed;
  uint32_t index = 0;
  std::vector<std::vector<float>> storage;
  std::vector<NamedTensor> tensors;

  void add(const std::string& name, std::vector<int64_t> shape, float center, float half_width) {
    int64_t count = 1;
    for (const int64_t d : shape) count *= d;
    std::vector<float> values(static_cast<size_t>(count));
    for (int64_t i = 0; i < count; ++i) {
      values[static_cast<size_t>(i)] = ops::seeded_value(seed, index, i, center, half_width);
    }
    ++index;
    storage.push_back(std::move(values));
    tensors.push_back(NamedTensor{name, std::move(shape), {}});
  }
  void linear(const std::string& name, int64_t out, int64_t in) {
    add(name, {out, in}, 0.0f, 1.0f / std::sqrt(static_cast<float>(in)));
  }
  void norm(const std::string& name, int64_t n) { add(name, {n}, 1.0f, 0.125f); }
};

// Writes config.json (`config`, default hybrid_config_json()) and model.safetensors to `dir`.
inline void write_hybrid_checkpoint(const std::filesystem::path& dir, uint64_t seed = 19,
                                    const nlohmann::json& config = hybrid_config_json()) {
  std::ofstream(dir / "config.json") << config.dump(2);
  const int64_t h = config["hidden_size"], v = config["vocab_size"], f = config["intermediate_size"];
  const int64_t heads = config["num_attention_heads"], kv = config["num_key_value_heads"];
  const int64_t head_dim = h / heads;
  const int64_t mh = config["mamba_n_heads"], md = config["mamba_d_head"];
  const int64_t groups = config["mamba_n_groups"], state = config["mamba_d_state"];
  const int64_t kernel = config["mamba_d_conv"];
  const int64_t inner = mh * md, conv_dim = inner + 2 * groups * state;
  const std::vector<int64_t> attention = config["attn_layer_indices"];
  const int64_t layers = config["num_hidden_layers"];
  SeededTensorWriter w{seed};
  w.add("model.embed_tokens.weight", {v, h}, 0.0f, 1.0f);
  for (int64_t l = 0; l < layers; ++l) {
    const std::string p = fmt::format("model.layers.{}.", l);
    w.norm(p + "input_layernorm.weight", h);
    if (std::find(attention.begin(), attention.end(), l) != attention.end()) {
      w.linear(p + "self_attn.q_proj.weight", heads * head_dim, h);
      w.linear(p + "self_attn.k_proj.weight", kv * head_dim, h);
      w.linear(p + "self_attn.v_proj.weight", kv * head_dim, h);
      w.linear(p + "self_attn.o_proj.weight", h, heads * head_dim);
    } else {
      w.linear(p + "mamba.in_proj.weight", inner + conv_dim + mh, h);
      w.add(p + "mamba.conv1d.weight", {conv_dim, 1, kernel}, 0.0f, 0.5f);
      w.add(p + "mamba.conv1d.bias", {conv_dim}, 0.0f, 0.125f);
      w.add(p + "mamba.dt_bias", {mh}, 0.0f, 1.0f);
      w.add(p + "mamba.A_log", {mh}, 0.5f, 0.5f);
      w.norm(p + "mamba.D", mh);
      w.norm(p + "mamba.norm.weight", inner);
      w.linear(p + "mamba.out_proj.weight", h, inner);
    }
    w.norm(p + "pre_ff_layernorm.weight", h);
    w.linear(p + "feed_forward.gate_proj.weight", f, h);
    w.linear(p + "feed_forward.up_proj.weight", f, h);
    w.linear(p + "feed_forward.down_proj.weight", h, f);
  }
  w.norm("model.final_layernorm.weight", h);
  w.linear("lm_head.weight", v, h);
  for (size_t i = 0; i < w.tensors.size(); ++i) w.tensors[i].values = w.storage[i];
  write_safetensors(dir / "model.safetensors", w.tensors, DType::kF32);
}

// The checkpoint of write_hybrid_checkpoint's defaults, as load_hf_directory reads it back from
// a temporary directory: written and loaded once per process.
inline const ModelWeights& hybrid_checkpoint_weights() {
  static const ModelWeights weights = [] {
    const std::filesystem::path dir = std::filesystem::temp_directory_path() /
                                      fmt::format("lockstep_{}_hybrid_checkpoint", ::getpid());
    std::filesystem::create_directories(dir);
    write_hybrid_checkpoint(dir);
    ModelWeights loaded = load_hf_directory(dir);
    std::filesystem::remove_all(dir);
    return loaded;
  }();
  return weights;
}

}  // namespace ls::testing
