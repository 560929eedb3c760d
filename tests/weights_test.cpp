// Seeded weights, the weight digest, the HF config reader and the HF directory loader. The seeded
// values are checked against Philox draws the test makes itself from the documented tensor-index
// table; the directory tests write their own config.json and shards and compare what comes back
// with the source tensors bit for bit.
#include "core/check.h"
#include "core/config.h"
#include "core/model/safetensors.h"
#include "core/model/weights.h"
#include "core/sampling.h"

#include <fmt/format.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <xxhash.h>

#include "tests/scratch_dir.h"
#include <unistd.h>

#include <bit>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

namespace ls {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;

using testing::ScratchDir;

void write_text(const fs::path& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << text;
  ASSERT_TRUE(out.good()) << path;
}

// config.json for model_config_named("tiny"), written out by hand.
std::string tiny_config_json(bool tied) {
  return fmt::format(R"({{
  "architectures": ["LlamaForCausalLM"],
  "model_type": "llama",
  "hidden_size": 64,
  "num_hidden_layers": 2,
  "num_attention_heads": 4,
  "num_key_value_heads": 2,
  "head_dim": 16,
  "intermediate_size": 128,
  "vocab_size": 512,
  "rope_theta": 10000.0,
  "rms_norm_eps": 1e-05,
  "hidden_act": "silu",
  "attention_bias": false,
  "mlp_bias": false,
  "rope_scaling": null,
  "torch_dtype": "bfloat16",
  "tie_word_embeddings": {}
}})", tied ? "true" : "false");
}

ModelConfig tiny_config(bool tied) {
  ModelConfig config = model_config_named("tiny");
  config.tied_embeddings = tied;
  return config;
}

// Hugging Face names and [out, in] shapes, spelled out here independently of the loader's table.
std::vector<NamedTensor> hf_tensors(const ModelWeights& w) {
  const ModelConfig& c = w.config;
  const int64_t h = c.hidden_size, q = c.q_size(), kv = c.kv_size(), f = c.ffn_size;
  const int64_t v = c.vocab_size;
  std::vector<NamedTensor> out;
  out.push_back({"model.embed_tokens.weight", {v, h}, w.embedding});
  for (size_t i = 0; i < w.layers.size(); ++i) {
    const LayerWeights& l = w.layers[i];
    const std::string p = fmt::format("model.layers.{}.", i);
    out.push_back({p + "input_layernorm.weight", {h}, l.attn_norm});
    out.push_back({p + "self_attn.q_proj.weight", {q, h}, l.wq});
    out.push_back({p + "self_attn.k_proj.weight", {kv, h}, l.wk});
    out.push_back({p + "self_attn.v_proj.weight", {kv, h}, l.wv});
    out.push_back({p + "self_attn.o_proj.weight", {h, q}, l.wo});
    out.push_back({p + "post_attention_layernorm.weight", {h}, l.ffn_norm});
    out.push_back({p + "mlp.gate_proj.weight", {f, h}, l.w_gate});
    out.push_back({p + "mlp.up_proj.weight", {f, h}, l.w_up});
    out.push_back({p + "mlp.down_proj.weight", {h, f}, l.w_down});
  }
  out.push_back({"model.norm.weight", {h}, w.final_norm});
  if (!c.tied_embeddings) out.push_back({"lm_head.weight", {v, h}, w.lm_head});
  return out;
}

// Splits the tensors over two shards at `split` (sorted file names decide nothing about content).
void write_shards(const fs::path& dir, std::span<const NamedTensor> tensors, size_t split,
                  DType dtype) {
  write_safetensors(dir / "model-00001-of-00002.safetensors", tensors.first(split), dtype);
  write_safetensors(dir / "model-00002-of-00002.safetensors", tensors.subspan(split), dtype);
}

std::vector<NamedTensor> without(std::vector<NamedTensor> tensors, const std::string& name) {
  std::erase_if(tensors, [&](const NamedTensor& t) { return t.name == name; });
  return tensors;
}

void expect_same_bits(const std::string& what, std::span<const float> actual,
                      std::span<const float> expected) {
  ASSERT_EQ(actual.size(), expected.size()) << what;
  for (size_t i = 0; i < actual.size(); ++i) {
    if (std::bit_cast<uint32_t>(actual[i]) != std::bit_cast<uint32_t>(expected[i])) {
      ADD_FAILURE() << what << "[" << i << "]: got " << actual[i] << ", expected " << expected[i];
      return;
    }
  }
}

void expect_same_weights(const ModelWeights& actual, const ModelWeights& expected) {
  expect_same_bits("embedding", actual.embedding, expected.embedding);
  ASSERT_EQ(actual.layers.size(), expected.layers.size());
  for (size_t i = 0; i < actual.layers.size(); ++i) {
    const LayerWeights& a = actual.layers[i];
    const LayerWeights& e = expected.layers[i];
    const std::string p = fmt::format("layer {} ", i);
    expect_same_bits(p + "attn_norm", a.attn_norm, e.attn_norm);
    expect_same_bits(p + "wq", a.wq, e.wq);
    expect_same_bits(p + "wk", a.wk, e.wk);
    expect_same_bits(p + "wv", a.wv, e.wv);
    expect_same_bits(p + "wo", a.wo, e.wo);
    expect_same_bits(p + "ffn_norm", a.ffn_norm, e.ffn_norm);
    expect_same_bits(p + "w_gate", a.w_gate, e.w_gate);
    expect_same_bits(p + "w_up", a.w_up, e.w_up);
    expect_same_bits(p + "w_down", a.w_down, e.w_down);
  }
  expect_same_bits("final_norm", actual.final_norm, expected.final_norm);
  expect_same_bits("lm_head", actual.lm_head, expected.lm_head);
}

std::string load_error(const fs::path& dir) {
  try {
    load_hf_directory(dir);
  } catch (const Error& e) {
    return e.what();
  }
  ADD_FAILURE() << "loading " << dir << " did not throw";
  return "";
}

