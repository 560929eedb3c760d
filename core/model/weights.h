// Model weights on the host, fp32, in the layout every backend starts from.
// Matrices are row-major [out, in], as in Hugging Face checkpoints.
#pragma once

#include "core/config.h"
#include "core/host_threads.h"

#include <cstdint>
#include <filesystem>
#include <future>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace ls {

// How ModelWeights::digest() hashes the canonical weight stream (the config's text, then every
// tensor's fp32 bytes in a fixed order); a trace header records which form its digest has.
//  kStream: XXH3-64 of the stream in one pass on one core: every trace of format versions 3 and
//           4 (seconds a pass on an 8B model: 5.6 s on the device's host).
//  kBlocks: the stream cut into kWeightsDigestBlockBytes blocks, each hashed with XXH3-64 on
//           every core, then XXH3-64 of the blocks' digests in order (core/model/pieces_digest.h):
//           the same value on any number of cores. What recording writes since format version 5.
enum class WeightsDigestForm : uint8_t { kStream = 0, kBlocks = 1 };
inline constexpr uint64_t kWeightsDigestBlockBytes = uint64_t{16} << 20;
// The form a recording's header names (trace/trace_observer.h) and digest() computes by default.
inline constexpr WeightsDigestForm kWeightsDigestFormRecorded = WeightsDigestForm::kBlocks;
std::string_view to_string(WeightsDigestForm form);  // "stream", "blocks"
std::optional<WeightsDigestForm> weights_digest_form_named(std::string_view name);

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
  // Family features; empty when the config's flag is off.
  std::vector<float> q_bias;     // [q_heads·head_dim] when qkv_bias
  std::vector<float> k_bias;     // [kv_heads·head_dim] when qkv_bias
  std::vector<float> v_bias;     // [kv_heads·head_dim] when qkv_bias
  std::vector<float> q_norm;     // [head_dim] when qk_norm, shared by every query head
  std::vector<float> k_norm;     // [head_dim] when qk_norm, shared by every KV head
  // A Mamba2 layer's mixer (ModelConfig::mamba), in place of wq..wo, which are then empty.
  std::vector<float> in_proj;      // [inner + conv_dim + heads, hidden]
  std::vector<float> conv_weight;  // [conv_dim, conv_kernel] (HF's [conv_dim, 1, conv_kernel])
  std::vector<float> conv_bias;    // [conv_dim] when mamba.conv_bias
  std::vector<float> dt_bias;      // [heads]
  std::vector<float> a_log;        // [heads] A = −exp(a_log)
  std::vector<float> d_skip;       // [heads] D
  std::vector<float> mamba_norm;   // [inner] the gated RMSNorm's weight
  std::vector<float> out_proj;     // [hidden, inner]
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
  // The digest, in `form` (above), over the config and every tensor's fp32 bytes in a fixed order
  // (embedding, layers 0.. with their biases and head norms after the 9 Llama tensors, final norm,
  // lm head): the weight digest a trace header records and replay checks. A Llama model with none
  // of the family features digests as it did before they existed. `threads`: the cores the
  // blocks form runs on (its value does not depend on them).
  uint64_t digest(WeightsDigestForm form = kWeightsDigestFormRecorded,
                  int32_t threads = host_cores()) const;
  // digest(form) on a thread of its own, begun now: a pass over every fp32 weight that recording
  // and replay run beside the backend's start, which on CUDA uploads these weights. The weights
  // must outlive the result (its last copy waits for the pass).
  std::shared_future<uint64_t> digest_in_background(
      WeightsDigestForm form = kWeightsDigestFormRecorded) const;
  // Throws ls::Error when a tensor's size disagrees with the config (a feature's tensors present
  // exactly when its flag is on).
  void validate() const;
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
// norm weights (q/k head norms too) 1 + uniform in [-1/8, 1/8); biases uniform in [-1/8, 1/8).
// `threads` split the work, by default every core this process may use; the values do not depend
// on it. Most of the time is the page faults of zeroing the tensors (qwen3-0.6b took 9.6 s on one
// core and 5.3 s on two of a VM, `lockstep_bench_cpu --benchmark_filter=WeightsFromSeed`).
ModelWeights weights_from_seed(const ModelConfig& config, uint64_t seed,
                               int32_t threads = host_cores());

// A Hugging Face checkpoint directory of a supported family (Llama, Qwen2, Qwen3, Mistral, Bamba):
// config.json plus one or more *.safetensors files (bf16, fp16 or fp32), listed by
// model.safetensors.index.json when there is one. Every tensor in the files is consumed or the
// load fails naming it. Throws ls::Error naming the path, field or tensor on any problem
// (filesystem errors included).
ModelWeights load_hf_directory(const std::filesystem::path& directory);

// Reads a Hugging Face config.json text of a supported family. Every key is either implemented,
// known not to change the arithmetic, or refused by name (see the policy in weights.cpp).
// Throws ls::Error naming a missing, bad, unknown or unsupported field.
ModelConfig model_config_from_hf_json(const std::string& json_text, const std::string& name);

}  // namespace ls
