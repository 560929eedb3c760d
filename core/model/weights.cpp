#include "core/model/weights.h"

#include "core/check.h"
#include "core/host_memory.h"
#include "core/model/safetensors.h"
#include "core/sampling.h"

#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <xxhash.h>

#include <algorithm>
#include <array>
#include <bit>
#include <cmath>
#include <fstream>
#include <iterator>
#include <limits>
#include <map>
#include <memory>
#include <optional>

namespace ls {
namespace {

using Json = nlohmann::json;

// The digest hashes fp32 bytes as they sit in memory; that is only platform-stable on
// little-endian hosts, which is every host lockstep targets.
static_assert(std::endian::native == std::endian::little, "weight digest assumes little-endian");

// config.json is a few kilobytes; anything this large is not a model config.
constexpr std::uintmax_t kConfigBytesMax = std::uintmax_t{16} << 20;

// The widths a weight dimension can take, resolved against a ModelConfig.
enum class Dim : uint8_t { kNone, kHidden, kQ, kKv, kFfn };

int64_t dim_size(const ModelConfig& config, Dim dim) {
  switch (dim) {
    case Dim::kNone: return 0;
    case Dim::kHidden: return config.hidden_size;
    case Dim::kQ: return config.q_size();
    case Dim::kKv: return config.kv_size();
    case Dim::kFfn: return config.ffn_size;
  }
  LS_ASSERT(false, "dim {}", static_cast<int>(dim));
}

// One per-layer tensor: where it lives, its Hugging Face name after "model.layers.{i}.", and its
// shape [rows] (a norm, cols = kNone) or [rows, cols] = [out, in].
struct LayerTensorSpec {
  std::vector<float> LayerWeights::*field;
  const char* hf_suffix;
  Dim rows;
  Dim cols;
};

// In LayerWeights field order. This order is part of the seeded weights and of the digest:
// reordering it changes every seeded model and every recorded digest.
constexpr std::array<LayerTensorSpec, 9> kLayerTensors = {{
    {&LayerWeights::attn_norm, "input_layernorm.weight", Dim::kHidden, Dim::kNone},
    {&LayerWeights::wq, "self_attn.q_proj.weight", Dim::kQ, Dim::kHidden},
    {&LayerWeights::wk, "self_attn.k_proj.weight", Dim::kKv, Dim::kHidden},
    {&LayerWeights::wv, "self_attn.v_proj.weight", Dim::kKv, Dim::kHidden},
    {&LayerWeights::wo, "self_attn.o_proj.weight", Dim::kHidden, Dim::kQ},
    {&LayerWeights::ffn_norm, "post_attention_layernorm.weight", Dim::kHidden, Dim::kNone},
    {&LayerWeights::w_gate, "mlp.gate_proj.weight", Dim::kFfn, Dim::kHidden},
    {&LayerWeights::w_up, "mlp.up_proj.weight", Dim::kFfn, Dim::kHidden},
    {&LayerWeights::w_down, "mlp.down_proj.weight", Dim::kHidden, Dim::kFfn},
}};

std::vector<int64_t> spec_shape(const ModelConfig& config, const LayerTensorSpec& spec) {
  if (spec.cols == Dim::kNone) return {dim_size(config, spec.rows)};
  return {dim_size(config, spec.rows), dim_size(config, spec.cols)};
}

// ---- Seeded weights ------------------------------------------------------------------------
//
// Element i of tensor t is a function of Philox4x32-10 word 0 at key = seed, counter0 = i,
// counter1 = t, mapped to u in [0, 1) by uniform_from_bits. Tensor indices t:
//   0                embedding                      [vocab, hidden]
//   1 + 9·l + k      layer l, k = 0..8 in LayerWeights field order (kLayerTensors):
//                    attn_norm, wq, wk, wv, wo, ffn_norm, w_gate, w_up, w_down
//   1 + 9·L          final_norm                     [hidden]
//   2 + 9·L          lm_head, only when embeddings are not tied   [vocab, hidden]
// Values: linear weights bound·(2u − 1) with bound = 1/sqrt(in); embeddings 2u − 1; norms
// 1 + (2u − 1)/8. 2u − 1 is exact (u has 24 bits) and so is the /8, so each value takes at most
// one rounding and a fused multiply-add could not change it: the bits are the same everywhere.

constexpr uint32_t kLayerTensorsCount = kLayerTensors.size();

// value = center + half_width·(2u − 1)
std::vector<float> seeded_tensor(uint64_t seed, uint32_t tensor_index, int64_t count,
                                 float center, float half_width) {
  std::vector<float> values(static_cast<size_t>(count));
  for (size_t i = 0; i < values.size(); ++i) {
    const uint32_t bits = philox4x32_10(seed, i, tensor_index)[0];
    const float symmetric = 2.0f * uniform_from_bits(bits) - 1.0f;
    values[i] = center + half_width * symmetric;
  }
  return values;
}

std::vector<float> seeded_linear(uint64_t seed, uint32_t tensor_index, int64_t rows,
                                 int64_t cols) {
  const float bound = 1.0f / std::sqrt(static_cast<float>(cols));
  return seeded_tensor(seed, tensor_index, rows * cols, 0.0f, bound);
}

std::vector<float> seeded_norm(uint64_t seed, uint32_t tensor_index, int64_t size) {
  return seeded_tensor(seed, tensor_index, size, 1.0f, 0.125f);
}

// ---- Digest --------------------------------------------------------------------------------

class Xxh3Stream {
 public:
  Xxh3Stream() : state_(XXH3_createState()) {
    LS_ASSERT(state_ != nullptr, "XXH3_createState failed");
    const XXH_errorcode reset = XXH3_64bits_reset(state_.get());
    LS_ASSERT(reset == XXH_OK, "XXH3_64bits_reset failed");
  }
  void update(const void* data, size_t size_bytes) {
    if (size_bytes == 0) return;
    const XXH_errorcode status = XXH3_64bits_update(state_.get(), data, size_bytes);
    LS_ASSERT(status == XXH_OK, "XXH3_64bits_update of {} bytes failed", size_bytes);
  }
  void update(std::span<const float> values) { update(values.data(), values.size_bytes()); }
  uint64_t digest() const { return XXH3_64bits_digest(state_.get()); }