// The configs below are Llama ones; the family must be named (architectures or model_type).
std::string llama(const std::string& json) {
  return "{\"architectures\": [\"LlamaForCausalLM\"], " + json.substr(json.find('{') + 1);
}

std::string config_error(const std::string& json) {
  try {
    model_config_from_hf_json(json, "cfg");
  } catch (const Error& e) {
    return e.what();
  }
  ADD_FAILURE() << "config did not throw: " << json;
  return "";
}

// The documented mapping: u from Philox word 0 at (key = seed, counter0 = element, counter1 =
// tensor index), then center + half_width·(2u − 1).
float philox_value(uint64_t seed, uint32_t tensor_index, uint64_t element, float center,
                   float half_width) {
  const float u = uniform_from_bits(philox4x32_10(seed, element, tensor_index)[0]);
  return center + half_width * (2.0f * u - 1.0f);
}

double sum_of_squares(std::span<const float> values) {
  double sum = 0.0;
  for (const float value : values) sum += static_cast<double>(value) * value;
  return sum;
}

// ---- seeded weights ------------------------------------------------------------------------

TEST(SeededWeights, SameSeedSameDigestOtherSeedOtherDigest) {
  const ModelConfig config = tiny_config(false);
  const ModelWeights a = weights_from_seed(config, 7);
  const ModelWeights b = weights_from_seed(config, 7);
  const ModelWeights c = weights_from_seed(config, 8);
  expect_same_weights(a, b);
  EXPECT_EQ(a.digest(), b.digest());
  EXPECT_NE(a.digest(), c.digest());
  EXPECT_NE(a.embedding, c.embedding);
}

TEST(SeededWeights, ElementsFollowTheDocumentedPhiloxIndices) {
  const uint64_t seed = 0x1234'5678'9ABC'DEF0;
  SCOPED_TRACE(fmt::format("seed {:#x}", seed));
  const ModelWeights w = weights_from_seed(tiny_config(false), seed);
  // tiny: hidden 64, q 64, kv 32, ffn 128, vocab 512, 2 layers → final_norm 19, lm_head 20.
  const float hidden_bound = 0.125f;  // 1/sqrt(64)
  const float ffn_bound = 1.0f / std::sqrt(128.0f);
  EXPECT_EQ(w.embedding[5], philox_value(seed, 0, 5, 0.0f, 1.0f));
  EXPECT_EQ(w.embedding[32767], philox_value(seed, 0, 32767, 0.0f, 1.0f));
  EXPECT_EQ(w.layers[0].attn_norm[3], philox_value(seed, 1, 3, 1.0f, 0.125f));
  EXPECT_EQ(w.layers[0].wq[100], philox_value(seed, 2, 100, 0.0f, hidden_bound));
  EXPECT_EQ(w.layers[0].w_down[7], philox_value(seed, 9, 7, 0.0f, ffn_bound));
  EXPECT_EQ(w.layers[1].wk[37], philox_value(seed, 12, 37, 0.0f, hidden_bound));
  EXPECT_EQ(w.layers[1].wo[1000], philox_value(seed, 14, 1000, 0.0f, hidden_bound));
  EXPECT_EQ(w.layers[1].ffn_norm[63], philox_value(seed, 15, 63, 1.0f, 0.125f));
  EXPECT_EQ(w.final_norm[0], philox_value(seed, 19, 0, 1.0f, 0.125f));
  EXPECT_EQ(w.lm_head[100], philox_value(seed, 20, 100, 0.0f, hidden_bound));

  // Tying drops lm_head and changes nothing else.
  const ModelWeights tied = weights_from_seed(tiny_config(true), seed);
  EXPECT_TRUE(tied.lm_head.empty());
  expect_same_bits("tied final_norm", tied.final_norm, w.final_norm);
  expect_same_bits("tied layer 1 w_up", tied.layers[1].w_up, w.layers[1].w_up);
  EXPECT_EQ(tied.lm_head_view().data(), tied.embedding.data());
}

// Every element of every tensor against the documented draw, made one element at a time here:
// weights_from_seed draws 16 at a time, so sizes that are no multiple of 16 (tails) and 3 threads
// whose runs start mid-block and cross tensor boundaries are where a lane could go wrong. Indices
// and ranges as core/ops/seeded_weights.h documents them, written out here.
TEST(SeededWeights, EveryElementIsItsDocumentedDraw) {
  ModelConfig config = tiny_config(false);
  config.family = ModelFamily::kQwen2;
  config.qkv_bias = true;
  config.qk_norm = true;
  config.hidden_size = 74, config.query_heads_count = 3, config.kv_heads_count = 1;
  config.head_dim = 22, config.ffn_size = 1003, config.vocab_size = 5003;
  const uint64_t seed = 0xFEED'0000'0000'0123;
  const ModelWeights w = weights_from_seed(config, seed, 3);
  const auto expect_draws = [&](const std::string& what, std::span<const float> values,
                                uint32_t index, float center, float half_width) {
    for (size_t i = 0; i < values.size(); ++i) {
      const float draw = philox_value(seed, index, i, center, half_width);
      if (std::bit_cast<uint32_t>(values[i]) != std::bit_cast<uint32_t>(draw)) {
        ADD_FAILURE() << what << " (tensor " << index << ") element " << i << " of "
                      << values.size() << ": " << values[i] << ", the draw is " << draw;
        return;
      }
    }
  };
  const float h = 1.0f / std::sqrt(74.0f), q = 1.0f / std::sqrt(66.0f);
  const float f = 1.0f / std::sqrt(1003.0f);
  expect_draws("embedding", w.embedding, 0, 0.0f, 1.0f);
  for (uint32_t l = 0; l < 2; ++l) {
    const LayerWeights& layer = w.layers[l];
    const uint32_t first = 1 + 9 * l, features = 3 + 9 * 2 + 5 * l;
    expect_draws("attn_norm", layer.attn_norm, first + 0, 1.0f, 0.125f);
    expect_draws("wq", layer.wq, first + 1, 0.0f, h);
    expect_draws("wk", layer.wk, first + 2, 0.0f, h);
    expect_draws("wv", layer.wv, first + 3, 0.0f, h);
    expect_draws("wo", layer.wo, first + 4, 0.0f, q);
    expect_draws("ffn_norm", layer.ffn_norm, first + 5, 1.0f, 0.125f);
    expect_draws("w_gate", layer.w_gate, first + 6, 0.0f, h);
    expect_draws("w_up", layer.w_up, first + 7, 0.0f, h);
    expect_draws("w_down", layer.w_down, first + 8, 0.0f, f);
    expect_draws("q_bias", layer.q_bias, features + 0, 0.0f, 0.125f);
    expect_draws("k_bias", layer.k_bias, features + 1, 0.0f, 0.125f);
    expect_draws("v_bias", layer.v_bias, features + 2, 0.0f, 0.125f);
    expect_draws("q_norm", layer.q_norm, features + 3, 1.0f, 0.125f);
    expect_draws("k_norm", layer.k_norm, features + 4, 1.0f, 0.125f);
  }
  expect_draws("final_norm", w.final_norm, 1 + 9 * 2, 1.0f, 0.125f);
  expect_draws("lm_head", w.lm_head, 2 + 9 * 2, 0.0f, h);
  EXPECT_EQ(w.lm_head.size(), 5003u * 74u);
  EXPECT_EQ(w.layers[1].w_down.size(), 74u * 1003u);
  EXPECT_EQ(w.layers[1].k_norm.size(), 22u);
}

