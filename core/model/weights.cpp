#include "core/model/weights.h"

#include "core/check.h"
#include "core/host_memory.h"
#include "core/model/pieces_digest.h"
#include "core/model/safetensors.h"
#include "core/model/strict_json.h"
#include "core/ops/seeded_weights.h"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <array>
#include <atomic>
#include <bit>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <fstream>
#include <functional>
#include <iterator>
#include <limits>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <span>

namespace ls {
namespace {

// The digest hashes fp32 bytes as they sit in memory; that is only platform-stable on
// little-endian hosts, which is every host lockstep targets.
static_assert(std::endian::native == std::endian::little, "weight digest assumes little-endian");

// config.json is a few kilobytes; anything this large is not a model config.
constexpr std::uintmax_t kConfigBytesMax = std::uintmax_t{16} << 20;

// The widths a weight dimension can take, resolved against a ModelConfig.
enum class Dim : uint8_t {
  kNone, kHidden, kQ, kKv, kFfn, kHeadDim,
  kMambaInProj, kMambaConv, kMambaKernel, kMambaHeads, kMambaInner,
};

int64_t dim_size(const ModelConfig& config, Dim dim) {
  switch (dim) {
    case Dim::kNone: return 0;
    case Dim::kHidden: return config.hidden_size;
    case Dim::kQ: return config.q_size();
    case Dim::kKv: return config.kv_size();
    case Dim::kFfn: return config.ffn_size;
    case Dim::kHeadDim: return config.head_dim;
    case Dim::kMambaInProj: return config.mamba.in_proj_size();
    case Dim::kMambaConv: return config.mamba.conv_dim();
    case Dim::kMambaKernel: return config.mamba.conv_kernel;
    case Dim::kMambaHeads: return config.mamba.heads_count;
    case Dim::kMambaInner: return config.mamba.inner_size();
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

// In LayerWeights field order, which is ops::SeededLayerTensor's. This order is part of the seeded
// weights and of the digest: reordering it changes every seeded model and every recorded digest.
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

// The family features' per-layer vectors, present exactly when their flag is on. Seeded tensor
// indices follow the existing ones (see the table below), so adding them changed no old model.
enum class Feature : uint8_t { kQkvBias, kQkNorm };

struct FeatureTensorSpec {
  std::vector<float> LayerWeights::*field;
  const char* hf_suffix;
  Dim rows;
  Feature feature;
  bool is_norm;  // seeded as 1 + u/8, not u/8
};

constexpr std::array<FeatureTensorSpec, 5> kFeatureTensors = {{
    {&LayerWeights::q_bias, "self_attn.q_proj.bias", Dim::kQ, Feature::kQkvBias, false},
    {&LayerWeights::k_bias, "self_attn.k_proj.bias", Dim::kKv, Feature::kQkvBias, false},
    {&LayerWeights::v_bias, "self_attn.v_proj.bias", Dim::kKv, Feature::kQkvBias, false},
    {&LayerWeights::q_norm, "self_attn.q_norm.weight", Dim::kHeadDim, Feature::kQkNorm, true},
    {&LayerWeights::k_norm, "self_attn.k_norm.weight", Dim::kHeadDim, Feature::kQkNorm, true},
}};

// A Mamba2 layer's mixer tensors (BambaMixer's names after "model.layers.{i}."), present exactly on
// the kMamba2 layers; conv1d.bias only with mamba.conv_bias. HF stores the depthwise conv weight
// as [conv_dim, 1, kernel]; the middle 1 is dropped here.
struct MambaTensorSpec {
  std::vector<float> LayerWeights::*field;
  const char* hf_suffix;
  Dim rows;
  Dim cols;
};

constexpr std::array<MambaTensorSpec, 8> kMambaTensors = {{
    {&LayerWeights::in_proj, "mamba.in_proj.weight", Dim::kMambaInProj, Dim::kHidden},
    {&LayerWeights::conv_weight, "mamba.conv1d.weight", Dim::kMambaConv, Dim::kMambaKernel},
    {&LayerWeights::conv_bias, "mamba.conv1d.bias", Dim::kMambaConv, Dim::kNone},
    {&LayerWeights::dt_bias, "mamba.dt_bias", Dim::kMambaHeads, Dim::kNone},
    {&LayerWeights::a_log, "mamba.A_log", Dim::kMambaHeads, Dim::kNone},
    {&LayerWeights::d_skip, "mamba.D", Dim::kMambaHeads, Dim::kNone},
    {&LayerWeights::mamba_norm, "mamba.norm.weight", Dim::kMambaInner, Dim::kNone},
    {&LayerWeights::out_proj, "mamba.out_proj.weight", Dim::kHidden, Dim::kMambaInner},
}};

bool is_attention_tensor(const LayerTensorSpec& spec) {
  return spec.field == &LayerWeights::wq || spec.field == &LayerWeights::wk ||
         spec.field == &LayerWeights::wv || spec.field == &LayerWeights::wo;
}

// Whether layer `layer` holds the tensor: attention tensors on attention layers, mixer tensors on
// Mamba layers (the conv bias only when configured), the norms and the FFN on every layer.
bool layer_has(const ModelConfig& config, int32_t layer, const LayerTensorSpec& spec) {
  return !is_attention_tensor(spec) || config.layer_kind(layer) == LayerKind::kAttention;
}
bool layer_has(const ModelConfig& config, int32_t layer, const MambaTensorSpec& spec) {
  if (config.layer_kind(layer) != LayerKind::kMamba2) return false;
  return spec.field != &LayerWeights::conv_bias || config.mamba.conv_bias;
}

int64_t elements_of(const ModelConfig& config, Dim rows, Dim cols) {
  return dim_size(config, rows) * (cols == Dim::kNone ? 1 : dim_size(config, cols));
}

// Bamba's layers name the FFN and its norm differently from Llama's.
std::string hf_layer_name(const ModelConfig& config, size_t layer, std::string_view suffix) {
  std::string name(suffix);
  if (config.family == ModelFamily::kBamba) {
    if (name == "post_attention_layernorm.weight") name = "pre_ff_layernorm.weight";
    if (name.starts_with("mlp.")) name = "feed_forward." + name.substr(4);
  }
  return fmt::format("model.layers.{}.{}", layer, name);
}

bool has_feature(const ModelConfig& config, Feature feature) {
  return feature == Feature::kQkvBias ? config.qkv_bias : config.qk_norm;
}

std::vector<int64_t> spec_shape(const ModelConfig& config, const LayerTensorSpec& spec) {
  if (spec.cols == Dim::kNone) return {dim_size(config, spec.rows)};
  return {dim_size(config, spec.rows), dim_size(config, spec.cols)};
}

// ---- Seeded weights ------------------------------------------------------------------------
//
// The layout and the values are core/ops/seeded_weights.h's (the CUDA backend generates the same
// tensors on the device from it). kLayerTensors and kFeatureTensors list the tensors in the
// order of its SeededLayerTensor and SeededFeatureTensor.

constexpr uint32_t kLayerTensorsCount = kLayerTensors.size();
constexpr uint32_t kFeatureTensorsCount = kFeatureTensors.size();
static_assert(kLayerTensorsCount == ops::kSeededLayerTensorsCount);
static_assert(kFeatureTensorsCount == ops::kSeededFeatureTensorsCount);
static_assert(kMambaTensors.size() == ops::kSeededMambaTensorsCount);

// Elements a thread seeds at the least (~1 ms of Philox): fewer are not worth a thread.
constexpr int64_t kSeedsPerThreadMin = int64_t{1} << 18;

// Elements seeded at a time: 16 lanes of Philox fill one AVX-512 register per counter word (2x the
// one-at-a-time loop with SSE2 alone, 3.5x with AVX-512, the same bits).
constexpr int kSeedLanes = 16;

// One tensor weights_from_seed makes: where it goes, its Philox tensor index, its size and range.
struct SeededTensorJob {
  std::vector<float>* values;
  uint32_t tensor_index;
  int64_t count;
  ops::SeededRange range;
};

// x86-64 builds fill_seeded twice, for AVX-512 and for the baseline, and picks one by the CPU
// when the program loads.
#if defined(__x86_64__)
#define LS_SEED_TARGETS [[gnu::target_clones("avx512f", "default")]]
#else
#define LS_SEED_TARGETS
#endif

// Elements [begin, end) of a job's tensor: ops::seeded_value of each, kSeedLanes at a time.
LS_SEED_TARGETS
void fill_seeded(uint64_t seed, const SeededTensorJob& job, int64_t begin, int64_t end) {
  float* values = job.values->data();
  const ops::SeededRange range = job.range;  // a copy: the stores to values cannot change it
  const uint32_t tensor_index = job.tensor_index;
  const ops::PhiloxKey key = ops::philox_key(seed);
  int64_t i = begin;
  for (; i + kSeedLanes <= end; i += kSeedLanes) {
    ops::PhiloxBlock lanes[kSeedLanes];
    for (int lane = 0; lane < kSeedLanes; ++lane) {
      lanes[lane] = ops::philox_counter(static_cast<uint64_t>(i + lane), tensor_index);
    }
    ops::philox4x32_10_lanes(lanes, key);
    for (int lane = 0; lane < kSeedLanes; ++lane) {
      values[i + lane] =
          ops::seeded_value_from_bits(lanes[lane].word[0], range.center, range.half_width);
    }
  }
  for (; i < end; ++i) {
    values[i] = ops::seeded_value(seed, tensor_index, i, range.center, range.half_width);
  }
}

// Makes every job's tensor over up to `threads` threads; the values do not depend on the split.
// First each tensor is allocated, largest first, by whichever thread is free, so the page faults
// of zeroing it (most of the time on a VM) run in parallel too; then the elements of all of them,
// end to end, are split into contiguous runs.
void make_seeded_tensors(uint64_t seed, std::span<const SeededTensorJob> jobs, int32_t threads) {
  int64_t total = 0;
  for (const SeededTensorJob& job : jobs) total += job.count;
  threads = static_cast<int32_t>(std::clamp<int64_t>(total / kSeedsPerThreadMin, 1, threads));
  std::vector<const SeededTensorJob*> largest_first;
  for (const SeededTensorJob& job : jobs) largest_first.push_back(&job);
  std::ranges::stable_sort(largest_first, std::greater{}, &SeededTensorJob::count);
  std::atomic<size_t> next_allocation{0};
  in_thread_runs(threads, threads, [&](int64_t, int64_t, int32_t) {
    for (size_t j = next_allocation++; j < largest_first.size(); j = next_allocation++) {
      *largest_first[j]->values = std::vector<float>(static_cast<size_t>(largest_first[j]->count));
    }
  });
  in_thread_runs(total, threads, [&](int64_t begin, int64_t end, int32_t) {
    int64_t job_begin = 0;  // the job's first element in the concatenation of all
    for (const SeededTensorJob& job : jobs) {
      const int64_t first = std::max(begin, job_begin), last = std::min(end, job_begin + job.count);
      if (first < last) fill_seeded(seed, job, first - job_begin, last - job_begin);
      job_begin += job.count;
    }
  });
}

ops::SeededRange linear_range(int64_t cols) {
  return {0.0f, 1.0f / std::sqrt(static_cast<float>(cols))};
}

// The range of Mamba tensor k (core/ops/seeded_weights.h): the projections as linear weights,
// the rest by kind.
ops::SeededRange mamba_seeded_range(const ModelConfig& config, uint32_t k) {
  switch (static_cast<ops::SeededMambaTensor>(k)) {
    case ops::kSeededInProj: return linear_range(config.hidden_size);
    case ops::kSeededConvWeight: return ops::kSeededConvRange;
    case ops::kSeededConvBias: return ops::kSeededBiasRange;
    case ops::kSeededDtBias: return ops::kSeededDtBiasRange;
    case ops::kSeededALog: return ops::kSeededALogRange;
    case ops::kSeededDSkip:
    case ops::kSeededMambaNorm: return ops::kSeededNormRange;
    case ops::kSeededOutProj: return linear_range(config.mamba.inner_size());
    case ops::kSeededMambaTensorsCount: break;
  }
  LS_ASSERT(false, "mamba tensor {}", k);
  return {};
}

// Layer l's mixer tensors, when it is a Mamba layer (each present tensor at its own index).
void add_mamba_jobs(const ModelConfig& config, uint32_t l, LayerWeights& layer,
                    std::vector<SeededTensorJob>& jobs) {
  const auto layers_count = static_cast<uint32_t>(config.layers_count);
  for (uint32_t k = 0; k < kMambaTensors.size(); ++k) {
    const MambaTensorSpec& spec = kMambaTensors[k];
    if (!layer_has(config, static_cast<int32_t>(l), spec)) continue;
    jobs.push_back(
        {&(layer.*spec.field),
         ops::seeded_mamba_tensor_index(layers_count, l, static_cast<ops::SeededMambaTensor>(k)),
         elements_of(config, spec.rows, spec.cols), mamba_seeded_range(config, k)});
  }
}

// ---- Digest --------------------------------------------------------------------------------

// The fields that came with the families, as a second line only when one differs from a plain
// Llama with default RoPE: digests of models from before the families stay what they were.
// max_positions and sliding_window are left out: they bound the context, not the arithmetic.
std::string config_extension_text(const ModelConfig& c) {
  const bool plain = c.family == ModelFamily::kLlama && c.rope_type == RopeType::kDefault &&
                     !c.qkv_bias && !c.qk_norm;
  if (plain) return "";
  return fmt::format(
      "lockstep.model_config.families.v1 family={} rope_type={} rope_factor_bits={:08x} "
      "rope_low_freq_factor_bits={:08x} rope_high_freq_factor_bits={:08x} "
      "rope_original_max_positions={} qkv_bias={} qk_norm={}\n",
      to_string(c.family), to_string(c.rope_type), std::bit_cast<uint32_t>(c.rope_factor),
      std::bit_cast<uint32_t>(c.rope_low_freq_factor),
      std::bit_cast<uint32_t>(c.rope_high_freq_factor), c.rope_original_max_positions,
      c.qkv_bias ? 1 : 0, c.qk_norm ? 1 : 0);
}

// The hybrid fields, as a third line only for a model with a layer-kind table.
std::string config_hybrid_text(const ModelConfig& c) {
  if (c.layer_kinds.empty()) return "";
  std::string kinds;
  for (const LayerKind kind : c.layer_kinds) kinds += kind == LayerKind::kMamba2 ? 'M' : 'A';
  const MambaConfig& m = c.mamba;
  return fmt::format(
      "lockstep.model_config.hybrid.v1 layers={} mamba_heads={} mamba_head_dim={} "
      "mamba_groups={} mamba_state={} mamba_conv={} mamba_conv_bias={} dt_min_bits={:08x} "
      "dt_max_bits={:08x}\n",
      kinds, m.heads_count, m.head_dim, m.groups_count, m.state_size, m.conv_kernel,
      m.conv_bias ? 1 : 0, std::bit_cast<uint32_t>(m.dt_min), std::bit_cast<uint32_t>(m.dt_max));
}

// A partial rotary, as a fourth line only when RoPE leaves part of each head unrotated: digests of
// full-rotary models stay what they were.
std::string config_rotary_text(const ModelConfig& c) {
  if (c.partial_rotary_dim == 0) return "";
  return fmt::format("lockstep.model_config.rotary.v1 partial_rotary_dim={}\n", c.partial_rotary_dim);
}

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
      std::bit_cast<uint32_t>(c.rms_eps), c.tied_embeddings ? 1 : 0) + config_extension_text(c) +
         config_hybrid_text(c) + config_rotary_text(c);
}

// ---- Hugging Face directory ----------------------------------------------------------------
//
// Every filesystem call takes an error_code: a std::filesystem_error must never escape as
// something other than ls::Error (a symlink loop once aborted the CLI). Each error names the path.

constexpr const char* kIndexName = "model.safetensors.index.json";

enum class PathKind : uint8_t { kMissing, kFile, kDirectory, kOther };

// What is at `path` (symlinks followed, as in Hugging Face cache snapshots); a path that cannot be
// examined (a loop, a permission) is an error naming it.
PathKind path_kind(const std::filesystem::path& path, const std::string& what) {
  std::error_code error;
  const std::filesystem::file_status status = std::filesystem::status(path, error);
  if (status.type() == std::filesystem::file_type::not_found) return PathKind::kMissing;
  LS_REQUIRE(!error, "{} {}: cannot access: {}", what, path.string(), error.message());
  if (status.type() == std::filesystem::file_type::regular) return PathKind::kFile;
  if (status.type() == std::filesystem::file_type::directory) return PathKind::kDirectory;
  return PathKind::kOther;
}

void require_regular_file(const std::filesystem::path& path, const std::string& what) {
  const PathKind kind = path_kind(path, what);
  LS_REQUIRE(kind != PathKind::kMissing, "{} {} is missing", what, path.string());
  LS_REQUIRE(kind != PathKind::kDirectory, "{} {} is a directory, not a file", what, path.string());
  LS_REQUIRE(kind == PathKind::kFile, "{} {} is not a regular file", what, path.string());
}

std::string read_text_file(const std::filesystem::path& path) {
  std::error_code error;
  const std::uintmax_t size = std::filesystem::file_size(path, error);
  LS_REQUIRE(!error, "{}: cannot read: {}", path.string(), error.message());
  LS_REQUIRE(size <= kConfigBytesMax, "{}: {} bytes is larger than the limit of {} bytes",
             path.string(), size, kConfigBytesMax);
  errno = 0;
  std::ifstream in(path, std::ios::binary);
  LS_REQUIRE(in.is_open(), "{}: cannot open: {}", path.string(),
             errno != 0 ? std::strerror(errno) : "unknown error");
  std::string text{std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
  LS_REQUIRE(!in.bad(), "{}: read failed", path.string());
  return text;
}

// The *.safetensors entries of a directory, sorted (directory order is unspecified; errors must
// not depend on it). An entry so named that is not a readable regular file is an error, not a
// file to skip: it is most likely a shard that did not download.
std::vector<std::filesystem::path> list_safetensors(const std::filesystem::path& directory) {
  std::vector<std::filesystem::path> paths;
  std::error_code error;
  for (auto it = std::filesystem::directory_iterator(directory, error);
       !error && it != std::filesystem::directory_iterator(); it.increment(error)) {
    if (it->path().extension() != ".safetensors") continue;
    require_regular_file(it->path(), "safetensors file");
    paths.push_back(it->path());
  }
  LS_REQUIRE(!error, "model directory {}: cannot list: {}", directory.string(), error.message());
  std::ranges::sort(paths);
  return paths;
}

// model.safetensors.index.json's weight_map: tensor name → shard file name.
std::map<std::string, std::string> read_index(const std::filesystem::path& path) {
  const nlohmann::json index = parse_json_object(read_text_file(path), path.string());
  for (const auto& [key, value] : index.items()) {
    LS_REQUIRE(key == "weight_map" || key == "metadata", "{}: key '{}' is not supported (only "
               "'weight_map' and 'metadata')", path.string(), key);
  }
  const auto map = index.find("weight_map");
  LS_REQUIRE(map != index.end() && map->is_object(), "{}: 'weight_map' must be an object",
             path.string());
  std::map<std::string, std::string> out;
  for (const auto& [tensor, shard] : map->items()) {
    LS_REQUIRE(shard.is_string(), "{}: weight_map['{}'] must be a file name, got {}", path.string(),
               tensor, shard.dump());
    const std::string& file = shard.get_ref<const std::string&>();
    // A shard is a file beside the index; a path out of the directory is not a shard.
    LS_REQUIRE(!file.empty() && file != "." && file != ".." && file.find('/') == std::string::npos,
               "{}: weight_map['{}'] = \"{}\" is not a file name in the directory", path.string(),
               tensor, file);
    out.emplace(tensor, file);
  }
  LS_REQUIRE(!out.empty(), "{}: 'weight_map' is empty", path.string());
  return out;
}

// Every tensor of a checkpoint's shards, each name owned by exactly one file, with a record of
// which ones the loader consumed: whatever is left at the end is a tensor the model would ignore.
class TensorDirectory {
 public:
  explicit TensorDirectory(const std::filesystem::path& directory);
  bool contains(const std::string& name) const { return owner_.contains(name); }
  std::vector<float> read(const std::string& name, const std::vector<int64_t>& shape);
  // Throws naming the first tensor no read consumed.
  void require_all_consumed(const ModelConfig& config) const;

 private:
  void add_file(const std::filesystem::path& path);
  void check_index(const std::filesystem::path& index_path,
                   const std::map<std::string, std::string>& weight_map) const;

  std::filesystem::path directory_;
  std::vector<SafetensorsFile> files_;
  std::map<std::string, size_t> owner_;  // tensor name → index in files_
  std::set<std::string> consumed_;
};

TensorDirectory::TensorDirectory(const std::filesystem::path& directory) : directory_(directory) {
  const std::vector<std::filesystem::path> listed = list_safetensors(directory);
  const std::filesystem::path index_path = directory / kIndexName;
  if (path_kind(index_path, "shard index") == PathKind::kMissing) {
    LS_REQUIRE(!listed.empty(), "model directory {}: no *.safetensors files", directory.string());
    for (const auto& path : listed) add_file(path);
    return;
  }
  require_regular_file(index_path, "shard index");
  const std::map<std::string, std::string> weight_map = read_index(index_path);
  std::set<std::string> shards;
  for (const auto& [tensor, shard] : weight_map) shards.insert(shard);
  for (const std::string& shard : shards) {
    const std::filesystem::path path = directory / shard;
    LS_REQUIRE(path_kind(path, "safetensors file") != PathKind::kMissing,
               "model directory {}: shard {} named by {} is missing", directory.string(),
               path.string(), kIndexName);
    require_regular_file(path, "safetensors file");
    add_file(path);
  }
  for (const auto& path : listed) {
    LS_REQUIRE(shards.contains(path.filename().string()),
               "model directory {}: {} is not named by {}: a stale shard or a second copy of the "
               "weights", directory.string(), path.filename().string(), kIndexName);
  }
  check_index(index_path, weight_map);
}

void TensorDirectory::add_file(const std::filesystem::path& path) {
  files_.push_back(SafetensorsFile::open(path));
  for (const TensorInfo& info : files_.back().tensors()) {
    const auto [it, inserted] = owner_.emplace(info.name, files_.size() - 1);
    LS_REQUIRE(inserted, "model directory {}: tensor '{}' appears in both {} and {}",
               directory_.string(), info.name, files_[it->second].path().filename().string(),
               path.filename().string());
  }
}

// The index and the shards must agree tensor for tensor: a reader trusting either would load the
// same model.
void TensorDirectory::check_index(const std::filesystem::path& index_path,
                                  const std::map<std::string, std::string>& weight_map) const {
  for (const auto& [tensor, shard] : weight_map) {
    const auto it = owner_.find(tensor);
    LS_REQUIRE(it != owner_.end() && files_[it->second].path().filename() == shard,
               "{}: maps tensor '{}' to {}, which does not hold it", index_path.string(), tensor,
               shard);
  }
  for (const auto& [tensor, file_index] : owner_) {
    LS_REQUIRE(weight_map.contains(tensor), "{}: tensor '{}' of {} is not in its weight_map",
               index_path.string(), tensor, files_[file_index].path().filename().string());
  }
}

std::vector<float> TensorDirectory::read(const std::string& name,
                                         const std::vector<int64_t>& shape) {
  const auto it = owner_.find(name);
  LS_REQUIRE(it != owner_.end(), "model directory {}: tensor '{}' not found in any of its {} "
             "*.safetensors files", directory_.string(), name, files_.size());
  consumed_.insert(name);
  return files_[it->second].read_f32(name, shape);
}

void TensorDirectory::require_all_consumed(const ModelConfig& config) const {
  for (const auto& [name, file_index] : owner_) {
    LS_REQUIRE(consumed_.contains(name),
               "model directory {}: tensor '{}' in {} is not used by a {} with this config.json "
               "(num_hidden_layers = {}, tie_word_embeddings = {}); {} of {} tensors are unused: "
               "refusing to ignore them", directory_.string(), name,
               files_[file_index].path().filename().string(), architecture_name(config.family),
               config.layers_count, config.tied_embeddings, owner_.size() - consumed_.size(),
               owner_.size());
  }
}

std::string directory_label(const std::filesystem::path& directory) {
  const std::filesystem::path normal = directory.lexically_normal();
  const std::filesystem::path last = normal.has_filename() ? normal.filename()
                                                           : normal.parent_path().filename();
  return last.empty() ? directory.string() : last.string();
}

ModelConfig read_hf_config(const std::filesystem::path& directory) {
  const std::filesystem::path path = directory / "config.json";
  LS_REQUIRE(path_kind(path, "config") != PathKind::kMissing, "model directory {}: no config.json",
             directory.string());
  require_regular_file(path, "config");
  const std::string text = read_text_file(path);
  try {
    return model_config_from_hf_json(text, directory_label(directory));
  } catch (const Error& e) {  // add the file, which model_config_from_hf_json does not know
    throw Error(fmt::format("{}: {}", path.string(), e.what()));
  }
}

void read_layer(TensorDirectory& tensors, const ModelConfig& config, size_t index,
                LayerWeights& layer) {
  const auto l = static_cast<int32_t>(index);
  for (const LayerTensorSpec& spec : kLayerTensors) {
    if (!layer_has(config, l, spec)) continue;  // left over: require_all_consumed names it
    layer.*spec.field = tensors.read(hf_layer_name(config, index, spec.hf_suffix),
                                     spec_shape(config, spec));
  }
  for (const MambaTensorSpec& spec : kMambaTensors) {
    if (!layer_has(config, l, spec)) continue;
    std::vector<int64_t> shape = {dim_size(config, spec.rows)};
    if (spec.field == &LayerWeights::conv_weight) shape.push_back(1);
    if (spec.cols != Dim::kNone) shape.push_back(dim_size(config, spec.cols));
    layer.*spec.field = tensors.read(hf_layer_name(config, index, spec.hf_suffix), shape);
  }
  for (const FeatureTensorSpec& spec : kFeatureTensors) {
    if (!has_feature(config, spec.feature)) continue;  // left over: require_all_consumed names it
    const std::string name = fmt::format("model.layers.{}.{}", index, spec.hf_suffix);
    layer.*spec.field = tensors.read(name, {dim_size(config, spec.rows)});
  }
}

// With tied embeddings the LM head is the embedding. A checkpoint may still carry lm_head.weight:
// it is consumed only when it equals the embedding bit for bit; otherwise the two would disagree
// about the model and the load fails.
void read_tied_head(TensorDirectory& tensors, const ModelWeights& weights,
                    const std::filesystem::path& directory) {
  const ModelConfig& c = weights.config;
  if (!tensors.contains("lm_head.weight")) return;
  const std::vector<float> head = tensors.read("lm_head.weight", {c.vocab_size, c.hidden_size});
  const auto same = [](float a, float b) { return std::bit_cast<uint32_t>(a) == std::bit_cast<uint32_t>(b); };
  const auto [mismatch, unused] = std::ranges::mismatch(head, weights.embedding, same);
  LS_REQUIRE(mismatch == head.end(), "model directory {}: tie_word_embeddings is true but "
             "lm_head.weight differs from model.embed_tokens.weight (first at element {}): the "
             "files hold an untied model", directory.string(), mismatch - head.begin());
}

}  // namespace

ModelWeights weights_from_seed(const ModelConfig& config, uint64_t seed, int32_t threads) {
  config.validate();
  LS_REQUIRE(threads >= 1, "weights_from_seed: threads {} (at least 1)", threads);
  // Tensor indices up to 3 + 9·L + 5·L + 8·L must fit Philox's 32-bit counter word.
  const auto layers_count = static_cast<uint32_t>(config.layers_count);  // > 0 after validate()
  LS_REQUIRE(layers_count <= (std::numeric_limits<uint32_t>::max() - 3) /
                                 (kLayerTensorsCount + kFeatureTensorsCount + kMambaTensors.size()),
             "weights_from_seed: layers_count {} is too large", layers_count);
  require_host_memory(static_cast<uint64_t>(config.parameters_count()) * sizeof(float),
                      fmt::format("the fp32 weights of model '{}' ({} parameters)", config.name,
                                  config.parameters_count()));
  const int64_t hidden = config.hidden_size;
  const int64_t vocab = config.vocab_size;
  ModelWeights weights;
  weights.config = config;
  weights.layers.resize(static_cast<size_t>(config.layers_count));  // the jobs point into it
  std::vector<SeededTensorJob> jobs;
  jobs.push_back({&weights.embedding, ops::kSeededEmbeddingIndex, vocab * hidden,
                  ops::kSeededEmbeddingRange});
  for (uint32_t l = 0; l < layers_count; ++l) {
    for (uint32_t k = 0; k < kLayerTensorsCount; ++k) {
      const LayerTensorSpec& spec = kLayerTensors[k];
      if (!layer_has(config, static_cast<int32_t>(l), spec)) continue;  // a Mamba layer: no wq..wo
      const int64_t rows = dim_size(config, spec.rows);
      const bool norm = spec.cols == Dim::kNone;
      const int64_t cols = norm ? 1 : dim_size(config, spec.cols);
      jobs.push_back({&(weights.layers[l].*spec.field),
                      ops::seeded_layer_tensor_index(l, static_cast<ops::SeededLayerTensor>(k)),
                      rows * cols, norm ? ops::kSeededNormRange : linear_range(cols)});
    }
    for (uint32_t k = 0; k < kFeatureTensorsCount; ++k) {
      const FeatureTensorSpec& spec = kFeatureTensors[k];
      if (!has_feature(config, spec.feature)) continue;
      const auto feature = static_cast<ops::SeededFeatureTensor>(k);
      jobs.push_back({&(weights.layers[l].*spec.field),
                      ops::seeded_feature_tensor_index(layers_count, l, feature),
                      dim_size(config, spec.rows),
                      spec.is_norm ? ops::kSeededNormRange : ops::kSeededBiasRange});
    }
    add_mamba_jobs(config, l, weights.layers[l], jobs);
  }
  jobs.push_back({&weights.final_norm, ops::seeded_final_norm_index(layers_count), hidden,
                  ops::kSeededNormRange});
  if (!config.tied_embeddings) {
    jobs.push_back({&weights.lm_head, ops::seeded_lm_head_index(layers_count), vocab * hidden,
                    linear_range(hidden)});
  }
  make_seeded_tensors(seed, jobs, threads);
  return weights;
}

namespace {

// The canonical weight stream's pieces in digest order (weights.h, digest()); `config_text`
// must outlive them.
std::vector<std::span<const std::byte>> digest_pieces(const ModelWeights& w,
                                                      const std::string& config_text) {
  std::vector<std::span<const std::byte>> pieces;
  const auto add = [&](std::span<const float> values) { pieces.push_back(std::as_bytes(values)); };
  pieces.push_back(std::as_bytes(std::span(config_text)));
  add(w.embedding);
  for (const LayerWeights& layer : w.layers) {
    for (const LayerTensorSpec& spec : kLayerTensors) add(layer.*spec.field);
    // Empty (and so hashing nothing) without the features: older digests are unchanged.
    for (const FeatureTensorSpec& spec : kFeatureTensors) add(layer.*spec.field);
    for (const MambaTensorSpec& spec : kMambaTensors) add(layer.*spec.field);
  }
  add(w.final_norm);
  if (!w.config.tied_embeddings) add(w.lm_head_view());
  return pieces;
}

}  // namespace

std::string_view to_string(WeightsDigestForm form) {
  switch (form) {
    case WeightsDigestForm::kStream: return "stream";
    case WeightsDigestForm::kBlocks: return "blocks";
  }
  LS_ASSERT(false, "weights digest form {}", static_cast<int>(form));
  return "";
}

std::optional<WeightsDigestForm> weights_digest_form_named(std::string_view name) {
  for (const WeightsDigestForm form : {WeightsDigestForm::kStream, WeightsDigestForm::kBlocks}) {
    if (name == to_string(form)) return form;
  }
  return std::nullopt;
}

uint64_t ModelWeights::digest(WeightsDigestForm form, int32_t threads) const {
  const std::string config_text = config_canonical_text(config);
  const std::vector<std::span<const std::byte>> pieces = digest_pieces(*this, config_text);
  if (form == WeightsDigestForm::kStream) return xxh3_stream_digest(pieces);
  return xxh3_blocks_digest(pieces, kWeightsDigestBlockBytes, threads);
}

std::shared_future<uint64_t> ModelWeights::digest_in_background(WeightsDigestForm form) const {
  return std::async(std::launch::async, [this, form] { return digest(form); }).share();
}

void ModelWeights::validate() const {
  config.validate();
  const ModelConfig& c = config;
  auto require_size = [&](const std::vector<float>& values, int64_t expected, const std::string& what) {
    LS_REQUIRE(static_cast<int64_t>(values.size()) == expected,
               "model weights '{}': {} has {} values, expected {}", c.name, what, values.size(),
               expected);
  };
  require_size(embedding, int64_t{c.vocab_size} * c.hidden_size, "the embedding");
  LS_REQUIRE(static_cast<int64_t>(layers.size()) == c.layers_count,
             "model weights '{}': {} layers for layers_count {}", c.name, layers.size(),
             c.layers_count);
  for (size_t i = 0; i < layers.size(); ++i) {
    const auto l = static_cast<int32_t>(i);
    for (const LayerTensorSpec& spec : kLayerTensors) {
      require_size(layers[i].*spec.field,
                   layer_has(c, l, spec) ? elements_of(c, spec.rows, spec.cols) : 0,
                   fmt::format("layer {} {}", i, spec.hf_suffix));
    }
    for (const MambaTensorSpec& spec : kMambaTensors) {
      require_size(layers[i].*spec.field,
                   layer_has(c, l, spec) ? elements_of(c, spec.rows, spec.cols) : 0,
                   fmt::format("layer {} {}", i, spec.hf_suffix));
    }
    for (const FeatureTensorSpec& spec : kFeatureTensors) {
      require_size(layers[i].*spec.field, has_feature(c, spec.feature) ? dim_size(c, spec.rows) : 0,
                   fmt::format("layer {} {}", i, spec.hf_suffix));
    }
  }
  require_size(final_norm, c.hidden_size, "the final norm");
  require_size(lm_head, c.tied_embeddings ? 0 : int64_t{c.vocab_size} * c.hidden_size,
               "the LM head");
}

ModelWeights load_hf_directory(const std::filesystem::path& directory) {
  const PathKind kind = path_kind(directory, "model directory");
  LS_REQUIRE(kind != PathKind::kMissing, "model directory {} does not exist", directory.string());
  LS_REQUIRE(kind == PathKind::kDirectory, "model directory {} is not a directory",
             directory.string());
  ModelWeights weights;
  weights.config = read_hf_config(directory);
  const ModelConfig& config = weights.config;
  TensorDirectory tensors(directory);
  const std::vector<int64_t> vocab_by_hidden = {config.vocab_size, config.hidden_size};
  weights.embedding = tensors.read("model.embed_tokens.weight", vocab_by_hidden);
  weights.layers.resize(static_cast<size_t>(config.layers_count));
  for (size_t i = 0; i < weights.layers.size(); ++i) {
    read_layer(tensors, config, i, weights.layers[i]);
  }
  const char* final_norm = config.family == ModelFamily::kBamba ? "model.final_layernorm.weight"
                                                                 : "model.norm.weight";
  weights.final_norm = tensors.read(final_norm, {config.hidden_size});
  if (config.tied_embeddings) {
    read_tied_head(tensors, weights, directory);
  } else {
    weights.lm_head = tensors.read("lm_head.weight", vocab_by_hidden);
  }
  tensors.require_all_consumed(config);
  weights.validate();
  return weights;
}

}  // namespace ls
