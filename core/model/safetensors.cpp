#include "core/model/safetensors.h"

#include "core/check.h"
#include "core/host_threads.h"
#include "core/mapped_file.h"
#include "core/model/strict_json.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <array>
#include <bit>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <fstream>
#include <limits>

namespace ls {
namespace {

using Json = nlohmann::json;

// The data section is copied straight into fp32/uint16 buffers, which is only right on a
// little-endian host (the format is little-endian). Every platform lockstep targets is.
static_assert(std::endian::native == std::endian::little, "safetensors reader assumes little-endian");

constexpr size_t kLengthPrefixBytes = 8;
// The reference implementation refuses headers above 100 MB; a larger one is a corrupt length.
constexpr uint64_t kHeaderBytesMax = uint64_t{100} << 20;
// Bounds elements·dtype_size below 2^63, so byte counts never overflow.
constexpr int64_t kElementsMax = std::numeric_limits<int64_t>::max() / 4;
// write_safetensors converts 16-bit tensors through a buffer of this many elements at a time.
constexpr size_t kWriteChunkElements = size_t{1} << 16;

std::string shape_text(std::span<const int64_t> shape) {
  return fmt::format("[{}]", fmt::join(shape, ", "));
}

uint64_t read_u64_le(std::span<const std::byte> bytes) {
  uint64_t value = 0;
  for (size_t i = kLengthPrefixBytes; i-- > 0;) value = (value << 8) | std::to_integer<uint64_t>(bytes[i]);
  return value;
}

DType parse_dtype(const std::string& where, const Json& entry) {
  const auto it = entry.find("dtype");
  LS_REQUIRE(it != entry.end(), "{}: missing field 'dtype'", where);
  LS_REQUIRE(it->is_string(), "{}: field 'dtype' must be a string, got {}", where, it->type_name());
  const std::string& text = it->get_ref<const std::string&>();
  for (const DType dtype : {DType::kF32, DType::kF16, DType::kBF16}) {
    if (text == dtype_name(dtype)) return dtype;
  }
  throw Error(fmt::format("{}: unsupported dtype '{}' (supported: F32, F16, BF16)", where, text));
}


std::vector<int64_t> parse_shape(const std::string& where, const Json& entry) {
  const auto it = entry.find("shape");
  LS_REQUIRE(it != entry.end(), "{}: missing field 'shape'", where);
  LS_REQUIRE(it->is_array(), "{}: field 'shape' must be an array, got {}", where, it->type_name());
  std::vector<int64_t> shape;
  int64_t elements = 1;
  for (size_t i = 0; i < it->size(); ++i) {
    const Json& dim = (*it)[i];
    LS_REQUIRE(dim.is_number_integer(), "{}: shape[{}] must be an integer, got {}", where, i,
               dim.type_name());
    // nlohmann stores every non-negative integer as unsigned, so a signed one is negative.
    LS_REQUIRE(dim.is_number_unsigned(), "{}: shape[{}] is negative ({})", where, i,
               dim.get<int64_t>());
    const uint64_t value = dim.get<uint64_t>();
    LS_REQUIRE(value <= static_cast<uint64_t>(kElementsMax), "{}: shape[{}] = {} is too large",
               where, i, value);
    const auto dim_size = static_cast<int64_t>(value);
    // Checked per dim so the running product never overflows, even when a later dim is 0.
    LS_REQUIRE(dim_size == 0 || elements <= kElementsMax / dim_size,
               "{}: shape has more than {} elements", where, kElementsMax);
    elements *= dim_size;
    shape.push_back(dim_size);
  }
  return shape;
}

// [begin, end) within the data section; ascending, inside it.
std::pair<size_t, size_t> parse_offsets(const std::string& where, const Json& entry,
                                        size_t data_size) {
  const auto it = entry.find("data_offsets");
  LS_REQUIRE(it != entry.end(), "{}: missing field 'data_offsets'", where);
  LS_REQUIRE(it->is_array() && it->size() == 2,
             "{}: field 'data_offsets' must be two ascending integers [begin, end]", where);
  for (size_t i = 0; i < 2; ++i) {
    LS_REQUIRE((*it)[i].is_number_unsigned(),
               "{}: data_offsets[{}] must be a non-negative integer, got {}", where, i,
               (*it)[i].type_name());
  }
  const uint64_t begin = (*it)[0].get<uint64_t>();
  const uint64_t end = (*it)[1].get<uint64_t>();
  LS_REQUIRE(begin <= end, "{}: data_offsets must be ascending, got [{}, {}]", where, begin, end);
  LS_REQUIRE(end <= data_size,
             "{}: data_offsets end {} runs past the end of the data section ({} bytes)", where,
             end, data_size);
  return {static_cast<size_t>(begin), static_cast<size_t>(end)};
}

TensorInfo parse_entry(const std::filesystem::path& path, const std::string& name,
                       const Json& entry, size_t data_size) {
  const std::string where = fmt::format("safetensors file {}: tensor '{}'", path.string(), name);
  LS_REQUIRE(entry.is_object(), "{}: entry must be a JSON object, got {}", where,
             entry.type_name());
  TensorInfo info;
  info.name = name;
  info.dtype = parse_dtype(where, entry);
  info.shape = parse_shape(where, entry);
  std::tie(info.data_begin, info.data_end) = parse_offsets(where, entry, data_size);
  // Both fit: elements <= kElementsMax and the span lies inside the mapped file.
  const auto expected_bytes = static_cast<uint64_t>(info.elements_count()) * dtype_size(info.dtype);
  const uint64_t actual_bytes = info.data_end - info.data_begin;
  LS_REQUIRE(expected_bytes == actual_bytes,
             "{}: dtype mismatch: shape {} of {} needs {} bytes, data_offsets span {} bytes", where,
             shape_text(info.shape), dtype_name(info.dtype), expected_bytes, actual_bytes);
  return info;
}

// The header JSON, after checking the length prefix against the file size.
Json parse_header(const std::filesystem::path& path, std::span<const std::byte> bytes,
                  uint64_t header_bytes) {
  LS_REQUIRE(header_bytes <= bytes.size() - kLengthPrefixBytes,
             "safetensors file {}: header length {} runs past the end of the file (size {})",
             path.string(), header_bytes, bytes.size());
  LS_REQUIRE(header_bytes <= kHeaderBytesMax,
             "safetensors file {}: header length {} exceeds the limit of {} bytes", path.string(),
             header_bytes, kHeaderBytesMax);
  const auto* text = reinterpret_cast<const char*>(bytes.data() + kLengthPrefixBytes);
  // A duplicate key would leave two readers disagreeing about which entry the file holds.
  return parse_json_object(std::string_view(text, static_cast<size_t>(header_bytes)),
                           fmt::format("safetensors file {}: header", path.string()));
}

// Each tensor owns its bytes: two ranges that overlap would make one tensor read another's data.
void require_disjoint(const std::filesystem::path& path, std::vector<TensorInfo> tensors) {
  std::ranges::sort(tensors, {}, [](const TensorInfo& t) { return std::pair(t.data_begin, t.data_end); });
  const TensorInfo* previous = nullptr;
  for (const TensorInfo& t : tensors) {
    if (t.data_begin == t.data_end) continue;  // an empty tensor owns no byte
    if (previous != nullptr) {
      LS_REQUIRE(t.data_begin >= previous->data_end,
                 "safetensors file {}: tensors '{}' [{}, {}) and '{}' [{}, {}) overlap in the data "
                 "section", path.string(), previous->name, previous->data_begin,
                 previous->data_end, t.name, t.data_begin, t.data_end);
    }
    previous = &t;
  }
}

void write_u64_le(std::ofstream& out, uint64_t value) {
  std::array<char, kLengthPrefixBytes> bytes{};
  for (size_t i = 0; i < bytes.size(); ++i) bytes[i] = static_cast<char>((value >> (8 * i)) & 0xFF);
  out.write(bytes.data(), bytes.size());
}

// The header entry for one tensor, after checking the caller's tensor is self-consistent.
Json header_entry(const NamedTensor& tensor, DType dtype, size_t data_begin) {
  int64_t elements = 1;
  for (const int64_t dim : tensor.shape) {
    LS_REQUIRE(dim >= 0, "write_safetensors: tensor '{}' has a negative dim in shape {}",
               tensor.name, shape_text(tensor.shape));
    elements *= dim;
  }
  LS_REQUIRE(static_cast<size_t>(elements) == tensor.values.size(),
             "write_safetensors: tensor '{}' has shape {} ({} elements) but {} values", tensor.name,
             shape_text(tensor.shape), elements, tensor.values.size());
  const size_t data_end = data_begin + tensor.values.size() * dtype_size(dtype);
  return Json{{"dtype", dtype_name(dtype)},
              {"shape", tensor.shape},
              {"data_offsets", Json::array({data_begin, data_end})}};
}

// Header text padded with spaces to a multiple of 8 bytes, so the data section stays aligned.
std::string header_text(std::span<const NamedTensor> tensors, DType dtype) {
  Json header = Json::object();
  size_t data_begin = 0;
  for (const NamedTensor& tensor : tensors) {
    LS_REQUIRE(!tensor.name.empty() && tensor.name != "__metadata__",
               "write_safetensors: invalid tensor name '{}'", tensor.name);
    LS_REQUIRE(!header.contains(tensor.name), "write_safetensors: tensor '{}' appears twice",
               tensor.name);
    header[tensor.name] = header_entry(tensor, dtype, data_begin);
    data_begin += tensor.values.size() * dtype_size(dtype);
  }
  std::string text;
  try {
    text = header.dump();
  } catch (const Json::exception& e) {  // a tensor name that is not valid UTF-8
    throw Error(fmt::format("write_safetensors: cannot encode the header: {}", e.what()));
  }
  text.append((kLengthPrefixBytes - text.size() % kLengthPrefixBytes) % kLengthPrefixBytes, ' ');
  return text;
}

void write_values(std::ofstream& out, std::span<const float> values, DType dtype) {
  if (dtype == DType::kF32) {
    out.write(reinterpret_cast<const char*>(values.data()),
              static_cast<std::streamsize>(values.size_bytes()));
    return;
  }
  std::vector<uint16_t> chunk;
  chunk.reserve(std::min(values.size(), kWriteChunkElements));
  for (size_t begin = 0; begin < values.size(); begin += kWriteChunkElements) {
    const size_t end = std::min(values.size(), begin + kWriteChunkElements);
    chunk.clear();
    for (size_t i = begin; i < end; ++i) {
      chunk.push_back(dtype == DType::kBF16 ? f32_to_bf16(values[i]) : f32_to_f16(values[i]));
    }
    out.write(reinterpret_cast<const char*>(chunk.data()),
              static_cast<std::streamsize>(chunk.size() * sizeof(uint16_t)));
  }
}

// f32 → f16 for values below the smallest normal f16 (2^-14): the result is m·2^-24, m in
// [0, 1024], rounded to nearest even. `abs_bits` is the f32 pattern without the sign.
uint16_t f32_to_f16_subnormal(uint32_t abs_bits) {
  const uint32_t exponent = abs_bits >> 23;
  // Below 2^-25 (half the smallest subnormal) everything rounds to zero.
  if (exponent < 102) return 0;
  const uint32_t mantissa = (abs_bits & 0x7FFFFFu) | 0x800000u;  // value = mantissa·2^(e-150)
  const uint32_t shift = 126 - exponent;                          // in [14, 24]
  const uint32_t kept = mantissa >> shift;
  const uint32_t rest = mantissa & ((1u << shift) - 1);
  const uint32_t half = 1u << (shift - 1);
  const bool round_up = rest > half || (rest == half && (kept & 1u) != 0);
  // A carry into bit 10 yields 0x0400, the smallest normal: the bit patterns line up.
  return static_cast<uint16_t>(kept + (round_up ? 1u : 0u));
}

}  // namespace

std::string dtype_name(DType dtype) {
  switch (dtype) {
    case DType::kF32: return "F32";
    case DType::kF16: return "F16";
    case DType::kBF16: return "BF16";
  }
  LS_ASSERT(false, "dtype {}", static_cast<int>(dtype));
}

size_t dtype_size(DType dtype) {
  switch (dtype) {
    case DType::kF32: return 4;
    case DType::kF16: return 2;
    case DType::kBF16: return 2;
  }
  LS_ASSERT(false, "dtype {}", static_cast<int>(dtype));
}

int64_t TensorInfo::elements_count() const {
  int64_t elements = 1;
  for (const int64_t dim : shape) elements *= dim;
  return elements;
}

struct SafetensorsFile::Impl {
  explicit Impl(const std::filesystem::path& file_path) : path(file_path), mapped(file_path, "safetensors file") {}