TEST(SeededWeights, ShapesRangesAndNonDegenerate) {
  const uint64_t seed = 42;
  SCOPED_TRACE(fmt::format("seed {}", seed));
  const ModelConfig config = tiny_config(false);
  const ModelWeights w = weights_from_seed(config, seed);
  EXPECT_EQ(w.embedding.size(), 512u * 64u);
  ASSERT_EQ(w.layers.size(), 2u);
  EXPECT_EQ(w.layers[1].wq.size(), 64u * 64u);
  EXPECT_EQ(w.layers[1].wk.size(), 32u * 64u);
  EXPECT_EQ(w.layers[1].wo.size(), 64u * 64u);
  EXPECT_EQ(w.layers[1].w_down.size(), 64u * 128u);
  EXPECT_EQ(w.lm_head.size(), 512u * 64u);

  auto expect_in = [](const std::string& what, std::span<const float> values, float lo, float hi) {
    for (size_t i = 0; i < values.size(); ++i) {
      if (!(values[i] >= lo && values[i] < hi)) {
        ADD_FAILURE() << what << "[" << i << "] = " << values[i] << " outside [" << lo << ", " << hi << ")";
        return;
      }
    }
    EXPECT_GT(sum_of_squares(values), 0.0) << what;
  };
  expect_in("embedding", w.embedding, -1.0f, 1.0f);
  expect_in("attn_norm", w.layers[0].attn_norm, 0.875f, 1.125f);
  expect_in("ffn_norm", w.layers[1].ffn_norm, 0.875f, 1.125f);
  expect_in("final_norm", w.final_norm, 0.875f, 1.125f);
  expect_in("wq", w.layers[0].wq, -0.125f, 0.125f);
  expect_in("w_down", w.layers[1].w_down, -1.0f / std::sqrt(128.0f), 1.0f / std::sqrt(128.0f));
  expect_in("lm_head", w.lm_head, -0.125f, 0.125f);

  // Uniform on [-1, 1): mean 0, mean square 1/3. 32768 draws put both well inside these bounds.
  double mean = 0.0;
  for (const float value : w.embedding) mean += value;
  mean /= static_cast<double>(w.embedding.size());
  EXPECT_NEAR(mean, 0.0, 0.03);
  EXPECT_NEAR(sum_of_squares(w.embedding) / static_cast<double>(w.embedding.size()), 1.0 / 3.0, 0.03);
  // Same-shaped tensors draw from different streams.
  EXPECT_NE(w.layers[0].wk, w.layers[0].wv);
  EXPECT_NE(w.layers[0].w_gate, w.layers[0].w_up);
  EXPECT_NE(w.layers[0].wq, w.layers[1].wq);
}

// ---- digest --------------------------------------------------------------------------------

TEST(WeightDigest, CoversEveryTensor) {
  const ModelWeights base = weights_from_seed(tiny_config(false), 3);
  const uint64_t digest = base.digest();
  auto changed = [&](auto mutate) {
    ModelWeights copy = base;
    mutate(copy);
    return copy.digest() != digest;
  };
  EXPECT_TRUE(changed([](ModelWeights& w) { w.embedding[0] += 1.0f; }));
  EXPECT_TRUE(changed([](ModelWeights& w) { w.layers[0].attn_norm[1] += 1.0f; }));
  EXPECT_TRUE(changed([](ModelWeights& w) { w.layers[0].wq[2] += 1.0f; }));
  EXPECT_TRUE(changed([](ModelWeights& w) { w.layers[0].wk[3] += 1.0f; }));
  EXPECT_TRUE(changed([](ModelWeights& w) { w.layers[1].wv[4] += 1.0f; }));
  EXPECT_TRUE(changed([](ModelWeights& w) { w.layers[1].wo[5] += 1.0f; }));
  EXPECT_TRUE(changed([](ModelWeights& w) { w.layers[1].ffn_norm[6] += 1.0f; }));
  EXPECT_TRUE(changed([](ModelWeights& w) { w.layers[1].w_gate[7] += 1.0f; }));
  EXPECT_TRUE(changed([](ModelWeights& w) { w.layers[1].w_up[8] += 1.0f; }));
  EXPECT_TRUE(changed([](ModelWeights& w) { w.layers[1].w_down.back() += 1.0f; }));
  EXPECT_TRUE(changed([](ModelWeights& w) { w.final_norm[9] += 1.0f; }));
  EXPECT_TRUE(changed([](ModelWeights& w) { w.lm_head.back() += 1.0f; }));
  EXPECT_TRUE(changed([](ModelWeights& w) { w.layers[0].wk[0] = -w.layers[0].wk[0]; }));
  // Swapping two same-shaped tensors keeps the bytes but not the order.
  EXPECT_TRUE(changed([](ModelWeights& w) { std::swap(w.layers[0].wk, w.layers[0].wv); }));
}

