// Model weights on the host, fp32, in the layout every backend starts from.
// Matrices are row-major [out, in], as in Hugging Face checkpoints.
#pragma once

#include "core/config.h"

#include <cstdint>
#include <filesystem>
#include <span>
#include <string>
#include <vector>

namespace ls {

struct LayerWeights {
  std::vector<float> attn_norm;  // [hidden]
  std::vector<float> wq;         // [q_heads·head_dim, hidden]
  std::vector<float> wk;         // [kv_heads·head_dim, hidden]
  std::vector<float> wv;         // [kv_heads·head_dim, hidden]
  std::vector<float> wo;         // [hidden, q_heads·head_dim]
  std::vector<float> ffn_norm;   // [hidden]
  std::vector<float> w_gate;     // [ffn, hidden]
  std::vector<float> w_up;       // [ffn, hidden]
  std::vector<float> w_down;     // [hidden, ffn]
};

struct ModelWeights {
  ModelConfig config;
  std::vector<float> embedding;   // [vocab, hidden]
  std::vector<LayerWeights> layers;
  std::vector<float> final_norm;  // [hidden]
  std::vector<float> lm_head;     // [vocab, hidden]; empty when embeddings are tied

  std::span<const float> lm_head_view() const {
    return config.tied_embeddings ? std::span<const float>(embedding) : std::span<const float>(lm_head);
  }
  // XXH3-64 over every tensor's fp32 bytes in a fixed order (embedding, layers 0.., final norm,
  // lm head): the weight digest a trace header records and replay checks.
  uint64_t digest() const;
};

// Where the weights came from, as a trace header records it.
struct WeightSource {
  enum class Kind : uint8_t { kSeed = 0, kDirectory = 1 } kind = Kind::kSeed;
  uint64_t seed = 0;
  std::string directory;
};

// Platform-stable random weights: every element is a pure function of (seed, tensor index,
// element index) through Philox4x32-10, so two machines produce bit-identical weights.
// Linear weights are uniform in [-1/sqrt(in), 1/sqrt(in)); embeddings uniform in [-1, 1);
// norm weights 1 + uniform in [-1/8, 1/8).
ModelWeights weights_from_seed(const ModelConfig& config, uint64_t seed);

// A Hugging Face Llama directory: config.json plus one or more *.safetensors files (bf16, fp16 or
// fp32). Throws ls::Error naming the file and tensor on any problem.
ModelWeights load_hf_directory(const std::filesystem::path& directory);

// Reads a Hugging Face LlamaConfig JSON text. Throws ls::Error naming a missing or bad field.
ModelConfig model_config_from_hf_json(const std::string& json_text, const std::string& name);

}  // namespace ls
