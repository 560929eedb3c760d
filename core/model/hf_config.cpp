// config.json of a Hugging Face checkpoint → ModelConfig.
//
// Policy ("nothing ignored", DESIGN.md "Models"): every key of config.json falls in one of three
// classes, and a key in none of them is refused by name, because an unknown key may be a feature
// whose absence would silently change what the model computes:
//  - implemented: read and applied — the shape, rms_norm_eps, tie_word_embeddings, the RoPE
//    parameters in either form (rope_parameters, or rope_theta + rope_scaling), the family's
//    features (Qwen2's q/k/v biases, Qwen3's q/k head norms), max_position_embeddings (a bound on
//    the context), and the sliding window (a bound too: attention over a context longer than the
//    window is not implemented, so check_context_length refuses it with the window's value);
//  - checked: accepted only at the value that leaves the arithmetic unchanged, refused by name
//    and value otherwise — hidden_act "silu", attention_bias and mlp_bias false, pretraining_tp 1,
//    attention_dropout 0, layer_types all "full_attention" (or sliding, with the window above),
//    max_window_layers when no layer slides, quantization_config absent;
//  - known harmless: metadata that changes no arithmetic — the token ids (bos/eos/pad), dtype and
//    torch_dtype (the backend decides its precision: fp32 on the CPU, bf16 or fp32 on CUDA),
//    transformers_version, _name_or_path, initializer_range (training only), use_cache (lockstep
//    always keeps a KV cache).
#include "core/check.h"
#include "core/model/strict_json.h"
#include "core/model/weights.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <limits>
#include <optional>
#include <string_view>