TEST(WeightDigest, CoversConfigButNotName) {
  const ModelWeights base = weights_from_seed(tiny_config(false), 3);
  ModelWeights theta = base;
  theta.config.rope_theta = 500000.0f;
  EXPECT_NE(theta.digest(), base.digest());
  ModelWeights eps = base;
  eps.config.rms_eps = 1e-6f;
  EXPECT_NE(eps.digest(), base.digest());
  // Same bytes, different split: 4 heads of 16 versus 2 heads of 32.
  ModelWeights heads = base;
  heads.config.query_heads_count = 2;
  heads.config.kv_heads_count = 1;
  heads.config.head_dim = 32;
  EXPECT_NE(heads.digest(), base.digest());
  ModelWeights renamed = base;
  renamed.config.name = "another-label";
  EXPECT_EQ(renamed.digest(), base.digest());
}

// ---- Hugging Face config -------------------------------------------------------------------

TEST(HfConfig, ReadsTinyConfig) {
  const ModelConfig c = model_config_from_hf_json(tiny_config_json(false), "tiny-hf");
  EXPECT_EQ(c.name, "tiny-hf");
  EXPECT_EQ(c.hidden_size, 64);
  EXPECT_EQ(c.layers_count, 2);
  EXPECT_EQ(c.query_heads_count, 4);
  EXPECT_EQ(c.kv_heads_count, 2);
  EXPECT_EQ(c.head_dim, 16);
  EXPECT_EQ(c.ffn_size, 128);
  EXPECT_EQ(c.vocab_size, 512);
  EXPECT_EQ(c.rope_theta, 10000.0f);
  EXPECT_EQ(c.rms_eps, 1e-5f);
  EXPECT_FALSE(c.tied_embeddings);
  EXPECT_TRUE(model_config_from_hf_json(tiny_config_json(true), "t").tied_embeddings);
}

TEST(HfConfig, AppliesDefaults) {
  const ModelConfig c = model_config_from_hf_json(
      llama(R"({"hidden_size": 96, "num_hidden_layers": 1, "num_attention_heads": 6,
          "intermediate_size": 200, "vocab_size": 10, "num_key_value_heads": null})"),
      "defaults");
  EXPECT_EQ(c.kv_heads_count, 6);       // = num_attention_heads
  EXPECT_EQ(c.head_dim, 16);            // 96 / 6
  EXPECT_EQ(c.rope_theta, 10000.0f);
  EXPECT_EQ(c.rms_eps, 1e-6f);
  EXPECT_FALSE(c.tied_embeddings);
  EXPECT_EQ(c.family, ModelFamily::kLlama);
  EXPECT_EQ(c.rope_type, RopeType::kDefault);
  EXPECT_EQ(c.max_positions, 2048);  // LlamaConfig's default
  EXPECT_FALSE(c.qkv_bias);
  EXPECT_FALSE(c.qk_norm);
}

TEST(HfConfig, RejectsMissingAndMistypedKeys) {
  const std::string missing = R"({"num_hidden_layers": 2, "num_attention_heads": 4,
      "intermediate_size": 128, "vocab_size": 512})";
  EXPECT_THAT(config_error(llama(missing)), HasSubstr("missing required key 'hidden_size'"));
  const std::string as_string = R"({"hidden_size": "64", "num_hidden_layers": 2,
      "num_attention_heads": 4, "intermediate_size": 128, "vocab_size": 512})";
  EXPECT_THAT(config_error(llama(as_string)), HasSubstr("'hidden_size' must be an integer, got string"));
  const std::string as_float = R"({"hidden_size": 64, "num_hidden_layers": 2.0,
      "num_attention_heads": 4, "intermediate_size": 128, "vocab_size": 512})";
  EXPECT_THAT(config_error(llama(as_float)), HasSubstr("'num_hidden_layers' must be an integer"));
  const std::string huge = R"({"hidden_size": 64, "num_hidden_layers": 2,
      "num_attention_heads": 4, "intermediate_size": 128, "vocab_size": 4294967296})";
  EXPECT_THAT(config_error(llama(huge)), HasSubstr("'vocab_size' = 4294967296 does not fit in int32"));
  const std::string tie_string = R"({"hidden_size": 64, "num_hidden_layers": 2,
      "num_attention_heads": 4, "intermediate_size": 128, "vocab_size": 512,
      "tie_word_embeddings": "yes"})";
  EXPECT_THAT(config_error(llama(tie_string)), HasSubstr("'tie_word_embeddings' must be true or false"));
  const std::string theta_string = R"({"hidden_size": 64, "num_hidden_layers": 2,
      "num_attention_heads": 4, "intermediate_size": 128, "vocab_size": 512, "rope_theta": "1e4"})";
  EXPECT_THAT(config_error(llama(theta_string)), HasSubstr("'rope_theta' must be a number"));
  EXPECT_THAT(config_error("{not json"), HasSubstr("not valid JSON"));
  EXPECT_THAT(config_error("[1]"), HasSubstr("must be a JSON object"));
}

