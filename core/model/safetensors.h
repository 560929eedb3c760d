// The safetensors format: an 8-byte little-endian header length N, N bytes of JSON naming each
// tensor's dtype, shape and [begin, end) data offsets, then the data. Files are untrusted: every
// length and offset is checked before use and errors name the file, tensor and field.
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <span>
#include <string>
#include <vector>

namespace ls {

enum class DType : uint8_t { kF32 = 0, kF16 = 1, kBF16 = 2 };
std::string dtype_name(DType dtype);
size_t dtype_size(DType dtype);

struct TensorInfo {
  std::string name;
  DType dtype = DType::kF32;
  std::vector<int64_t> shape;
  size_t data_begin = 0;  // offset within the data section
  size_t data_end = 0;
  int64_t elements_count() const;
};

// A memory-mapped safetensors file.
class SafetensorsFile {
 public:
  static SafetensorsFile open(const std::filesystem::path& path);
  SafetensorsFile(SafetensorsFile&&) noexcept;
  SafetensorsFile& operator=(SafetensorsFile&&) noexcept;
  ~SafetensorsFile();

  const std::filesystem::path& path() const;
  const std::vector<TensorInfo>& tensors() const;
  const TensorInfo* find(const std::string& name) const;
  // The tensor converted to fp32. Throws when the name is missing or the shape differs.
  std::vector<float> read_f32(const std::string& name, std::span<const int64_t> expected_shape) const;

 private:
  struct Impl;
  explicit SafetensorsFile(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

struct NamedTensor {
  std::string name;
  std::vector<int64_t> shape;
  std::span<const float> values;
};

// Writes fp32 values stored as `dtype` (round-to-nearest-even for bf16 and fp16).
void write_safetensors(const std::filesystem::path& path, std::span<const NamedTensor> tensors,
                       DType dtype);

// Conversions used by the loader and by tests.
float bf16_to_f32(uint16_t bits);
uint16_t f32_to_bf16(float value);
// f32_to_bf16 of each value into `bits` (the same size), in `threads` contiguous runs, each on a
// thread of its own (in_thread_runs; each value alone, so the split changes no bit): the upload of
// fp32 weights to a bf16 device.
void f32_to_bf16(std::span<const float> values, std::span<uint16_t> bits, int32_t threads);
float f16_to_f32(uint16_t bits);
uint16_t f32_to_f16(float value);

}  // namespace ls