namespace ls {
namespace {

using Json = nlohmann::json;

struct FamilyNames {
  ModelFamily family;
  std::string_view architecture;
  std::string_view model_type;
};

constexpr std::array<FamilyNames, 5> kFamilies = {{
    {ModelFamily::kLlama, "LlamaForCausalLM", "llama"},
    {ModelFamily::kQwen2, "Qwen2ForCausalLM", "qwen2"},
    {ModelFamily::kQwen3, "Qwen3ForCausalLM", "qwen3"},
    {ModelFamily::kMistral, "MistralForCausalLM", "mistral"},
    {ModelFamily::kBamba, "BambaForCausalLM", "bamba"},
}};

// Keys every family reads (implemented or checked) and the harmless metadata.
constexpr std::array<std::string_view, 27> kCommonKeys = {
    "architectures", "model_type", "hidden_size", "num_hidden_layers", "num_attention_heads",
    "num_key_value_heads", "intermediate_size", "vocab_size", "head_dim",
    "max_position_embeddings", "rms_norm_eps", "hidden_act", "tie_word_embeddings", "rope_theta",
    "rope_scaling", "rope_parameters", "attention_dropout", "quantization_config",
    // harmless
    "_name_or_path", "transformers_version", "torch_dtype", "dtype", "bos_token_id",
    "eos_token_id", "pad_token_id", "use_cache", "initializer_range"};

// Keys only some families' configs have (each is implemented or checked below).
std::vector<std::string_view> family_keys(ModelFamily family) {
  switch (family) {
    case ModelFamily::kLlama: return {"attention_bias", "mlp_bias", "pretraining_tp"};
    case ModelFamily::kMistral: return {"sliding_window"};
    case ModelFamily::kQwen2:
      return {"sliding_window", "use_sliding_window", "max_window_layers", "layer_types"};
    case ModelFamily::kQwen3:
      return {"attention_bias", "sliding_window", "use_sliding_window", "max_window_layers",
              "layer_types"};
    case ModelFamily::kBamba:
      // read_mamba: implemented (the layer table and the mixer's shape, conv bias, the time-step
      // clamp, partial_rotary_factor) or checked (mamba_proj_bias false); known harmless:
      // time_step_min/max (they bound dt_bias's initialisation), z_loss_coefficient (a training
      // loss), num_logits_to_keep (which logits generate() computes), mamba_chunk_size (the
      // chunked scan's block size: the same recurrence summed in another order).
      return {"attention_bias", "mlp_bias", "attn_layer_indices", "mamba_n_heads", "mamba_d_head",
              "mamba_n_groups", "mamba_d_state", "mamba_d_conv", "mamba_expand",
              "mamba_chunk_size", "mamba_conv_bias", "mamba_proj_bias", "time_step_min",
              "time_step_max", "time_step_limit", "z_loss_coefficient", "num_logits_to_keep",
              "partial_rotary_factor"};
  }
  return {};
}

// Present and not null. HF writes null for "use the default", so null counts as absent.
const Json* find_set(const Json& json, const char* key) {
  const auto it = json.find(key);
  return it == json.end() || it->is_null() ? nullptr : &*it;
}

int32_t int32_field(const Json& value, const std::string& key, const std::string& name) {
  LS_REQUIRE(value.is_number_integer(), "HF config '{}': '{}' must be an integer, got {}", name,
             key, value.type_name());
  const bool fits = value.is_number_unsigned()
                        ? value.get<uint64_t>() <= uint64_t{std::numeric_limits<int32_t>::max()}
                        : value.get<int64_t>() >= std::numeric_limits<int32_t>::min();
  LS_REQUIRE(fits, "HF config '{}': '{}' = {} does not fit in int32", name, key, value.dump());
  return static_cast<int32_t>(value.get<int64_t>());
}

float float_field(const Json& value, const std::string& key, const std::string& name) {
  LS_REQUIRE(value.is_number(), "HF config '{}': '{}' must be a number, got {}", name, key,
             value.type_name());
  const auto number = value.get<double>();
  LS_REQUIRE(std::isfinite(number) && std::abs(number) <= std::numeric_limits<float>::max(),
             "HF config '{}': '{}' = {} is out of float range", name, key, number);
  return static_cast<float>(number);
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
  return value == nullptr ? fallback : float_field(*value, key, name);
}

bool optional_bool(const Json& json, const char* key, bool fallback, const std::string& name) {
  const Json* value = find_set(json, key);
  if (value == nullptr) return fallback;
  LS_REQUIRE(value->is_boolean(), "HF config '{}': '{}' must be true or false, got {}", name, key,
             value->type_name());
  return value->get<bool>();
}

std::string supported_architectures() {
  std::vector<std::string_view> names;
  for (const FamilyNames& f : kFamilies) names.push_back(f.architecture);
  return fmt::format("{}", fmt::join(names, ", "));
}

std::optional<ModelFamily> family_of_architectures(const Json* value, const std::string& name) {
  if (value == nullptr) return std::nullopt;
  LS_REQUIRE(value->is_array() && value->size() == 1 && (*value)[0].is_string(),
             "HF config '{}': 'architectures' must be a list of one name, got {}", name,
             value->dump());
  const std::string& architecture = (*value)[0].get_ref<const std::string&>();
  for (const FamilyNames& f : kFamilies) {
    if (f.architecture == architecture) return f.family;
  }
  throw Error(fmt::format("HF config '{}': 'architectures' {} is not supported (supported: {})",
                          name, value->dump(), supported_architectures()));
}

std::optional<ModelFamily> family_of_model_type(const Json* value, const std::string& name) {
  if (value == nullptr) return std::nullopt;
  LS_REQUIRE(value->is_string(), "HF config '{}': 'model_type' must be a string, got {}", name,
             value->type_name());
  for (const FamilyNames& f : kFamilies) {
    if (f.model_type == value->get_ref<const std::string&>()) return f.family;
  }
  throw Error(fmt::format("HF config '{}': 'model_type' {} is not supported (supported: llama, "
                          "qwen2, qwen3, mistral, bamba)", name, value->dump()));
}

// The family named by `architectures` and `model_type` (either may be absent, not both; when both
// are given they must agree).
ModelFamily read_family(const Json& json, const std::string& name) {
  const std::optional<ModelFamily> by_architecture =
      family_of_architectures(find_set(json, "architectures"), name);
  const std::optional<ModelFamily> by_type = family_of_model_type(find_set(json, "model_type"), name);
  LS_REQUIRE(by_architecture || by_type,
             "HF config '{}': names no 'architectures' or 'model_type', so its family is unknown "
             "(supported: {})", name, supported_architectures());
  LS_REQUIRE(!by_architecture || !by_type || *by_architecture == *by_type,
             "HF config '{}': 'architectures' says {} but 'model_type' says {}", name,
             architecture_name(*by_architecture), to_string(*by_type));
  return by_architecture ? *by_architecture : *by_type;
}

void refuse_unknown_keys(const Json& json, ModelFamily family, const std::string& name) {
  const std::vector<std::string_view> extra = family_keys(family);
  for (const auto& [key, value] : json.items()) {
    const bool known = std::ranges::find(kCommonKeys, key) != kCommonKeys.end() ||
                       std::ranges::find(extra, key) != extra.end();
    LS_REQUIRE(known, "HF config '{}': key '{}' is not supported for {} (lockstep refuses a key it "
               "does not implement rather than ignore it)", name, key, architecture_name(family));
  }
}

void require_false(const Json& json, const char* key, const std::string& name, const char* why) {
  LS_REQUIRE(!optional_bool(json, key, false, name), "HF config '{}': '{}': true is not supported "
             "({})", name, key, why);
}

// The checked keys: each accepted only where it leaves the arithmetic unchanged.
void check_neutral_values(const Json& json, ModelFamily family, const std::string& name) {
  const Json* act = find_set(json, "hidden_act");
  if (act != nullptr) {  // every family's default is silu
    LS_REQUIRE(act->is_string(), "HF config '{}': 'hidden_act' must be a string, got {}", name,
               act->type_name());
    LS_REQUIRE(act->get_ref<const std::string&>() == "silu",
               "HF config '{}': 'hidden_act' {} is not supported (only \"silu\")", name, act->dump());
  }
  if (family == ModelFamily::kLlama || family == ModelFamily::kQwen3 ||
      family == ModelFamily::kBamba) {
    require_false(json, "attention_bias", name, "q/k/v/o projection biases are implemented for "
                  "Qwen2ForCausalLM only");
  }
  if (family == ModelFamily::kLlama || family == ModelFamily::kBamba) {
    require_false(json, "mlp_bias", name, "MLP biases are not implemented");
  }
  if (family == ModelFamily::kLlama) {
    const std::optional<int32_t> tp = optional_int32(json, "pretraining_tp", name);
    LS_REQUIRE(tp.value_or(1) == 1, "HF config '{}': 'pretraining_tp' = {} is not supported (only 1)",
               name, tp.value_or(1));
  }
  const float dropout = optional_float(json, "attention_dropout", 0.0f, name);
  LS_REQUIRE(dropout == 0.0f, "HF config '{}': 'attention_dropout' = {} is not supported (only 0)",
             name, dropout);
  const Json* quantization = find_set(json, "quantization_config");
  LS_REQUIRE(quantization == nullptr, "HF config '{}': 'quantization_config' {} is not supported "
             "(lockstep loads bf16, fp16 or fp32 weights only)", name,
             quantization == nullptr ? "" : quantization->dump());
}

void read_shape(const Json& json, ModelFamily family, ModelConfig& c) {
  const std::string& name = c.name;
  c.hidden_size = required_int32(json, "hidden_size", name);
  c.layers_count = required_int32(json, "num_hidden_layers", name);
  c.query_heads_count = required_int32(json, "num_attention_heads", name);
  // LlamaConfig defaults the KV heads to the query heads; the other families' defaults differ
  // between transformers versions, so they must say.
  c.kv_heads_count = family == ModelFamily::kLlama
                         ? optional_int32(json, "num_key_value_heads", name).value_or(c.query_heads_count)
                         : required_int32(json, "num_key_value_heads", name);
  c.ffn_size = required_int32(json, "intermediate_size", name);
  c.vocab_size = required_int32(json, "vocab_size", name);
  const std::optional<int32_t> head_dim = optional_int32(json, "head_dim", name);
  if (head_dim.has_value()) {
    c.head_dim = *head_dim;
  } else if (family == ModelFamily::kQwen3) {
    c.head_dim = 128;  // Qwen3Config's default, independent of hidden_size
  } else {
    // HF's default is hidden_size / num_attention_heads; refuse to guess when it is not exact.
    LS_REQUIRE(c.query_heads_count > 0 && c.hidden_size % c.query_heads_count == 0,
               "HF config '{}': no 'head_dim', and hidden_size {} is not a multiple of "
               "num_attention_heads {}", name, c.hidden_size, c.query_heads_count);
    c.head_dim = c.hidden_size / c.query_heads_count;
  }
  c.rms_eps = optional_float(json, "rms_norm_eps", family == ModelFamily::kBamba ? 1e-5f : 1e-6f,
                             name);
  c.tied_embeddings = optional_bool(json, "tie_word_embeddings", false, name);
  // transformers' defaults when the key is absent.
  const int32_t default_max_positions = family == ModelFamily::kLlama     ? 2048
                                        : family == ModelFamily::kMistral ? 131072
                                        : family == ModelFamily::kBamba   ? 262144
                                                                          : 32768;
  c.max_positions =
      optional_int32(json, "max_position_embeddings", name).value_or(default_max_positions);
  LS_REQUIRE(c.max_positions > 0, "HF config '{}': 'max_position_embeddings' must be > 0, got {}",
             name, c.max_positions);
  c.qkv_bias = family == ModelFamily::kQwen2;
  c.qk_norm = family == ModelFamily::kQwen3;
}

// One RoPE parameter object: rope_parameters (transformers 5) or the legacy rope_scaling. `where`
// names it in errors. The keys each rope type reads are required and every other key refused.
void read_rope_object(const Json& rope, const std::string& where, bool theta_inside, ModelConfig& c) {
  const std::string& name = c.name;
  LS_REQUIRE(rope.is_object(), "HF config '{}': '{}' must be an object, got {}", name, where,
             rope.type_name());
  const Json* type = find_set(rope, "rope_type");
  const Json* legacy_type = find_set(rope, "type");  // the older spelling of rope_type
  LS_REQUIRE(!type || !legacy_type || *type == *legacy_type,
             "HF config '{}': '{}.rope_type' {} and '{}.type' {} disagree", name, where,
             type ? type->dump() : "", where, legacy_type ? legacy_type->dump() : "");
  if (type == nullptr) type = legacy_type;
  const std::string type_name =
      type == nullptr ? "default" : (type->is_string() ? type->get<std::string>() : type->dump());
  std::vector<std::string_view> wanted;
  if (type_name == "default") {
    c.rope_type = RopeType::kDefault;
  } else if (c.family == ModelFamily::kBamba) {
    // Scaled types with Bamba's partial rotary (transformers' _compute_*_parameters read the
    // factor too): not implemented, so not accepted.
    throw Error(fmt::format("HF config '{}': '{}.rope_type' \"{}\" is not supported for "
                            "BambaForCausalLM (only \"default\")", name, where, type_name));
  } else if (type_name == "linear") {
    c.rope_type = RopeType::kLinear, wanted = {"factor"};
  } else if (type_name == "llama3") {
    c.rope_type = RopeType::kLlama3;
    wanted = {"factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings"};
  } else {
    throw Error(fmt::format("HF config '{}': '{}.rope_type' \"{}\" is not supported (supported: "
                            "default, linear, llama3)", name, where, type_name));
  }
  for (const auto& [key, value] : rope.items()) {
    const bool known = key == "rope_type" || key == "type" || (theta_inside && key == "rope_theta") ||
                       (c.family == ModelFamily::kBamba && key == "partial_rotary_factor") ||
                       std::ranges::find(wanted, key) != wanted.end();
    LS_REQUIRE(known, "HF config '{}': '{}.{}' is not supported with rope_type \"{}\"", name, where,
               key, type_name);
  }
  for (const std::string_view key : wanted) {
    LS_REQUIRE(find_set(rope, std::string(key).c_str()) != nullptr,
               "HF config '{}': rope_type \"{}\" needs '{}.{}'", name, type_name, where, key);
  }
  auto number = [&](const char* key) { return float_field(rope.at(key), where + "." + key, name); };
  if (c.rope_type != RopeType::kDefault) c.rope_factor = number("factor");
  if (c.rope_type == RopeType::kLlama3) {
    c.rope_low_freq_factor = number("low_freq_factor");
    c.rope_high_freq_factor = number("high_freq_factor");
    c.rope_original_max_positions = int32_field(rope.at("original_max_position_embeddings"),
                                                where + ".original_max_position_embeddings", name);
  }
}

// Both forms: rope_parameters {rope_type, rope_theta, ...}, or rope_theta with rope_scaling
// {rope_type, ...}. A theta given twice must agree; a config holding both parameter objects is
// refused (which one a reader takes would decide the model).
void read_rope(const Json& json, ModelFamily family, ModelConfig& c) {
  const std::string& name = c.name;
  const Json* parameters = find_set(json, "rope_parameters");
  const Json* scaling = find_set(json, "rope_scaling");
  const Json* theta = find_set(json, "rope_theta");
  LS_REQUIRE(parameters == nullptr || scaling == nullptr,
             "HF config '{}': both 'rope_parameters' and 'rope_scaling' are set; give one form",
             name);
  std::optional<float> theta_value;
  if (theta != nullptr) theta_value = float_field(*theta, "rope_theta", name);
  if (parameters != nullptr) {
    read_rope_object(*parameters, "rope_parameters", /*theta_inside=*/true, c);
    const Json* inner = find_set(*parameters, "rope_theta");
    if (inner != nullptr) {
      const float inner_value = float_field(*inner, "rope_parameters.rope_theta", name);
      LS_REQUIRE(!theta_value || *theta_value == inner_value,
                 "HF config '{}': 'rope_theta' {} and 'rope_parameters.rope_theta' {} disagree",
                 name, *theta_value, inner_value);
      theta_value = inner_value;
    }
  } else if (scaling != nullptr) {
    read_rope_object(*scaling, "rope_scaling", /*theta_inside=*/false, c);
  }
  // LlamaConfig's default theta is 10000; the other families' defaults changed across
  // transformers versions, so they must say.
  LS_REQUIRE(theta_value || family == ModelFamily::kLlama,
             "HF config '{}': no RoPE theta ('rope_parameters.rope_theta' or 'rope_theta')", name);
  c.rope_theta = theta_value.value_or(10000.0f);
}

// Which layers slide, as transformers decides it. Qwen: layer_types when given, else layers from
// max_window_layers on when use_sliding_window; Mistral: every layer when sliding_window is set
// (absent means MistralConfig's default of 4096, null means none).
void read_sliding_window(const Json& json, ModelFamily family, ModelConfig& c) {
  const std::string& name = c.name;
  if (family == ModelFamily::kLlama || family == ModelFamily::kBamba) return;
  const std::optional<int32_t> window = optional_int32(json, "sliding_window", name);
  LS_REQUIRE(window.value_or(1) > 0, "HF config '{}': 'sliding_window' must be > 0, got {}", name,
             window.value_or(1));
  if (family == ModelFamily::kMistral) {
    c.sliding_window = json.contains("sliding_window") ? window.value_or(0) : 4096;
    return;
  }
  const bool use_window = optional_bool(json, "use_sliding_window", false, name);
  const int32_t full_layers = optional_int32(json, "max_window_layers", name).value_or(28);
  bool any_sliding = use_window && window.has_value() && full_layers < c.layers_count;
  if (const Json* types = find_set(json, "layer_types")) {
    LS_REQUIRE(types->is_array() && types->size() == static_cast<size_t>(c.layers_count),
               "HF config '{}': 'layer_types' must list num_hidden_layers = {} entries", name,
               c.layers_count);
    any_sliding = false;
    for (size_t i = 0; i < types->size(); ++i) {
      const Json& t = (*types)[i];
      const bool full = t == "full_attention";
      LS_REQUIRE(full || t == "sliding_attention", "HF config '{}': 'layer_types'[{}] {} is not "
                 "supported (full_attention or sliding_attention)", name, i, t.dump());
      any_sliding = any_sliding || !full;
    }
    LS_REQUIRE(!any_sliding || (use_window && window.has_value()),
               "HF config '{}': 'layer_types' has sliding_attention layers but use_sliding_window "
               "is false or sliding_window is null", name);
  }
  c.sliding_window = any_sliding ? *window : 0;
}

// BambaConfig's defaults for the keys it may leave out.
constexpr int32_t kBambaHeadsDefault = 128;
constexpr int32_t kBambaGroupsDefault = 1;
constexpr int32_t kBambaStateDefault = 256;
constexpr int32_t kBambaConvDefault = 4;
constexpr int32_t kBambaExpandDefault = 2;

// Which layers attend: attn_layer_indices (absent, null or empty: none — transformers'
// layers_block_type), every index in [0, layers) and given once.
std::vector<LayerKind> read_layer_kinds(const Json& json, const ModelConfig& c) {
  const std::string& name = c.name;
  std::vector<LayerKind> kinds(static_cast<size_t>(std::max(c.layers_count, 0)), LayerKind::kMamba2);
  const Json* indices = find_set(json, "attn_layer_indices");
  if (indices == nullptr) return kinds;
  LS_REQUIRE(indices->is_array(), "HF config '{}': 'attn_layer_indices' must be a list of layer "
             "indices, got {}", name, indices->type_name());
  for (size_t i = 0; i < indices->size(); ++i) {
    const int32_t layer = int32_field((*indices)[i], fmt::format("attn_layer_indices[{}]", i), name);
    LS_REQUIRE(layer >= 0 && layer < c.layers_count, "HF config '{}': 'attn_layer_indices'[{}] = "
               "{} is outside [0, num_hidden_layers = {})", name, i, layer, c.layers_count);
    LayerKind& kind = kinds[static_cast<size_t>(layer)];
    LS_REQUIRE(kind == LayerKind::kMamba2, "HF config '{}': 'attn_layer_indices' names layer {} "
               "twice", name, layer);
    kind = LayerKind::kAttention;
  }
  return kinds;
}

// time_step_limit [min, max]: the clamp on dt after the softplus. Absent means transformers'
// default (0, inf); null is refused (transformers' torch path indexes it and fails).
void read_time_step_limit(const Json& json, const std::string& name, MambaConfig& m) {
  m.dt_min = 0.0f, m.dt_max = std::numeric_limits<float>::infinity();
  const auto it = json.find("time_step_limit");
  if (it == json.end()) return;
  LS_REQUIRE(it->is_array() && it->size() == 2, "HF config '{}': 'time_step_limit' must be a "
             "list [min, max], got {}", name, it->dump());
  m.dt_min = float_field((*it)[0], "time_step_limit[0]", name);
  m.dt_max = float_field((*it)[1], "time_step_limit[1]", name);
}

// BambaConfig's partial rotary. transformers' BambaConfig sets the top-level partial_rotary_factor
// to 0.5 whatever config.json says ("hardcode for BC"); the rope init then takes the factor from
// rope_parameters (where the config writes it too) and rotates int(head_dim · factor) dims. So:
// rope_parameters.partial_rotary_factor when given, else 0.5; a top-level value other than 0.5
// would be replaced by transformers and is refused rather than silently honoured or dropped.
// (Whether transformers' rope init keeps a rope_parameters factor other than 0.5 is checked on the
// torch host by tests/hf_fixtures.py, check_factor_from_rope_parameters.)
void read_partial_rotary(const Json& json, ModelConfig& c) {
  const std::string& name = c.name;
  constexpr double kBambaForcedFactor = 0.5;
  const Json* top = find_set(json, "partial_rotary_factor");
  if (top != nullptr) {
    float_field(*top, "partial_rotary_factor", name);  // a finite number
    LS_REQUIRE(top->get<double>() == kBambaForcedFactor, "HF config '{}': 'partial_rotary_factor' {} is not "
               "supported for BambaForCausalLM: transformers' BambaConfig replaces it with 0.5 "
               "(give the factor as 'rope_parameters.partial_rotary_factor')", name, top->dump());
  }
  const Json* rope = find_set(json, "rope_parameters");
  const Json* inner = rope != nullptr && rope->is_object() ? find_set(*rope, "partial_rotary_factor")
                                                           : nullptr;
  double factor = kBambaForcedFactor;
  if (inner != nullptr) {
    float_field(*inner, "rope_parameters.partial_rotary_factor", name);  // a finite number
    factor = inner->get<double>();  // Python's float: rounding it to fp32 could move the int()
    LS_REQUIRE(factor > 0.0 && factor <= 1.0, "HF config '{}': "
               "'rope_parameters.partial_rotary_factor' {} is outside (0, 1]", name, inner->dump());
  }
  // Python's int(head_dim * factor): the product in double, truncated.
  const auto rotary_dim = static_cast<int32_t>(static_cast<double>(c.head_dim) * factor);
  LS_REQUIRE(rotary_dim >= 2 && rotary_dim % 2 == 0, "HF config '{}': partial_rotary_factor {} "
             "rotates int(head_dim {} · factor) = {} dims of each head; RoPE needs an even count "
             ">= 2", name, factor, c.head_dim, rotary_dim);
  c.partial_rotary_dim = rotary_dim == c.head_dim ? 0 : rotary_dim;
}

// The Mamba2 mixer of BambaForCausalLM, every key implemented, checked or refused.
void read_mamba(const Json& json, ModelConfig& c) {
  const std::string& name = c.name;
  if (c.family != ModelFamily::kBamba) return;
  c.layer_kinds = read_layer_kinds(json, c);
  MambaConfig& m = c.mamba;
  m.heads_count = optional_int32(json, "mamba_n_heads", name).value_or(kBambaHeadsDefault);
  m.groups_count = optional_int32(json, "mamba_n_groups", name).value_or(kBambaGroupsDefault);
  m.state_size = optional_int32(json, "mamba_d_state", name).value_or(kBambaStateDefault);
  m.conv_kernel = optional_int32(json, "mamba_d_conv", name).value_or(kBambaConvDefault);
  const int32_t expand = optional_int32(json, "mamba_expand", name).value_or(kBambaExpandDefault);
  LS_REQUIRE(expand > 0 && int64_t{expand} * c.hidden_size <= (1 << 18),
             "HF config '{}': 'mamba_expand' {} times hidden_size {} is out of range", name, expand,
             c.hidden_size);
  const int32_t inner = expand * c.hidden_size;
  LS_REQUIRE(m.heads_count > 0 && inner % m.heads_count == 0, "HF config '{}': 'mamba_n_heads' {} "
             "does not divide mamba_expand · hidden_size = {}", name, m.heads_count, inner);
  const Json* head_dim = find_set(json, "mamba_d_head");
  m.head_dim = head_dim == nullptr || *head_dim == "auto"
                   ? inner / m.heads_count
                   : int32_field(*head_dim, "mamba_d_head", name);
  LS_REQUIRE(int64_t{m.head_dim} * m.heads_count == inner, "HF config '{}': 'mamba_d_head' {} "
             "times mamba_n_heads {} is not mamba_expand · hidden_size = {}", name, m.head_dim,
             m.heads_count, inner);
  m.conv_bias = optional_bool(json, "mamba_conv_bias", true, name);
  require_false(json, "mamba_proj_bias", name, "in_proj/out_proj biases are not implemented");
  read_time_step_limit(json, name, m);
  if (const Json* chunk = find_set(json, "mamba_chunk_size")) {
    const int32_t value = int32_field(*chunk, "mamba_chunk_size", name);
    LS_REQUIRE(value > 0, "HF config '{}': 'mamba_chunk_size' must be > 0, got {}", name, value);
  }
  read_partial_rotary(json, c);
}

}  // namespace

ModelConfig model_config_from_hf_json(const std::string& json_text, const std::string& name) {
  const Json json = parse_json_object(json_text, fmt::format("HF config '{}'", name));
  ModelConfig c;
  c.name = name;
  c.family = read_family(json, name);
  refuse_unknown_keys(json, c.family, name);
  check_neutral_values(json, c.family, name);
  read_shape(json, c.family, c);
  read_rope(json, c.family, c);
  read_sliding_window(json, c.family, c);
  read_mamba(json, c);
  c.validate();
  return c;
}

}  // namespace ls