TEST(HfConfig, RejectsUnsupportedFeatures) {
  const std::string base = R"("architectures": ["LlamaForCausalLM"], "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
      "intermediate_size": 128, "vocab_size": 512)";
  EXPECT_THAT(config_error("{" + base + R"(, "attention_bias": true})"),
              HasSubstr("'attention_bias': true is not supported"));
  EXPECT_THAT(config_error("{" + base + R"(, "mlp_bias": true})"),
              HasSubstr("'mlp_bias': true is not supported"));
  // Llama 3 scaling needs all four of its parameters.
  EXPECT_THAT(config_error("{" + base + R"(, "rope_scaling": {"rope_type": "llama3", "factor": 32.0}})"),
              HasSubstr("rope_type \"llama3\" needs 'rope_scaling.low_freq_factor'"));
  EXPECT_THAT(config_error("{" + base + R"(, "rope_scaling": {"rope_type": "yarn", "factor": 4.0}})"),
              HasSubstr("'rope_scaling.rope_type' \"yarn\" is not supported"));
  EXPECT_THAT(config_error("{" + base + R"(, "model_type": "gpt2"})"),
              HasSubstr("'model_type' \"gpt2\" is not supported"));
  EXPECT_THAT(config_error(R"({"hidden_size": 64})"), HasSubstr("names no 'architectures' or 'model_type'"));
  EXPECT_THAT(config_error("{" + base + R"(, "quantization_config": {"quant_method": "awq"}})"),
              HasSubstr("'quantization_config' {\"quant_method\":\"awq\"} is not supported"));
  EXPECT_THAT(config_error("{" + base + R"(, "num_hidden_layers": 3})"), HasSubstr("appears twice"));
  EXPECT_THAT(config_error("{" + base + R"(, "hidden_act": "gelu"})"),
              HasSubstr("'hidden_act' \"gelu\" is not supported"));
  // Validation of the assembled config: 4 query heads cannot share 3 KV heads.
  EXPECT_THAT(config_error("{" + base + R"(, "num_key_value_heads": 3})"),
              HasSubstr("not a multiple of kv_heads_count"));
  EXPECT_THAT(config_error("{" + base + R"(, "num_attention_heads": 0})"),
              HasSubstr("num_attention_heads"));
  // The explicit "off" spellings are accepted.
  EXPECT_NO_THROW(model_config_from_hf_json("{" + base + R"(, "attention_bias": false,
      "mlp_bias": false, "rope_scaling": null, "hidden_act": "silu"})", "ok"));
}

// ---- Hugging Face directory ----------------------------------------------------------------

TEST(HfDirectory, ShardedF32RoundTripIsExact) {
  const ScratchDir dir;
  const ModelWeights source = weights_from_seed(tiny_config(false), 11);
  write_text(dir.path() / "config.json", tiny_config_json(false));
  const std::vector<NamedTensor> tensors = hf_tensors(source);
  write_shards(dir.path(), tensors, 10, DType::kF32);  // layer 0 ends mid-way in shard 2
  const ModelWeights loaded = load_hf_directory(dir.path());
  EXPECT_EQ(loaded.config.hidden_size, 64);
  EXPECT_EQ(loaded.config.rms_eps, 1e-5f);
  EXPECT_EQ(loaded.config.name, dir.path().filename().string());
  expect_same_weights(loaded, source);
  EXPECT_EQ(loaded.digest(), source.digest());
}

TEST(HfDirectory, Bf16ShardsLoadRoundedValues) {
  const ScratchDir dir;
  const ModelWeights source = weights_from_seed(tiny_config(false), 12);
  write_text(dir.path() / "config.json", tiny_config_json(false));
  const std::vector<NamedTensor> tensors = hf_tensors(source);
  write_shards(dir.path(), tensors, 5, DType::kBF16);
  const ModelWeights loaded = load_hf_directory(dir.path());
  std::vector<float> rounded = source.layers[1].w_down;
  for (float& value : rounded) value = bf16_to_f32(f32_to_bf16(value));
  expect_same_bits("layer 1 w_down", loaded.layers[1].w_down, rounded);
  EXPECT_NE(loaded.digest(), source.digest());  // the rounding did change bytes
}

TEST(HfDirectory, TiedEmbeddingsTakeOnlyAnEqualLmHead) {
  const ScratchDir dir;
  const ModelWeights source = weights_from_seed(tiny_config(true), 13);
  write_text(dir.path() / "config.json", tiny_config_json(true));
  std::vector<NamedTensor> tensors = hf_tensors(source);
  ASSERT_EQ(tensors.back().name, "model.norm.weight");  // no lm_head when tied
  write_shards(dir.path(), tensors, 12, DType::kF32);
  const ModelWeights loaded = load_hf_directory(dir.path());
  EXPECT_TRUE(loaded.config.tied_embeddings);
  EXPECT_TRUE(loaded.lm_head.empty());
  expect_same_weights(loaded, source);
  EXPECT_EQ(loaded.digest(), source.digest());

  // A copy of the embedding under lm_head.weight (as some tied checkpoints carry) is the same model.
  tensors.push_back({"lm_head.weight", {512, 64}, source.embedding});
  write_shards(dir.path(), tensors, 12, DType::kF32);
  EXPECT_EQ(load_hf_directory(dir.path()).digest(), source.digest());
  // Any other lm_head.weight is an untied model under a tied config: refused.
  std::vector<float> other = source.embedding;
  other[100] += 1.0f;
  tensors.back().values = other;
  write_shards(dir.path(), tensors, 12, DType::kF32);
  EXPECT_THAT(load_error(dir.path()), HasSubstr("lm_head.weight differs from "
                                                "model.embed_tokens.weight (first at element 100)"));
  const std::vector<float> stray(8, 5.0f);
  tensors.back() = {"lm_head.weight", {2, 4}, stray};
  write_shards(dir.path(), tensors, 12, DType::kF32);
  EXPECT_THAT(load_error(dir.path()), HasSubstr("expected shape [512, 64], got [2, 4]"));
}