 private:
  struct Free {
    void operator()(XXH3_state_t* state) const { XXH3_freeState(state); }
  };
  std::unique_ptr<XXH3_state_t, Free> state_;
};

// The shape fields as one fixed-format line, floats by bit pattern so the text is exact. The name
// is left out on purpose: it is a label, and the same weights loaded from a directory or built
// from a seed under another name must digest the same.
std::string config_canonical_text(const ModelConfig& c) {
  return fmt::format(
      "lockstep.model_config.v1 hidden_size={} layers_count={} query_heads_count={} "
      "kv_heads_count={} head_dim={} ffn_size={} vocab_size={} rope_theta_bits={:08x} "
      "rms_eps_bits={:08x} tied_embeddings={}\n",
      c.hidden_size, c.layers_count, c.query_heads_count, c.kv_heads_count, c.head_dim,
      c.ffn_size, c.vocab_size, std::bit_cast<uint32_t>(c.rope_theta),
      std::bit_cast<uint32_t>(c.rms_eps), c.tied_embeddings ? 1 : 0);
}

// ---- Hugging Face config -------------------------------------------------------------------

// Present and not null. HF writes null for "use the default", so null counts as absent.
const Json* find_set(const Json& json, const char* key) {
  const auto it = json.find(key);
  return it == json.end() || it->is_null() ? nullptr : &*it;
}

int32_t int32_field(const Json& value, const char* key, const std::string& name) {
  LS_REQUIRE(value.is_number_integer(), "HF config '{}': '{}' must be an integer, got {}", name,
             key, value.type_name());
  const bool fits = value.is_number_unsigned()
                        ? value.get<uint64_t>() <= uint64_t{std::numeric_limits<int32_t>::max()}
                        : value.get<int64_t>() >= std::numeric_limits<int32_t>::min();
  LS_REQUIRE(fits, "HF config '{}': '{}' = {} does not fit in int32", name, key, value.dump());
  return static_cast<int32_t>(value.get<int64_t>());
}

int32_t required_int32(const Json& json, const char* key, const std::string& name) {
  const Json* value = find_set(json, key);
  LS_REQUIRE(value != nullptr, "HF config '{}': missing required key '{}'", name, key);
  return int32_field(*value, key, name);
}

std::optional<int32_t> optional_int32(const Json& json, const char* key, const std::string& name) {
  const Json* value = find_set(json, key);
  if (value == nullptr) return std::nullopt;
  return int32_field(*value, key, name);
}

float optional_float(const Json& json, const char* key, float fallback, const std::string& name) {
  const Json* value = find_set(json, key);
  if (value == nullptr) return fallback;
  LS_REQUIRE(value->is_number(), "HF config '{}': '{}' must be a number, got {}", name, key,
             value->type_name());
  const auto number = value->get<double>();
  LS_REQUIRE(std::isfinite(number) && std::abs(number) <= std::numeric_limits<float>::max(),
             "HF config '{}': '{}' = {} is out of float range", name, key, number);
  return static_cast<float>(number);
}

bool optional_bool(const Json& json, const char* key, bool fallback, const std::string& name) {
  const Json* value = find_set(json, key);
  if (value == nullptr) return fallback;
  LS_REQUIRE(value->is_boolean(), "HF config '{}': '{}' must be true or false, got {}", name, key,
             value->type_name());
  return value->get<bool>();
}

// Features the Llama step does not implement: refuse them rather than run a different model.
void reject_unsupported(const Json& json, const std::string& name) {
  for (const char* key : {"attention_bias", "mlp_bias"}) {
    LS_REQUIRE(!optional_bool(json, key, false, name),
               "HF config '{}': '{}': true is not supported (Llama without biases only)", name,
               key);
  }
  const Json* scaling = find_set(json, "rope_scaling");
  LS_REQUIRE(scaling == nullptr, "HF config '{}': 'rope_scaling' {} is not supported yet", name,
             scaling == nullptr ? "" : scaling->dump());
  const Json* act = find_set(json, "hidden_act");
  if (act == nullptr) return;  // LlamaConfig's default is silu
  LS_REQUIRE(act->is_string(), "HF config '{}': 'hidden_act' must be a string, got {}", name,
             act->type_name());
  LS_REQUIRE(act->get_ref<const std::string&>() == "silu",
             "HF config '{}': 'hidden_act' {} is not supported (only \"silu\")", name, act->dump());
}

// ---- Hugging Face directory ----------------------------------------------------------------

std::string read_text_file(const std::filesystem::path& path) {
  std::error_code error;
  const std::uintmax_t size = std::filesystem::file_size(path, error);
  LS_REQUIRE(!error, "{}: cannot read: {}", path.string(), error.message());
  LS_REQUIRE(size <= kConfigBytesMax, "{}: {} bytes is larger than the limit of {} bytes",
             path.string(), size, kConfigBytesMax);
  std::ifstream in(path, std::ios::binary);
  LS_REQUIRE(in.is_open(), "{}: cannot open", path.string());
  std::string text{std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
  LS_REQUIRE(!in.bad(), "{}: read failed", path.string());
  return text;
}

// Every tensor of every *.safetensors file in a directory, each name owned by exactly one file.
class TensorDirectory {
 public:
  explicit TensorDirectory(const std::filesystem::path& directory);
  std::vector<float> read(const std::string& name, const std::vector<int64_t>& shape) const;

 private:
  std::filesystem::path directory_;
  std::vector<SafetensorsFile> files_;
  std::map<std::string, size_t> owner_;  // tensor name → index in files_
};

TensorDirectory::TensorDirectory(const std::filesystem::path& directory) : directory_(directory) {
  // error_code overloads throughout: a filesystem_error would escape as something other than
  // ls::Error. is_regular_file follows symlinks, as in Hugging Face cache snapshots.
  std::vector<std::filesystem::path> paths;
  std::error_code error;
  for (auto it = std::filesystem::directory_iterator(directory, error);
       !error && it != std::filesystem::directory_iterator(); it.increment(error)) {
    std::error_code ignored;  // an entry we cannot stat is not a shard we can read
    if (it->is_regular_file(ignored) && it->path().extension() == ".safetensors") {
      paths.push_back(it->path());
    }
  }
  LS_REQUIRE(!error, "model directory {}: cannot list: {}", directory.string(), error.message());
  LS_REQUIRE(!paths.empty(), "model directory {}: no *.safetensors files", directory.string());
  std::ranges::sort(paths);  // directory order is unspecified; errors must not depend on it
  for (const auto& path : paths) {
    files_.push_back(SafetensorsFile::open(path));
    for (const TensorInfo& info : files_.back().tensors()) {
      const auto [it, inserted] = owner_.emplace(info.name, files_.size() - 1);
      LS_REQUIRE(inserted, "model directory {}: tensor '{}' appears in both {} and {}",
                 directory.string(), info.name, files_[it->second].path().filename().string(),
                 path.filename().string());
    }
  }
}

std::vector<float> TensorDirectory::read(const std::string& name,
                                         const std::vector<int64_t>& shape) const {
  const auto it = owner_.find(name);
  LS_REQUIRE(it != owner_.end(), "model directory {}: tensor '{}' not found in any of its {} "
             "*.safetensors files", directory_.string(), name, files_.size());
  return files_[it->second].read_f32(name, shape);
}

std::string directory_label(const std::filesystem::path& directory) {
  const std::filesystem::path normal = directory.lexically_normal();
  const std::filesystem::path last = normal.has_filename() ? normal.filename()
                                                           : normal.parent_path().filename();
  return last.empty() ? directory.string() : last.string();
}

ModelConfig read_hf_config(const std::filesystem::path& directory) {
  const std::filesystem::path path = directory / "config.json";
  std::error_code error;
  LS_REQUIRE(std::filesystem::is_regular_file(path, error), "model directory {}: no config.json",
             directory.string());
  const std::string text = read_text_file(path);
  try {
    return model_config_from_hf_json(text, directory_label(directory));
  } catch (const Error& e) {  // add the file, which model_config_from_hf_json does not know
    throw Error(fmt::format("{}: {}", path.string(), e.what()));
  }
}

}  // namespace

ModelWeights weights_from_seed(const ModelConfig& config, uint64_t seed) {
  config.validate();
  // Tensor indices up to 2 + 9·L must fit Philox's 32-bit counter word.
  const auto layers_count = static_cast<uint32_t>(config.layers_count);  // > 0 after validate()
  LS_REQUIRE(layers_count <= (std::numeric_limits<uint32_t>::max() - 2) / kLayerTensorsCount,
             "weights_from_seed: layers_count {} is too large", layers_count);
  require_host_memory(static_cast<uint64_t>(config.parameters_count()) * sizeof(float),
                      fmt::format("the fp32 weights of model '{}' ({} parameters)", config.name,
                                  config.parameters_count()));
  const int64_t hidden = config.hidden_size;
  const int64_t vocab = config.vocab_size;
  ModelWeights weights;
  weights.config = config;
  uint32_t tensor_index = 0;
  weights.embedding = seeded_tensor(seed, tensor_index++, vocab * hidden, 0.0f, 1.0f);
  weights.layers.resize(static_cast<size_t>(config.layers_count));
  for (LayerWeights& layer : weights.layers) {
    for (const LayerTensorSpec& spec : kLayerTensors) {
      const int64_t rows = dim_size(config, spec.rows);
      layer.*spec.field = spec.cols == Dim::kNone
                              ? seeded_norm(seed, tensor_index, rows)
                              : seeded_linear(seed, tensor_index, rows, dim_size(config, spec.cols));
      ++tensor_index;
    }
  }
  weights.final_norm = seeded_norm(seed, tensor_index++, hidden);
  if (!config.tied_embeddings) weights.lm_head = seeded_linear(seed, tensor_index++, vocab, hidden);
  // embedding + 9 per layer + final_norm (+ lm_head)
  LS_ASSERT(tensor_index == 2 + kLayerTensorsCount * layers_count + (config.tied_embeddings ? 0 : 1),
            "tensor index {} after {} layers", tensor_index, layers_count);
  return weights;
}

uint64_t ModelWeights::digest() const {
  Xxh3Stream stream;
  const std::string config_text = config_canonical_text(config);
  stream.update(config_text.data(), config_text.size());
  stream.update(embedding);
  for (const LayerWeights& layer : layers) {
    for (const LayerTensorSpec& spec : kLayerTensors) stream.update(layer.*spec.field);
  }
  stream.update(final_norm);
  if (!config.tied_embeddings) stream.update(lm_head_view());
  return stream.digest();
}

ModelConfig model_config_from_hf_json(const std::string& json_text, const std::string& name) {
  const Json json = Json::parse(json_text, nullptr, /*allow_exceptions=*/false);
  LS_REQUIRE(!json.is_discarded(), "HF config '{}': not valid JSON", name);
  LS_REQUIRE(json.is_object(), "HF config '{}': must be a JSON object, got {}", name,
             json.type_name());
  reject_unsupported(json, name);
  ModelConfig c;
  c.name = name;
  c.hidden_size = required_int32(json, "hidden_size", name);
  c.layers_count = required_int32(json, "num_hidden_layers", name);
  c.query_heads_count = required_int32(json, "num_attention_heads", name);
  c.kv_heads_count = optional_int32(json, "num_key_value_heads", name).value_or(c.query_heads_count);
  c.ffn_size = required_int32(json, "intermediate_size", name);
  c.vocab_size = required_int32(json, "vocab_size", name);
  const std::optional<int32_t> head_dim = optional_int32(json, "head_dim", name);
  if (head_dim.has_value()) {
    c.head_dim = *head_dim;
  } else {
    // HF's default is hidden_size / num_attention_heads; refuse to guess when it is not exact.
    LS_REQUIRE(c.query_heads_count > 0 && c.hidden_size % c.query_heads_count == 0,
               "HF config '{}': no 'head_dim', and hidden_size {} is not a multiple of "
               "num_attention_heads {}", name, c.hidden_size, c.query_heads_count);
    c.head_dim = c.hidden_size / c.query_heads_count;
  }
  c.rope_theta = optional_float(json, "rope_theta", 10000.0f, name);
  c.rms_eps = optional_float(json, "rms_norm_eps", 1e-6f, name);
  c.tied_embeddings = optional_bool(json, "tie_word_embeddings", false, name);
  c.validate();
  return c;
}

ModelWeights load_hf_directory(const std::filesystem::path& directory) {
  std::error_code error;
  LS_REQUIRE(std::filesystem::is_directory(directory, error),
             "model directory {} does not exist or is not a directory", directory.string());
  ModelWeights weights;
  weights.config = read_hf_config(directory);
  const ModelConfig& config = weights.config;
  const TensorDirectory tensors(directory);
  const std::vector<int64_t> vocab_by_hidden = {config.vocab_size, config.hidden_size};
  weights.embedding = tensors.read("model.embed_tokens.weight", vocab_by_hidden);
  weights.layers.resize(static_cast<size_t>(config.layers_count));
  for (size_t i = 0; i < weights.layers.size(); ++i) {
    for (const LayerTensorSpec& spec : kLayerTensors) {
      const std::string name = fmt::format("model.layers.{}.{}", i, spec.hf_suffix);
      weights.layers[i].*spec.field = tensors.read(name, spec_shape(config, spec));
    }
  }
  weights.final_norm = tensors.read("model.norm.weight", {config.hidden_size});
  // With tied embeddings some checkpoints still carry a copy of lm_head.weight; it is ignored.
  if (!config.tied_embeddings) weights.lm_head = tensors.read("lm_head.weight", vocab_by_hidden);
  return weights;
}

}  // namespace ls
