// Every refusal of issue 11, through the CLI as a user meets it: a bad checkpoint directory (a
// fixture copied and broken one way), `lockstep generate --model DIR`, exit code 2 and a message
// naming the field, tensor or path. A crash (exit ≥ 128) or a hang (the 60 s timeout) fails.
#include "core/model/safetensors.h"
#include "tests/scratch_dir.h"

#include <fmt/format.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <sstream>
#include <string>

namespace ls {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;
using Json = nlohmann::json;

fs::path fixture(const std::string& family) {
  return fs::path(LOCKSTEP_SOURCE_DIR) / "tests" / "fixtures" / "hf" / family;
}

std::string read_file(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

void write_file(const fs::path& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << text;
  ASSERT_TRUE(out.good()) << path;
}

struct CliRun {
  int exit_code = -1;
  std::string err;
};

// Runs `lockstep generate` on one short prompt; `extra` are more flags.
CliRun generate(const testing::ScratchDir& scratch, const fs::path& model,
                const std::string& extra = "", int32_t context_length = 1024) {
  const fs::path prompts = scratch.file("prompts.jsonl");
  write_file(prompts, "{\"prompt\": [1, 2, 3], \"max_new_tokens\": 2}\n");
  const fs::path err = scratch.file("stderr.txt");
  const std::string command = fmt::format(
      "timeout 60 '{}' generate --model '{}' --prompts '{}' --context-length {} -q {} "
      ">/dev/null 2>'{}'", LOCKSTEP_CLI, model.string(), prompts.string(), context_length, extra,
      err.string());
  const int status = std::system(command.c_str());
  CliRun run;
  run.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  run.err = read_file(err);
  return run;
}

// A copy of a fixture in the scratch directory, to break.
fs::path copy_fixture(const testing::ScratchDir& scratch, const std::string& family) {
  const fs::path dir = scratch.file("model");
  fs::create_directories(dir);
  fs::copy_file(fixture(family) / "config.json", dir / "config.json");
  fs::copy_file(fixture(family) / "model.safetensors", dir / "model.safetensors");
  return dir;
}

void edit_config(const fs::path& dir, const std::function<void(Json&)>& edit) {
  Json config = Json::parse(read_file(dir / "config.json"));
  edit(config);
  write_file(dir / "config.json", config.dump(2));
}

// Exit code 2 with each of `needles` in the message, and no crash or hang.
void expect_refusal(const CliRun& run, std::initializer_list<std::string> needles) {
  EXPECT_EQ(run.exit_code, 2) << run.err;
  EXPECT_THAT(run.err, HasSubstr("lockstep: error:"));
  for (const std::string& needle : needles) EXPECT_THAT(run.err, HasSubstr(needle));
}

// One config edit of a fixture, refused with these words.
struct ConfigCase {
  std::string name;
  std::string family;
  std::function<void(Json&)> edit;
  std::vector<std::string> needles;
};

class ConfigRefusal : public ::testing::TestWithParam<ConfigCase> {};

TEST_P(ConfigRefusal, ExitsTwoNamingTheField) {
  const ConfigCase& c = GetParam();
  const testing::ScratchDir scratch;
  const fs::path dir = copy_fixture(scratch, c.family);
  edit_config(dir, c.edit);
  const CliRun run = generate(scratch, dir);
  EXPECT_EQ(run.exit_code, 2) << run.err;
  for (const std::string& needle : c.needles) EXPECT_THAT(run.err, HasSubstr(needle));
  EXPECT_THAT(run.err, HasSubstr("config.json"));
}

INSTANTIATE_TEST_SUITE_P(
    Issue11, ConfigRefusal,
    ::testing::Values(
        ConfigCase{"UnknownModelType", "llama3",
                   [](Json& j) { j.erase("architectures"); j["model_type"] = "gpt2"; },
                   {"'model_type' \"gpt2\" is not supported"}},
        ConfigCase{"UnknownArchitecture", "llama3",
                   [](Json& j) { j["architectures"] = {"GPT2LMHeadModel"}; },
                   {"'architectures' [\"GPT2LMHeadModel\"] is not supported"}},
        ConfigCase{"ArchitectureAndModelTypeDisagree", "qwen2",
                   [](Json& j) { j["model_type"] = "llama"; },
                   {"'architectures' says Qwen2ForCausalLM but 'model_type' says llama"}},
        ConfigCase{"UnknownRopeType", "llama3",
                   [](Json& j) { j["rope_parameters"]["rope_type"] = "yarn"; },
                   {"'rope_parameters.rope_type' \"yarn\" is not supported"}},
        ConfigCase{"LegacyDynamicRopeScaling", "llama3",
                   [](Json& j) {
                     j["rope_theta"] = 500000.0;
                     j.erase("rope_parameters");
                     j["rope_scaling"] = {{"type", "dynamic"}, {"factor", 2.0}};
                   },
                   {"'rope_scaling.rope_type' \"dynamic\" is not supported"}},
        ConfigCase{"Llama3RopeMissingAField", "llama3",
                   [](Json& j) { j["rope_parameters"].erase("low_freq_factor"); },
                   {"rope_type \"llama3\" needs 'rope_parameters.low_freq_factor'"}},
        ConfigCase{"RopeKeyNotReadByItsType", "qwen3",
                   [](Json& j) { j["rope_parameters"]["factor"] = 2.0; },
                   {"'rope_parameters.factor' is not supported with rope_type \"default\""}},
        ConfigCase{"BothRopeForms", "llama3",
                   [](Json& j) { j["rope_scaling"] = {{"rope_type", "linear"}, {"factor", 2.0}}; },
                   {"both 'rope_parameters' and 'rope_scaling'"}},
        ConfigCase{"ThetaTwiceDisagreeing", "mistral",
                   [](Json& j) { j["rope_theta"] = 10000.0; },
                   {"'rope_theta' 10000 and 'rope_parameters.rope_theta'", "disagree"}},
        ConfigCase{"HiddenActGelu", "qwen2", [](Json& j) { j["hidden_act"] = "gelu"; },
                   {"'hidden_act' \"gelu\" is not supported"}},
        ConfigCase{"AttentionBias", "llama3", [](Json& j) { j["attention_bias"] = true; },
                   {"'attention_bias': true is not supported"}},
        ConfigCase{"MlpBias", "llama-linear", [](Json& j) { j["mlp_bias"] = true; },
                   {"'mlp_bias': true is not supported"}},
        ConfigCase{"PretrainingTp", "llama3", [](Json& j) { j["pretraining_tp"] = 2; },
                   {"'pretraining_tp' = 2 is not supported"}},
        ConfigCase{"AttentionDropout", "mistral", [](Json& j) { j["attention_dropout"] = 0.1; },
                   {"'attention_dropout' = 0.1 is not supported"}},
        ConfigCase{"QuantizationConfig", "qwen3",
                   [](Json& j) { j["quantization_config"] = {{"quant_method", "gptq"}, {"bits", 4}}; },
                   {"'quantization_config'", "gptq", "is not supported"}},
        ConfigCase{"UnknownKey", "qwen2", [](Json& j) { j["use_mrope"] = true; },
                   {"key 'use_mrope' is not supported for Qwen2ForCausalLM"}},
        ConfigCase{"PartialRotaryFactor", "llama3", [](Json& j) { j["partial_rotary_factor"] = 0.5; },
                   {"key 'partial_rotary_factor' is not supported"}},
        ConfigCase{"SlidingLayerTypes", "qwen3",
                   [](Json& j) { j["layer_types"] = {"full_attention", "sliding_attention"}; },
                   {"'layer_types' has sliding_attention layers"}},
        ConfigCase{"LayerTypesWrongLength", "qwen2",
                   [](Json& j) { j["layer_types"] = {"full_attention"}; },
                   {"'layer_types' must list num_hidden_layers = 2 entries"}}),
    [](const auto& param_info) { return param_info.param.name; });

// ---- tensors against the config ----------------------------------------------------------------

TEST(TensorRefusal, MoreLayersInTheFileThanNumHiddenLayers) {
  const testing::ScratchDir scratch;
  const fs::path dir = copy_fixture(scratch, "llama3");
  edit_config(dir, [](Json& j) { j["num_hidden_layers"] = 1; });
  expect_refusal(generate(scratch, dir),
                 {"tensor 'model.layers.1.", "is not used by a LlamaForCausalLM",
                  "num_hidden_layers = 1"});
}

TEST(TensorRefusal, FewerLayersInTheFileThanNumHiddenLayers) {
  const testing::ScratchDir scratch;
  const fs::path dir = copy_fixture(scratch, "qwen3");
  edit_config(dir, [](Json& j) {
    j["num_hidden_layers"] = 3;
    j["layer_types"].push_back("full_attention");
  });
  expect_refusal(generate(scratch, dir), {"tensor 'model.layers.2.", "not found"});
}

TEST(TensorRefusal, QwenBiasesUnderALlamaConfig) {
  const testing::ScratchDir scratch;
  const fs::path dir = copy_fixture(scratch, "qwen2");
  edit_config(dir, [](Json& j) {
    j["architectures"] = {"LlamaForCausalLM"};
    j["model_type"] = "llama";
    for (const char* key : {"layer_types", "max_window_layers", "sliding_window", "use_sliding_window"}) {
      j.erase(key);
    }
  });
  expect_refusal(generate(scratch, dir),
                 {"tensor 'model.layers.0.self_attn.k_proj.bias'", "is not used by a LlamaForCausalLM"});
}

TEST(TensorRefusal, QkNormsUnderAMistralConfig) {
  const testing::ScratchDir scratch;
  const fs::path dir = copy_fixture(scratch, "qwen3");
  edit_config(dir, [](Json& j) {
    j["architectures"] = {"MistralForCausalLM"};
    j["model_type"] = "mistral";
    for (const char* key : {"layer_types", "max_window_layers", "use_sliding_window", "attention_bias"}) {
      j.erase(key);
    }
  });
  expect_refusal(generate(scratch, dir), {"self_attn.k_norm.weight'", "is not used"});
}

TEST(TensorRefusal, UntiedConfigOverATiedFile) {
  const testing::ScratchDir scratch;
  const fs::path dir = copy_fixture(scratch, "llama3");
  edit_config(dir, [](Json& j) { j["tie_word_embeddings"] = false; });
  expect_refusal(generate(scratch, dir), {"'lm_head.weight' not found", dir.string()});
}

TEST(TensorRefusal, TiedConfigOverAnUntiedFile) {
  const testing::ScratchDir scratch;
  const fs::path dir = copy_fixture(scratch, "llama-linear");
  edit_config(dir, [](Json& j) { j["tie_word_embeddings"] = true; });
  expect_refusal(generate(scratch, dir),
                 {"tie_word_embeddings is true but lm_head.weight differs from "
                  "model.embed_tokens.weight"});
}

// ---- context bounds ----------------------------------------------------------------------------

TEST(ContextRefusal, MaxPositionEmbeddingsBoundsTheContextUnlessOverridden) {
  const testing::ScratchDir scratch;
  const fs::path dir = copy_fixture(scratch, "qwen2");
  edit_config(dir, [](Json& j) { j["max_position_embeddings"] = 512; });
  expect_refusal(generate(scratch, dir),
                 {"context length 1024 exceeds max_position_embeddings = 512",
                  "--context-beyond-max-positions"});
  const CliRun allowed = generate(scratch, dir, "--context-beyond-max-positions");
  EXPECT_EQ(allowed.exit_code, 0) << allowed.err;
  EXPECT_THAT(allowed.err, HasSubstr("warning: --context-length 1024 exceeds the model's "
                                     "max_position_embeddings = 512"));
}

TEST(ContextRefusal, MistralSlidingWindowShorterThanTheContext) {
  const testing::ScratchDir scratch;
  const fs::path dir = copy_fixture(scratch, "mistral");
  edit_config(dir, [](Json& j) { j["sliding_window"] = 256; });
  expect_refusal(generate(scratch, dir),
                 {"sliding_window = 256 is shorter than the context length 1024"});
  // A window as long as the context changes nothing: it runs.
  edit_config(dir, [](Json& j) { j["sliding_window"] = 1024; });
  const CliRun run = generate(scratch, dir);
  EXPECT_EQ(run.exit_code, 0) << run.err;
  // MistralConfig's default window (4096) applies when the key is absent.
  edit_config(dir, [](Json& j) { j.erase("sliding_window"); });
  expect_refusal(generate(scratch, dir, "--context-beyond-max-positions", 8192),
                 {"sliding_window = 4096 is shorter than the context length 8192"});
}

TEST(ContextRefusal, QwenSlidingWindowLayers) {
  const testing::ScratchDir scratch;
  const fs::path dir = copy_fixture(scratch, "qwen2");
  edit_config(dir, [](Json& j) {
    j["use_sliding_window"] = true;
    j["sliding_window"] = 128;
    j["max_window_layers"] = 1;
    j.erase("layer_types");
  });
  expect_refusal(generate(scratch, dir), {"sliding_window = 128 is shorter than the context"});
}

// ---- safetensors -------------------------------------------------------------------------------

// Rewrites model.safetensors's header through `edit` of its text, padded to the old length.
void edit_header(const fs::path& file, const std::function<std::string(std::string)>& edit) {
  const std::string bytes = read_file(file);
  uint64_t length = 0;
  for (int i = 7; i >= 0; --i) length = (length << 8) | static_cast<unsigned char>(bytes[i]);
  std::string header = edit(bytes.substr(8, length));
  while (header.size() % 8 != 0) header += ' ';
  std::string out;
  for (int i = 0; i < 8; ++i) out.push_back(static_cast<char>((header.size() >> (8 * i)) & 0xFF));
  write_file(file, out + header + bytes.substr(8 + length));
}

TEST(SafetensorsRefusal, OverlappingDataOffsets) {
  const testing::ScratchDir scratch;
  const fs::path dir = copy_fixture(scratch, "llama3");
  edit_header(dir / "model.safetensors", [](std::string text) {
    Json header = Json::parse(text);
    // Layer 0's k_proj reads layer 0's v_proj bytes (same shape, same size).
    header["model.layers.0.self_attn.k_proj.weight"]["data_offsets"] =
        header["model.layers.0.self_attn.v_proj.weight"]["data_offsets"];
    return header.dump();
  });
  expect_refusal(generate(scratch, dir),
                 {"model.safetensors", "'model.layers.0.self_attn.", "overlap"});
}

TEST(SafetensorsRefusal, DuplicateHeaderKey) {
  const testing::ScratchDir scratch;
  const fs::path dir = copy_fixture(scratch, "qwen2");
  edit_header(dir / "model.safetensors", [](std::string text) {
    const Json header = Json::parse(text);
    const std::string name = "model.norm.weight";
    // The same key again, pointing at another tensor's bytes of the same size.
    Json other = header["model.layers.0.input_layernorm.weight"];
    while (!text.empty() && text.back() == ' ') text.pop_back();  // the padding
    text.pop_back();                                               // the closing brace
    return text + ",\"" + name + "\":" + other.dump() + "}";
  });
  expect_refusal(generate(scratch, dir), {"model.safetensors", "key 'model.norm.weight' appears twice"});
}

TEST(ConfigJsonRefusal, DuplicateConfigKey) {
  const testing::ScratchDir scratch;
  const fs::path dir = copy_fixture(scratch, "llama3");
  std::string text = read_file(dir / "config.json");
  text.insert(text.find('{') + 1, "\"num_hidden_layers\": 1,");
  write_file(dir / "config.json", text);
  expect_refusal(generate(scratch, dir), {"config.json", "key 'num_hidden_layers' appears twice"});
}

// ---- filesystem --------------------------------------------------------------------------------

TEST(FilesystemRefusal, ModelDirectoryIsASymlinkLoop) {
  const testing::ScratchDir scratch;
  const fs::path loop = scratch.file("loop");
  fs::create_symlink(loop, loop);
  expect_refusal(generate(scratch, loop), {loop.string(), "Too many levels of symbolic links"});
}

TEST(FilesystemRefusal, ConfigJsonIsASymlinkLoop) {
  const testing::ScratchDir scratch;
  const fs::path dir = copy_fixture(scratch, "llama3");
  fs::remove(dir / "config.json");
  fs::create_symlink(dir / "config.json", dir / "config.json");
  expect_refusal(generate(scratch, dir), {(dir / "config.json").string(), "Too many levels"});
}

TEST(FilesystemRefusal, ModelSafetensorsIsADirectory) {
  const testing::ScratchDir scratch;
  const fs::path dir = copy_fixture(scratch, "llama3");
  fs::remove(dir / "model.safetensors");
  fs::create_directory(dir / "model.safetensors");
  expect_refusal(generate(scratch, dir),
                 {(dir / "model.safetensors").string(), "is a directory, not a file"});
}

TEST(FilesystemRefusal, ShardNamedByTheIndexIsMissing) {
  const testing::ScratchDir scratch;
  const fs::path dir = copy_fixture(scratch, "mistral");
  fs::rename(dir / "model.safetensors", dir / "model-00001-of-00002.safetensors");
  Json index = {{"metadata", {{"total_size", 0}}}, {"weight_map", Json::object()}};
  const SafetensorsFile file = SafetensorsFile::open(dir / "model-00001-of-00002.safetensors");
  for (const TensorInfo& t : file.tensors()) {
    index["weight_map"][t.name] = "model-00001-of-00002.safetensors";
  }
  index["weight_map"]["lm_head.weight"] = "model-00002-of-00002.safetensors";
  write_file(dir / "model.safetensors.index.json", index.dump());
  expect_refusal(generate(scratch, dir),
                 {(dir / "model-00002-of-00002.safetensors").string(),
                  "named by model.safetensors.index.json is missing"});
}

TEST(FilesystemRefusal, UnreadableConfig) {
  if (::geteuid() == 0) GTEST_SKIP() << "root reads files whatever their permissions";
  const testing::ScratchDir scratch;
  const fs::path dir = copy_fixture(scratch, "llama3");
  fs::permissions(dir / "config.json", fs::perms::none);
  expect_refusal(generate(scratch, dir), {(dir / "config.json").string(), "Permission denied"});
}

TEST(FilesystemRefusal, UnlistableDirectory) {
  if (::geteuid() == 0) GTEST_SKIP() << "root lists directories whatever their permissions";
  const testing::ScratchDir scratch;
  const fs::path dir = copy_fixture(scratch, "llama3");
  fs::permissions(dir, fs::perms::owner_exec, fs::perm_options::replace);
  const CliRun run = generate(scratch, dir);
  fs::permissions(dir, fs::perms::owner_all, fs::perm_options::replace);  // so cleanup can remove it
  expect_refusal(run, {dir.string(), "Permission denied"});
}

// ---- what loads --------------------------------------------------------------------------------

TEST(HfDirectoryCli, EveryFixtureGenerates) {
  const testing::ScratchDir scratch;
  for (const char* family : {"llama3", "llama-linear", "qwen2", "qwen3", "mistral"}) {
    const CliRun run = generate(scratch, fixture(family));
    EXPECT_EQ(run.exit_code, 0) << family << ": " << run.err;
  }
}

}  // namespace
}  // namespace ls