TEST(HfDirectory, ShardIndexMustAgreeWithTheShards) {
  const ScratchDir dir;
  const ModelWeights source = weights_from_seed(tiny_config(false), 17);
  write_text(dir.path() / "config.json", tiny_config_json(false));
  const std::vector<NamedTensor> tensors = hf_tensors(source);
  write_shards(dir.path(), tensors, 10, DType::kF32);
  auto write_index = [&](const std::string& moved, const std::string& to) {
    std::string map;
    for (size_t i = 0; i < tensors.size(); ++i) {
      const std::string shard = tensors[i].name == moved ? to
                                : i < 10 ? "model-00001-of-00002.safetensors"
                                         : "model-00002-of-00002.safetensors";
      map += fmt::format("{}\"{}\": \"{}\"", map.empty() ? "" : ", ", tensors[i].name, shard);
    }
    write_text(dir.path() / "model.safetensors.index.json",
               "{\"metadata\": {\"total_size\": 1}, \"weight_map\": {" + map + "}}");
  };
  write_index("", "");
  EXPECT_EQ(load_hf_directory(dir.path()).digest(), source.digest());
  write_index("model.norm.weight", "model-00001-of-00002.safetensors");
  EXPECT_THAT(load_error(dir.path()), HasSubstr("maps tensor 'model.norm.weight' to "
                                                "model-00001-of-00002.safetensors, which does not hold it"));
  write_index("model.norm.weight", "../elsewhere.safetensors");
  EXPECT_THAT(load_error(dir.path()), HasSubstr("is not a file name in the directory"));
  write_index("", "");
  write_safetensors(dir.path() / "stale.safetensors", std::span(tensors).first(1), DType::kF32);
  EXPECT_THAT(load_error(dir.path()), HasSubstr("stale.safetensors is not named by "
                                                "model.safetensors.index.json"));
}

TEST(HfDirectory, MissingTensorNamesTensorAndDirectory) {
  const ScratchDir dir;
  const ModelWeights source = weights_from_seed(tiny_config(false), 14);
  write_text(dir.path() / "config.json", tiny_config_json(false));
  const auto tensors = without(hf_tensors(source), "model.layers.1.mlp.up_proj.weight");
  write_shards(dir.path(), tensors, 10, DType::kF32);
  const std::string message = load_error(dir.path());
  EXPECT_THAT(message, HasSubstr("'model.layers.1.mlp.up_proj.weight' not found"));
  EXPECT_THAT(message, HasSubstr(dir.path().string()));

  const auto no_head = without(hf_tensors(source), "lm_head.weight");
  write_shards(dir.path(), no_head, 10, DType::kF32);
  EXPECT_THAT(load_error(dir.path()), HasSubstr("'lm_head.weight' not found"));
}

TEST(HfDirectory, WrongShapeAndDuplicateTensor) {
  const ScratchDir dir;
  const ModelWeights source = weights_from_seed(tiny_config(false), 15);
  write_text(dir.path() / "config.json", tiny_config_json(false));
  std::vector<NamedTensor> tensors = hf_tensors(source);
  tensors[2].shape = {16, 256};  // layer 0 q_proj: same element count, wrong shape
  ASSERT_EQ(tensors[2].name, "model.layers.0.self_attn.q_proj.weight");
  write_shards(dir.path(), tensors, 10, DType::kF32);
  const std::string shape_message = load_error(dir.path());
  EXPECT_THAT(shape_message, HasSubstr("model.layers.0.self_attn.q_proj.weight"));
  EXPECT_THAT(shape_message, HasSubstr("expected shape [64, 64], got [16, 256]"));

  // model.norm.weight in both shards.
  const std::vector<NamedTensor> good = hf_tensors(source);
  std::vector<NamedTensor> first(good.begin(), good.begin() + 10);
  first.push_back(good[good.size() - 2]);
  ASSERT_EQ(first.back().name, "model.norm.weight");
  write_safetensors(dir.path() / "model-00001-of-00002.safetensors", first, DType::kF32);
  const std::vector<NamedTensor> second(good.begin() + 10, good.end());
  write_safetensors(dir.path() / "model-00002-of-00002.safetensors", second, DType::kF32);
  const std::string duplicate = load_error(dir.path());
  EXPECT_THAT(duplicate, HasSubstr("'model.norm.weight' appears in both "
                                   "model-00001-of-00002.safetensors and "
                                   "model-00002-of-00002.safetensors"));
}

TEST(HfDirectory, MissingConfigOrShardsOrDirectory) {
  const ScratchDir dir;
  EXPECT_THAT(load_error(dir.path() / "absent"), HasSubstr("does not exist"));
  write_text(dir.path() / "file", "x");
  EXPECT_THAT(load_error(dir.path() / "file"), HasSubstr("is not a directory"));
  EXPECT_THAT(load_error(dir.path()), HasSubstr("no config.json"));
  write_text(dir.path() / "config.json", tiny_config_json(false));
  write_text(dir.path() / "model.bin", "not safetensors");
  EXPECT_THAT(load_error(dir.path()), HasSubstr("no *.safetensors files"));
}

TEST(HfDirectory, BadConfigNamesTheFile) {
  const ScratchDir dir;
  const ModelWeights source = weights_from_seed(tiny_config(false), 16);
  write_shards(dir.path(), hf_tensors(source), 10, DType::kF32);
  std::string config = tiny_config_json(false);
  config.replace(config.find(R"("rope_scaling": null)"), 20, R"("rope_scaling": {"factor": 8})");
  write_text(dir.path() / "config.json", config);
  const std::string message = load_error(dir.path());
  EXPECT_THAT(message, HasSubstr((dir.path() / "config.json").string()));
  EXPECT_THAT(message, HasSubstr("'rope_scaling.factor' is not supported with rope_type \"default\""));
  write_text(dir.path() / "config.json", "{");
  EXPECT_THAT(load_error(dir.path()), HasSubstr("not valid JSON"));
}