  std::filesystem::path path;
  MappedFile mapped;
  std::span<const std::byte> data;  // the data section, inside `mapped`
  std::vector<TensorInfo> tensors;  // sorted by name, for find()
};

SafetensorsFile::SafetensorsFile(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
SafetensorsFile::SafetensorsFile(SafetensorsFile&&) noexcept = default;
SafetensorsFile& SafetensorsFile::operator=(SafetensorsFile&&) noexcept = default;
SafetensorsFile::~SafetensorsFile() = default;

SafetensorsFile SafetensorsFile::open(const std::filesystem::path& path) {
  auto impl = std::make_unique<Impl>(path);
  const std::span<const std::byte> bytes = impl->mapped.bytes();
  LS_REQUIRE(bytes.size() >= kLengthPrefixBytes,
             "safetensors file {}: file is {} bytes, shorter than the 8-byte header length",
             path.string(), bytes.size());
  const uint64_t header_bytes = read_u64_le(bytes);
  const Json header = parse_header(path, bytes, header_bytes);
  impl->data = bytes.subspan(kLengthPrefixBytes + static_cast<size_t>(header_bytes));
  for (const auto& [name, entry] : header.items()) {
    if (name == "__metadata__") continue;  // free-form string map; nothing we need
    impl->tensors.push_back(parse_entry(path, name, entry, impl->data.size()));
  }
  require_disjoint(path, impl->tensors);
  std::ranges::sort(impl->tensors, {}, &TensorInfo::name);
  return SafetensorsFile(std::move(impl));
}

const std::filesystem::path& SafetensorsFile::path() const { return impl_->path; }

const std::vector<TensorInfo>& SafetensorsFile::tensors() const { return impl_->tensors; }

const TensorInfo* SafetensorsFile::find(const std::string& name) const {
  const auto it = std::ranges::lower_bound(impl_->tensors, name, {}, &TensorInfo::name);
  return it != impl_->tensors.end() && it->name == name ? &*it : nullptr;
}

std::vector<float> SafetensorsFile::read_f32(const std::string& name,
                                             std::span<const int64_t> expected_shape) const {
  const TensorInfo* info = find(name);
  LS_REQUIRE(info != nullptr, "tensor '{}' not found in {}", name, impl_->path.string());
  LS_REQUIRE(std::ranges::equal(info->shape, expected_shape),
             "safetensors file {}: tensor '{}': expected shape {}, got {}", impl_->path.string(),
             name, shape_text(expected_shape), shape_text(info->shape));
  const auto count = static_cast<size_t>(info->elements_count());
  const size_t element_bytes = dtype_size(info->dtype);
  // open() checked these; a failure here is a bug in the parser.
  LS_ASSERT(info->data_end - info->data_begin == count * element_bytes, "tensor '{}'", name);
  LS_ASSERT(info->data_end <= impl_->data.size(), "tensor '{}'", name);
  std::vector<float> values(count);
  if (count == 0) return values;
  // memcpy, not a cast: safetensors does not align tensor data to its element size.
  const std::byte* source = impl_->data.data() + info->data_begin;
  if (info->dtype == DType::kF32) {
    std::memcpy(values.data(), source, count * element_bytes);
    return values;
  }
  const bool is_bf16 = info->dtype == DType::kBF16;
  for (size_t i = 0; i < count; ++i) {
    uint16_t bits = 0;
    std::memcpy(&bits, source + i * element_bytes, sizeof(bits));
    values[i] = is_bf16 ? bf16_to_f32(bits) : f16_to_f32(bits);
  }
  return values;
}

void write_safetensors(const std::filesystem::path& path, std::span<const NamedTensor> tensors,
                       DType dtype) {
  const std::string header = header_text(tensors, dtype);
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  LS_REQUIRE(out.is_open(), "write_safetensors: cannot open {} for writing", path.string());
  write_u64_le(out, header.size());
  out.write(header.data(), static_cast<std::streamsize>(header.size()));
  for (const NamedTensor& tensor : tensors) write_values(out, tensor.values, dtype);
  out.flush();
  LS_REQUIRE(out.good(), "write_safetensors: writing {} failed", path.string());
}

float bf16_to_f32(uint16_t bits) { return std::bit_cast<float>(static_cast<uint32_t>(bits) << 16); }

uint16_t f32_to_bf16(float value) {
  const uint32_t bits = std::bit_cast<uint32_t>(value);
  // Truncating a NaN whose payload sits in the low 16 bits would give infinity: keep it a
  // (quiet) NaN with its sign and top payload bits.
  const uint32_t nan = (bits >> 16) | 0x0040u;
  // Round to nearest even: add just under half an ulp, plus one when the kept part is odd.
  // Overflow carries into the exponent and reaches infinity, as it should.
  const uint32_t rounded = (bits + 0x7FFFu + ((bits >> 16) & 1u)) >> 16;
  // A select, not a branch, so a loop of these vectorises (the many-value form below).
  return static_cast<uint16_t>((bits & 0x7FFFFFFFu) > 0x7F800000u ? nan : rounded);
}

void f32_to_bf16(std::span<const float> values, std::span<uint16_t> bits, int32_t threads) {
  LS_REQUIRE(bits.size() == values.size(), "f32_to_bf16: {} values into {} bf16 slots",
             values.size(), bits.size());
  LS_REQUIRE(threads >= 1, "f32_to_bf16: {} threads", threads);
  in_thread_runs(static_cast<int64_t>(values.size()), threads,
                 [&](int64_t begin, int64_t end, int32_t /*thread*/) {
                   for (int64_t i = begin; i < end; ++i) {
                     bits[static_cast<size_t>(i)] = f32_to_bf16(values[static_cast<size_t>(i)]);
                   }
                 });
}

float f16_to_f32(uint16_t bits) {
  const uint32_t sign = static_cast<uint32_t>(bits & 0x8000u) << 16;
  const uint32_t exponent = (bits >> 10) & 0x1Fu;
  const uint32_t mantissa = bits & 0x3FFu;
  if (exponent == 0) {
    // Zero or subnormal m·2^-24: exact in f32, and ldexp of an exact value is exact.
    const float magnitude = std::ldexp(static_cast<float>(mantissa), -24);
    return sign != 0 ? -magnitude : magnitude;
  }
  if (exponent == 31) return std::bit_cast<float>(sign | 0x7F800000u | (mantissa << 13));
  return std::bit_cast<float>(sign | ((exponent + 112) << 23) | (mantissa << 13));
}

uint16_t f32_to_f16(float value) {
  const uint32_t bits = std::bit_cast<uint32_t>(value);
  const auto sign = static_cast<uint16_t>((bits >> 16) & 0x8000u);
  const uint32_t abs_bits = bits & 0x7FFFFFFFu;
  if (abs_bits > 0x7F800000u) {  // NaN: quiet, keeping the sign and top payload bits
    return static_cast<uint16_t>(sign | 0x7E00u | ((abs_bits >> 13) & 0x3FFu));
  }
  // 2^16 and above (infinity included) is past the largest f16 even before rounding.
  if (abs_bits >= 0x47800000u) return static_cast<uint16_t>(sign | 0x7C00u);
  if (abs_bits < 0x38800000u) return static_cast<uint16_t>(sign | f32_to_f16_subnormal(abs_bits));
  // Normal: rebias the exponent (127 → 15) and round the 13 dropped mantissa bits to nearest
  // even. A carry out of the mantissa bumps the exponent; from 30 it reaches infinity (0x7C00).
  const uint32_t kept = (((abs_bits >> 23) - 112) << 10) | ((abs_bits >> 13) & 0x3FFu);
  const uint32_t rest = abs_bits & 0x1FFFu;
  const bool round_up = rest > 0x1000u || (rest == 0x1000u && (kept & 1u) != 0);
  return static_cast<uint16_t>(sign | (kept + (round_up ? 1u : 0u)));
}

}  // namespace ls