// ---- families ------------------------------------------------------------------------------

// The digest of `tiny` from seed 0 as a850c79 (before the families) recorded it in a trace header,
// in the stream form every trace of format versions 3 and 4 carries: the seeded bits and the
// digest of a plain Llama must not have moved, or those traces would no longer replay.
TEST(SeededWeights, TinyDigestIsUnchangedByTheFamilies) {
  EXPECT_EQ(weights_from_seed(model_config_named("tiny"), 0).digest(WeightsDigestForm::kStream),
            0xfba3b684ac54ae9aull);
}

// A stream shorter than a block is one block: the blocks form is then XXH3-64 of the stream
// form's value (its 8 bytes, little-endian), by the definition (core/model/weights.h).
TEST(WeightsDigest, BlocksFormOfAOneBlockModelIsTheDigestOfItsStreamDigest) {
  const ModelWeights tiny = weights_from_seed(model_config_named("tiny"), 0);
  const uint64_t stream = tiny.digest(WeightsDigestForm::kStream);
  EXPECT_EQ(tiny.digest(WeightsDigestForm::kBlocks), XXH3_64bits(&stream, sizeof stream));
  EXPECT_EQ(tiny.digest(), tiny.digest(kWeightsDigestFormRecorded));
  EXPECT_EQ(kWeightsDigestFormRecorded, WeightsDigestForm::kBlocks);
}

// A model of three blocks (two untied 4.5 M-value tensors): its blocks digest is the same on 1 to 4
// threads, differs from its stream digest, and changes with the last value of the last tensor.
TEST(WeightsDigest, BlocksFormOfAManyBlockModelIsTheSameOnAnyThreadsAndSeesEveryValue) {
  ModelConfig config = model_config_named("tiny");
  config.vocab_size = 70'000;  // embedding and lm head 17.9 MB each: three 16 MiB blocks and more
  ModelWeights weights = weights_from_seed(config, 5);
  ASSERT_FALSE(config.tied_embeddings);
  const uint64_t one = weights.digest(WeightsDigestForm::kBlocks, 1);
  for (const int32_t threads : {2, 3, 4}) {
    EXPECT_EQ(weights.digest(WeightsDigestForm::kBlocks, threads), one) << threads << " threads";
  }
  EXPECT_NE(weights.digest(WeightsDigestForm::kStream), one);
  weights.lm_head.back() = std::nextafter(weights.lm_head.back(), 1.0f);
  EXPECT_NE(weights.digest(WeightsDigestForm::kBlocks, 3), one);
}

TEST(WeightsDigest, FormsAreNamedBothWays) {
  for (const WeightsDigestForm form : {WeightsDigestForm::kStream, WeightsDigestForm::kBlocks}) {
    EXPECT_EQ(weights_digest_form_named(to_string(form)), form);
  }
  EXPECT_EQ(to_string(WeightsDigestForm::kStream), "stream");
  EXPECT_EQ(to_string(WeightsDigestForm::kBlocks), "blocks");
  EXPECT_FALSE(weights_digest_form_named("Blocks").has_value());
}

// Threads split a large tensor's elements, never the values: tiny plain, tied, and with both
// family features, whose tensors take one thread each, and a wide model with the features, whose
// products (1M elements) split over up to 4 threads (3 into unequal runs; 100 take 4).
TEST(SeededWeights, ThreadsDoNotChangeTheBits) {
  ModelConfig tied = tiny_config(false);
  tied.tied_embeddings = true;
  ModelConfig families = tiny_config(false);
  families.family = ModelFamily::kQwen2;
  families.qkv_bias = true;
  families.qk_norm = true;
  ModelConfig wide = families;
  wide.hidden_size = 512, wide.query_heads_count = 8, wide.kv_heads_count = 4, wide.head_dim = 64;
  wide.ffn_size = 2048;
  for (const ModelConfig& config : {tiny_config(false), tied, families, wide}) {
    const ModelWeights one = weights_from_seed(config, 7, 1);
    for (const int32_t threads : {3, 4, 100}) {
      SCOPED_TRACE(fmt::format("{} threads, tied {}, qkv_bias {}", threads, config.tied_embeddings,
                               config.qkv_bias));
      const ModelWeights many = weights_from_seed(config, 7, threads);
      expect_same_weights(one, many);
      EXPECT_EQ(one.digest(), many.digest());
    }
  }
  EXPECT_THROW(weights_from_seed(tied, 7, 0), Error);
}

TEST(SeededWeights, FamilyTensorsFollowTheDocumentedIndices) {
  const uint64_t seed = 77;
  SCOPED_TRACE(fmt::format("seed {}", seed));
  ModelConfig config = tiny_config(false);
  config.family = ModelFamily::kQwen2;
  config.qkv_bias = true;
  config.qk_norm = true;  // both features at once, to check every index
  const ModelWeights w = weights_from_seed(config, seed);
  const ModelWeights plain = weights_from_seed(tiny_config(false), seed);
  // The Llama tensors keep their bits; the new ones sit at 3 + 9·L + 5·l + k (L = 2 → base 21).
  expect_same_bits("layer 1 wq", w.layers[1].wq, plain.layers[1].wq);
  expect_same_bits("lm_head", w.lm_head, plain.lm_head);
  ASSERT_EQ(w.layers[0].q_bias.size(), 64u);
  ASSERT_EQ(w.layers[1].k_bias.size(), 32u);
  ASSERT_EQ(w.layers[1].k_norm.size(), 16u);
  EXPECT_EQ(w.layers[0].q_bias[5], philox_value(seed, 21, 5, 0.0f, 0.125f));
  EXPECT_EQ(w.layers[0].v_bias[31], philox_value(seed, 23, 31, 0.0f, 0.125f));
  EXPECT_EQ(w.layers[0].q_norm[15], philox_value(seed, 24, 15, 1.0f, 0.125f));
  EXPECT_EQ(w.layers[1].k_bias[0], philox_value(seed, 27, 0, 0.0f, 0.125f));
  EXPECT_EQ(w.layers[1].k_norm[3], philox_value(seed, 30, 3, 1.0f, 0.125f));
  EXPECT_GT(sum_of_squares(w.layers[1].v_bias), 0.0);
  EXPECT_NO_THROW(w.validate());
}

TEST(WeightDigest, CoversBiasesHeadNormsAndTheFamilyFields) {
  ModelConfig config = tiny_config(false);
  config.family = ModelFamily::kQwen3;
  config.qkv_bias = true;
  config.qk_norm = true;
  const ModelWeights base = weights_from_seed(config, 5);
  const uint64_t digest = base.digest();
  auto changed = [&](auto mutate) {
    ModelWeights copy = base;
    mutate(copy);
    return copy.digest() != digest;
  };
  EXPECT_TRUE(changed([](ModelWeights& w) { w.layers[0].q_bias[1] += 1.0f; }));
  EXPECT_TRUE(changed([](ModelWeights& w) { w.layers[1].k_bias[2] += 1.0f; }));
  EXPECT_TRUE(changed([](ModelWeights& w) { w.layers[1].v_bias[3] += 1.0f; }));
  EXPECT_TRUE(changed([](ModelWeights& w) { w.layers[0].q_norm[4] += 1.0f; }));
  EXPECT_TRUE(changed([](ModelWeights& w) { w.layers[1].k_norm[5] += 1.0f; }));
  EXPECT_TRUE(changed([](ModelWeights& w) { w.config.family = ModelFamily::kQwen2; }));
  EXPECT_TRUE(changed([](ModelWeights& w) { w.config.rope_type = RopeType::kLinear; }));
  EXPECT_TRUE(changed([](ModelWeights& w) { w.config.rope_factor = 2.0f; }));
  EXPECT_TRUE(changed([](ModelWeights& w) { w.config.rope_original_max_positions = 4096; }));
  EXPECT_TRUE(changed([](ModelWeights& w) { w.config.partial_rotary_dim = 8; }));
}

TEST(NamedShapes, QwenShapesAreTheReleasedModels) {
  const ModelConfig q3 = model_config_named("qwen3-0.6b");
  EXPECT_EQ(q3.family, ModelFamily::kQwen3);
  EXPECT_TRUE(q3.qk_norm);
  EXPECT_FALSE(q3.qkv_bias);
  EXPECT_TRUE(q3.tied_embeddings);
  EXPECT_EQ(q3.hidden_size, 1024);
  EXPECT_EQ(q3.layers_count, 28);
  EXPECT_EQ(q3.query_heads_count, 16);
  EXPECT_EQ(q3.kv_heads_count, 8);
  EXPECT_EQ(q3.head_dim, 128);  // not hidden / heads = 64
  EXPECT_EQ(q3.ffn_size, 3072);
  EXPECT_EQ(q3.vocab_size, 151936);
  EXPECT_EQ(q3.rope_theta, 1e6f);
  // Qwen3-0.6B has 596 M parameters with its tied head (0.44 B without the embedding).
  EXPECT_EQ(q3.parameters_count(), 596049920);
  const ModelConfig q25 = model_config_named("qwen2.5-7b");
  EXPECT_EQ(q25.family, ModelFamily::kQwen2);
  EXPECT_TRUE(q25.qkv_bias);
  EXPECT_FALSE(q25.qk_norm);
  EXPECT_FALSE(q25.tied_embeddings);
  EXPECT_EQ(q25.hidden_size, 3584);
  EXPECT_EQ(q25.query_heads_count, 28);
  EXPECT_EQ(q25.kv_heads_count, 4);
  EXPECT_EQ(q25.ffn_size, 18944);
  EXPECT_EQ(q25.vocab_size, 152064);
  // Qwen2.5-7B's published count: 7.62 B.
  EXPECT_EQ(q25.parameters_count(), 7615616512);
}

// Random corruptions of real configs (each fixture family's) end in a clean ls::Error or a
// config that validates — never a crash or another exception type (STYLE.md §18).
TEST(HfConfigFuzz, CorruptedConfigsFailCleanly) {
  const uint64_t seed = 0xC0F16;
  SCOPED_TRACE(fmt::format("seed {:#x}", seed));
  uint64_t state = seed;
  auto next = [&state] {  // splitmix64
    uint64_t z = (state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  };
  int errors_count = 0, accepted_count = 0;
  for (const char* family : {"llama3", "llama3-legacy", "llama-linear", "qwen2", "qwen3", "mistral"}) {
    std::ifstream in(fs::path(LOCKSTEP_SOURCE_DIR) / "tests/fixtures/hf" / family / "config.json");
    const std::string valid{std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
    ASSERT_FALSE(valid.empty()) << family;
    EXPECT_NO_THROW(model_config_from_hf_json(valid, family)) << family;
    for (int round = 0; round < 400; ++round) {
      std::string text = valid;
      const uint64_t flips = 1 + next() % 3;
      for (uint64_t f = 0; f < flips; ++f) {
        const size_t at = next() % text.size();
        // Digits and JSON punctuation reach the value checks more often than random bytes.
        const char alphabet[] = "0123456789-.eE,:{}[]\"ntf ";
        text[at] = next() % 2 ? alphabet[next() % (sizeof(alphabet) - 1)] : static_cast<char>(next());
      }
      try {
        model_config_from_hf_json(text, family).validate();
        ++accepted_count;
      } catch (const Error&) {
        ++errors_count;
      }
    }
  }
  EXPECT_GT(errors_count, 1000);  // the corruptions did reach the checks
  std::printf("config fuzz: %d refused, %d accepted (a corruption can leave a valid config)\n",
              errors_count, accepted_count);
}

}  // namespace
}  // namespace ls
