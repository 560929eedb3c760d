// The safetensors reader and writer and the bf16/f16 conversions. Expected values come from hand
// computation (bit patterns worked out on paper), from files whose bytes the test writes itself,
// or from an independent conversion path (the compiler's _Float16, a double-precision rounding
// oracle) — never from the code under test.
#include "core/check.h"
#include "core/model/safetensors.h"

#include <fmt/format.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "tests/scratch_dir.h"
#include <unistd.h>

#include <bit>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <string>
#include <vector>

namespace ls {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;

using testing::ScratchDir;

void write_bytes(const fs::path& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  ASSERT_TRUE(out.good()) << path;
}

std::string u64_le(uint64_t value) {
  std::string bytes;
  for (int i = 0; i < 8; ++i) bytes.push_back(static_cast<char>((value >> (8 * i)) & 0xFF));
  return bytes;
}

// A file laid out by hand: length prefix, header text as given, data bytes.
std::string raw_file(const std::string& header, const std::string& data) {
  return u64_le(header.size()) + header + data;
}

std::string f32_bytes(std::initializer_list<float> values) {
  std::string bytes;
  for (const float value : values) {
    const auto bits = std::bit_cast<uint32_t>(value);
    for (int i = 0; i < 4; ++i) bytes.push_back(static_cast<char>((bits >> (8 * i)) & 0xFF));
  }
  return bytes;
}

// Opens `path` expecting ls::Error; returns its message ("" and a failure when none is thrown).
std::string open_error(const fs::path& path) {
  try {
    SafetensorsFile::open(path);
  } catch (const Error& e) {
    return e.what();
  }
  ADD_FAILURE() << "opening " << path << " did not throw";
  return "";
}

// Writes a hand-made file whose header is one tensor entry `entry` and whose data is `data`.
std::string open_error_for_entry(const ScratchDir& dir, const std::string& entry,
                                 const std::string& data) {
  const fs::path path = dir.file("bad.safetensors");
  write_bytes(path, raw_file(R"({"t":)" + entry + "}", data));
  return open_error(path);
}

float from_bits(uint32_t bits) { return std::bit_cast<float>(bits); }
uint32_t to_bits(float value) { return std::bit_cast<uint32_t>(value); }

// splitmix64: a fixed generator so a failing seed reproduces on any standard library.
uint64_t next_random(uint64_t& state) {
  uint64_t z = (state += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

// ---- bf16 ----------------------------------------------------------------------------------

TEST(Bf16Conversion, KnownBitPatterns) {
  EXPECT_EQ(f32_to_bf16(1.0f), 0x3F80);
  EXPECT_EQ(f32_to_bf16(-2.5f), 0xC020);  // -1.25·2^1: sign, exponent 0x80, mantissa .0100000
  EXPECT_EQ(f32_to_bf16(0.0f), 0x0000);
  EXPECT_EQ(f32_to_bf16(-0.0f), 0x8000);
  EXPECT_EQ(f32_to_bf16(std::numeric_limits<float>::infinity()), 0x7F80);
  EXPECT_EQ(f32_to_bf16(-std::numeric_limits<float>::infinity()), 0xFF80);
  EXPECT_EQ(bf16_to_f32(0x3F80), 1.0f);
  EXPECT_EQ(bf16_to_f32(0xC020), -2.5f);
  EXPECT_EQ(bf16_to_f32(0x0001), std::ldexp(1.0f, -133));  // smallest bf16 subnormal
  EXPECT_EQ(bf16_to_f32(0x7F7F), from_bits(0x7F7F0000u));
}

TEST(Bf16Conversion, RoundsToNearestEven) {
  EXPECT_EQ(f32_to_bf16(from_bits(0x3F808000u)), 0x3F80);  // 1 + 2^-8: tie, 0x3F80 is even
  EXPECT_EQ(f32_to_bf16(from_bits(0x3F818000u)), 0x3F82);  // 1 + 3·2^-8: tie, 0x3F81 is odd
  EXPECT_EQ(f32_to_bf16(from_bits(0x3F808001u)), 0x3F81);  // just above half
  EXPECT_EQ(f32_to_bf16(from_bits(0x3F807FFFu)), 0x3F80);  // just below half
  EXPECT_EQ(f32_to_bf16(0.1f), 0x3DCD);                    // 0x3DCCCCCD: 0xCCCD > half
  EXPECT_EQ(f32_to_bf16(from_bits(0x3F7FFFFFu)), 0x3F80);  // carry into the exponent
  EXPECT_EQ(f32_to_bf16(std::numeric_limits<float>::max()), 0x7F80);  // rounds past max: inf
  EXPECT_EQ(f32_to_bf16(from_bits(0x7F7F7FFFu)), 0x7F7F);             // below half: stays finite
}

TEST(Bf16Conversion, NanStaysNan) {
  EXPECT_TRUE(std::isnan(bf16_to_f32(f32_to_bf16(std::numeric_limits<float>::quiet_NaN()))));
  // A payload only in the low 16 bits: plain truncation would produce infinity.
  EXPECT_TRUE(std::isnan(bf16_to_f32(f32_to_bf16(from_bits(0x7F800001u)))));
  EXPECT_TRUE(std::isnan(bf16_to_f32(f32_to_bf16(from_bits(0xFF800001u)))));
  EXPECT_EQ(f32_to_bf16(from_bits(0xFFC00000u)) & 0x8000, 0x8000);  // sign kept
  EXPECT_TRUE(std::isnan(bf16_to_f32(0x7FC0)));
}

// The many-value form on threads: every value's bits as the one-value form gives them, whatever
// the split (sizes no multiple of the thread count; the special patterns at both ends of runs).
TEST(Bf16Conversion, ManyOnThreadsGiveEachValuesBits) {
  std::vector<float> values;
  for (const uint32_t special : {0x7F800001u, 0xFF800001u, 0xFFC00000u, 0x7F800000u, 0x80000000u,
                                 0x3F808000u, 0x3F818000u, 0x3F7FFFFFu, 0x7F7FFFFFu, 0x00000001u}) {
    values.push_back(from_bits(special));
  }
  uint32_t state = 12345;
  while (values.size() < 100003) {
    state = state * 1664525u + 1013904223u;  // every bit pattern may come: NaNs, subnormals, ties
    values.push_back(from_bits(state));
  }
  for (const uint32_t special : {0x7F800001u, 0x3F808000u, 0x00000001u}) {
    values.push_back(from_bits(special));
  }
  for (const int32_t threads : {1, 3, 7}) {
    std::vector<uint16_t> bits(values.size(), 0xDEAD);
    f32_to_bf16(values, bits, threads);
    size_t differing = 0;
    for (size_t i = 0; i < values.size(); ++i) differing += bits[i] != f32_to_bf16(values[i]);
    EXPECT_EQ(differing, 0u) << threads << " threads";
  }
  std::vector<uint16_t> short_bits(3);
  EXPECT_THROW(f32_to_bf16(values, short_bits, 2), Error);
}

TEST(Bf16Conversion, EveryPatternRoundTrips) {
  for (uint32_t bits = 0; bits <= 0xFFFF; ++bits) {
    const float value = bf16_to_f32(static_cast<uint16_t>(bits));
    ASSERT_EQ(to_bits(value), bits << 16) << fmt::format("bf16 {:#06x}", bits);
    if (std::isnan(value)) continue;
    ASSERT_EQ(f32_to_bf16(value), bits) << fmt::format("bf16 {:#06x}", bits);
  }
}

// Reference rounding in double: pick the nearer of the two bf16 neighbours of |x|, the even one
// on a tie. Works on magnitudes; the sign is copied.
uint16_t bf16_oracle(float value) {
  const uint32_t bits = to_bits(value);
  const uint32_t sign = bits & 0x80000000u;
  const uint32_t abs_bits = bits & 0x7FFFFFFFu;
  const uint32_t truncated = abs_bits >> 16;
  if (abs_bits == 0x7F800000u) return static_cast<uint16_t>((sign >> 16) | truncated);  // inf
  const uint32_t exponent = abs_bits >> 23;
  const double lower = static_cast<double>(from_bits(truncated << 16));
  const double ulp = std::ldexp(1.0, exponent == 0 ? -133 : static_cast<int>(exponent) - 134);
  const double magnitude = static_cast<double>(from_bits(abs_bits));
  const double below = magnitude - lower;
  const double above = lower + ulp - magnitude;
  const bool up = above < below || (above == below && (truncated & 1u) != 0);
  return static_cast<uint16_t>((sign >> 16) | (truncated + (up ? 1u : 0u)));
}

TEST(Bf16Conversion, MatchesDoubleOracleOnRandomValues) {
  const uint64_t seed = 0xB16B00B5;
  SCOPED_TRACE(fmt::format("seed {:#x}", seed));
  uint64_t state = seed;
  for (int i = 0; i < 200000; ++i) {
    const auto bits = static_cast<uint32_t>(next_random(state));
    const float value = from_bits(bits);
    if (std::isnan(value)) continue;
    ASSERT_EQ(f32_to_bf16(value), bf16_oracle(value)) << fmt::format("f32 {:#010x}", bits);
  }
}

// ---- f16 -----------------------------------------------------------------------------------

TEST(F16Conversion, KnownBitPatterns) {
  EXPECT_EQ(f32_to_f16(1.0f), 0x3C00);
  EXPECT_EQ(f32_to_f16(-2.0f), 0xC000);
  EXPECT_EQ(f32_to_f16(0.1f), 0x2E66);
  EXPECT_EQ(f32_to_f16(-0.0f), 0x8000);
  EXPECT_EQ(f32_to_f16(65504.0f), 0x7BFF);  // largest finite
  EXPECT_EQ(f32_to_f16(65519.0f), 0x7BFF);  // below the midpoint to 65536
  EXPECT_EQ(f32_to_f16(65520.0f), 0x7C00);  // midpoint; 0x7BFF is odd, so up to infinity
  EXPECT_EQ(f32_to_f16(1.0e6f), 0x7C00);
  EXPECT_EQ(f32_to_f16(-std::numeric_limits<float>::infinity()), 0xFC00);
  EXPECT_EQ(f32_to_f16(std::ldexp(1.0f, -14)), 0x0400);  // smallest normal
  EXPECT_EQ(f32_to_f16(std::ldexp(1.0f, -24)), 0x0001);  // smallest subnormal
  EXPECT_EQ(f32_to_f16(std::ldexp(1023.0f, -24)), 0x03FF);
}

TEST(F16Conversion, RoundsToNearestEven) {
  EXPECT_EQ(f32_to_f16(1.0f + std::ldexp(1.0f, -11)), 0x3C00);         // tie, even down
  EXPECT_EQ(f32_to_f16(1.0f + std::ldexp(3.0f, -11)), 0x3C02);         // tie, odd up
  EXPECT_EQ(f32_to_f16(1.0f + std::ldexp(1.0f, -11) + std::ldexp(1.0f, -20)), 0x3C01);
  EXPECT_EQ(f32_to_f16(std::ldexp(1.0f, -25)), 0x0000);                // tie with 0: even
  EXPECT_EQ(f32_to_f16(std::ldexp(1.5f, -25)), 0x0001);                // above the tie
  EXPECT_EQ(f32_to_f16(std::ldexp(1.0f, -26)), 0x0000);
  EXPECT_EQ(f32_to_f16(std::ldexp(3.0f, -25)), 0x0002);                // 1.5 ulp: tie, to 2
  EXPECT_EQ(f32_to_f16(std::ldexp(5.0f, -25)), 0x0002);                // 2.5 ulp: tie, to 2
  EXPECT_EQ(f32_to_f16(std::ldexp(2047.0f, -25)), 0x0400);             // 1023.5 ulp → normal
  EXPECT_EQ(f32_to_f16(-std::ldexp(1.5f, -25)), 0x8001);
}

TEST(F16Conversion, DecodesSpecialPatterns) {
  EXPECT_EQ(f16_to_f32(0x3C00), 1.0f);
  EXPECT_EQ(f16_to_f32(0xC000), -2.0f);
  EXPECT_EQ(f16_to_f32(0x7BFF), 65504.0f);
  EXPECT_EQ(f16_to_f32(0x2E66), 0.0999755859375f);  // 2^-4 · (1 + 614/1024)
  EXPECT_EQ(f16_to_f32(0x0001), std::ldexp(1.0f, -24));
  EXPECT_EQ(f16_to_f32(0x83FF), -std::ldexp(1023.0f, -24));
  EXPECT_EQ(f16_to_f32(0x7C00), std::numeric_limits<float>::infinity());
  EXPECT_EQ(f16_to_f32(0xFC00), -std::numeric_limits<float>::infinity());
  EXPECT_TRUE(std::isnan(f16_to_f32(0x7E00)));
  EXPECT_TRUE(std::isnan(f16_to_f32(0x7C01)));  // signalling pattern, still NaN
  EXPECT_TRUE(std::signbit(f16_to_f32(0x8000)));
  EXPECT_EQ(f16_to_f32(0x8000), 0.0f);
  EXPECT_TRUE(std::isnan(f16_to_f32(f32_to_f16(std::numeric_limits<float>::quiet_NaN()))));
  EXPECT_TRUE(std::isnan(f16_to_f32(f32_to_f16(from_bits(0x7F800001u)))));
}

TEST(F16Conversion, EveryPatternRoundTrips) {
  for (uint32_t bits = 0; bits <= 0xFFFF; ++bits) {
    const float value = f16_to_f32(static_cast<uint16_t>(bits));
    if (std::isnan(value)) continue;
    ASSERT_EQ(f32_to_f16(value), bits) << fmt::format("f16 {:#06x}", bits);
  }
}

TEST(F16Conversion, MatchesCompilerFloat16) {
#if defined(__FLT16_MAX__)
  const uint64_t seed = 0xF16F16;
  SCOPED_TRACE(fmt::format("seed {:#x}", seed));
  uint64_t state = seed;
  for (int i = 0; i < 400000; ++i) {
    const uint64_t random = next_random(state);
    // Half the draws land in or near the f16 range, where the rounding cases live.
    const auto bits = (random & 1) != 0 ? static_cast<uint32_t>(random >> 32)
                                        : 0x30000000u + static_cast<uint32_t>((random >> 32) % 0x18000000u);
    const float value = from_bits(bits);
    if (std::isnan(value)) continue;
    const auto expected = static_cast<_Float16>(value);
    uint16_t expected_bits = 0;
    std::memcpy(&expected_bits, &expected, sizeof(expected_bits));
    ASSERT_EQ(f32_to_f16(value), expected_bits) << fmt::format("f32 {:#010x}", bits);
  }
#else
  GTEST_SKIP() << "this compiler has no _Float16";
#endif
}

// ---- write then read -----------------------------------------------------------------------

TEST(Safetensors, RoundTripF32KeepsEveryBit) {
  const ScratchDir dir;
  const std::vector<float> a = {1.0f, -2.5f, -0.0f, std::ldexp(1.0f, -140),
                                std::numeric_limits<float>::infinity(), 3.0e38f};
  const std::vector<float> b = {0.1f, 0.2f, 0.3f, 0.4f};
  const std::vector<float> scalar = {42.0f};
  const std::vector<NamedTensor> tensors = {
      {"z.first", {2, 3}, a}, {"a.second", {4}, b}, {"empty", {0, 5}, {}}, {"scalar", {}, scalar}};
  const fs::path path = dir.file("x.safetensors");
  write_safetensors(path, tensors, DType::kF32);

  const SafetensorsFile file = SafetensorsFile::open(path);
  ASSERT_EQ(file.tensors().size(), 4u);
  // Data follows the given order, not the sorted one: z.first at 0, a.second right after.
  const TensorInfo* first = file.find("z.first");
  ASSERT_NE(first, nullptr);
  EXPECT_EQ(first->dtype, DType::kF32);
  EXPECT_EQ(first->shape, (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(first->data_begin, 0u);
  EXPECT_EQ(first->data_end, 24u);
  EXPECT_EQ(file.find("a.second")->data_begin, 24u);
  EXPECT_EQ(file.find("a.second")->data_end, 40u);
  EXPECT_EQ(file.find("scalar")->data_begin, 40u);
  EXPECT_EQ(file.find("missing"), nullptr);

  const std::vector<int64_t> shape_a = {2, 3};
  const std::vector<float> read_a = file.read_f32("z.first", shape_a);
  ASSERT_EQ(read_a.size(), a.size());
  for (size_t i = 0; i < a.size(); ++i) EXPECT_EQ(to_bits(read_a[i]), to_bits(a[i])) << i;
  const std::vector<int64_t> shape_b = {4};
  EXPECT_EQ(file.read_f32("a.second", shape_b), b);
  const std::vector<int64_t> shape_empty = {0, 5};
  EXPECT_TRUE(file.read_f32("empty", shape_empty).empty());
  EXPECT_EQ(file.read_f32("scalar", {}), scalar);

  // Header padded to a multiple of 8; data contiguous: 8 + header + 44 bytes, nothing else.
  std::ifstream in(path, std::ios::binary);
  std::string bytes{std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
  uint64_t header_bytes = 0;
  for (int i = 7; i >= 0; --i) header_bytes = (header_bytes << 8) | static_cast<uint8_t>(bytes[i]);
  EXPECT_EQ(header_bytes % 8, 0u);
  EXPECT_EQ(bytes.size(), 8 + header_bytes + 44);
  EXPECT_EQ(bytes[8], '{');
}

TEST(Safetensors, RoundTripBf16RoundsToHandValues) {
  const ScratchDir dir;
  const std::vector<float> values = {1.0f, -2.5f, from_bits(0x3F808000u), from_bits(0x3F818000u),
                                     0.1f, -0.0f};
  // 1 + 2^-8 ties down to 1; 1 + 3·2^-8 ties up to 1 + 2^-6; 0.1 → 0x3DCD.
  const std::vector<float> expected = {1.0f, -2.5f, 1.0f, 1.015625f, 0.10009765625f, -0.0f};
  const std::vector<NamedTensor> tensors = {{"w", {2, 3}, values}};
  const fs::path path = dir.file("bf16.safetensors");
  write_safetensors(path, tensors, DType::kBF16);
  const SafetensorsFile file = SafetensorsFile::open(path);
  EXPECT_EQ(file.find("w")->dtype, DType::kBF16);
  EXPECT_EQ(file.find("w")->data_end, 12u);
  const std::vector<int64_t> shape = {2, 3};
  const std::vector<float> read = file.read_f32("w", shape);
  ASSERT_EQ(read.size(), expected.size());
  for (size_t i = 0; i < read.size(); ++i) EXPECT_EQ(to_bits(read[i]), to_bits(expected[i])) << i;
}

TEST(Safetensors, RoundTripF16RoundsToHandValues) {
  const ScratchDir dir;
  const std::vector<float> values = {1.0f, -2.0f, 65504.0f, 0.1f, std::ldexp(1.0f, -24), 1.0e6f};
  const std::vector<float> expected = {1.0f, -2.0f, 65504.0f, 0.0999755859375f,
                                       std::ldexp(1.0f, -24), std::numeric_limits<float>::infinity()};
  const std::vector<NamedTensor> tensors = {{"w", {6}, values}};
  const fs::path path = dir.file("f16.safetensors");
  write_safetensors(path, tensors, DType::kF16);
  const std::vector<int64_t> shape = {6};
  EXPECT_EQ(SafetensorsFile::open(path).read_f32("w", shape), expected);
}

TEST(Safetensors, ReadsHandWrittenFileWithMetadataAndUnalignedData) {
  const ScratchDir dir;
  // A BF16 scalar at [0, 2) pushes the F32 tensor to offset 2, which is not 4-aligned.
  const std::string header =
      R"({"__metadata__":{"format":"pt"},"h":{"dtype":"BF16","shape":[1],"data_offsets":[0,2]},)"
      R"("f":{"dtype":"F32","shape":[1,2],"data_offsets":[2,10]}})";
  const std::string data = std::string("\x80\x3F", 2) + f32_bytes({-2.5f, 0.5f});
  const fs::path path = dir.file("hand.safetensors");
  write_bytes(path, raw_file(header, data));
  const SafetensorsFile file = SafetensorsFile::open(path);
  ASSERT_EQ(file.tensors().size(), 2u);  // __metadata__ is not a tensor
  EXPECT_EQ(file.find("__metadata__"), nullptr);
  const std::vector<int64_t> shape_h = {1};
  EXPECT_EQ(file.read_f32("h", shape_h), std::vector<float>{1.0f});
  const std::vector<int64_t> shape_f = {1, 2};
  EXPECT_EQ(file.read_f32("f", shape_f), (std::vector<float>{-2.5f, 0.5f}));
}

TEST(Safetensors, FileMovesKeepTheMapping) {
  const ScratchDir dir;
  const std::vector<float> values = {3.0f, 4.0f};
  const std::vector<NamedTensor> tensors = {{"v", {2}, values}};
  write_safetensors(dir.file("m.safetensors"), tensors, DType::kF32);
  SafetensorsFile moved = SafetensorsFile::open(dir.file("m.safetensors"));
  SafetensorsFile target = std::move(moved);
  const std::vector<int64_t> shape = {2};
  EXPECT_EQ(target.read_f32("v", shape), values);
  EXPECT_EQ(target.path(), dir.file("m.safetensors"));
}

// ---- bad files -----------------------------------------------------------------------------

TEST(SafetensorsErrors, FileShorterThanLengthPrefix) {
  const ScratchDir dir;
  const fs::path path = dir.file("short.safetensors");
  write_bytes(path, std::string("\x05\x00\x00\x00\x00", 5));
  const std::string message = open_error(path);
  EXPECT_THAT(message, HasSubstr(path.string()));
  EXPECT_THAT(message, HasSubstr("5 bytes, shorter than the 8-byte header length"));
  write_bytes(path, "");
  EXPECT_THAT(open_error(path), HasSubstr("0 bytes"));
}

TEST(SafetensorsErrors, HeaderLengthPastEndOfFile) {
  const ScratchDir dir;
  const fs::path path = dir.file("len.safetensors");
  // Claims 1000 header bytes; the file is 8 + 42 = 50 bytes.
  write_bytes(path, u64_le(1000) + std::string(42, ' '));
  const std::string message = open_error(path);
  EXPECT_THAT(message, HasSubstr(path.string()));
  EXPECT_THAT(message, HasSubstr("header length 1000 runs past the end of the file (size 50)"));
  // A length near 2^64 must not wrap around the size check.
  write_bytes(path, u64_le(~uint64_t{0}) + "{}      ");
  EXPECT_THAT(open_error(path), HasSubstr("runs past the end of the file (size 16)"));
}

TEST(SafetensorsErrors, HeaderNotJsonOrNotObject) {
  const ScratchDir dir;
  const fs::path path = dir.file("json.safetensors");
  write_bytes(path, raw_file(R"({"t": {"dtype": "F32",)", ""));
  EXPECT_THAT(open_error(path), HasSubstr("header: not valid JSON"));
  write_bytes(path, raw_file("[1, 2]  ", ""));
  EXPECT_THAT(open_error(path), HasSubstr("header: must be a JSON object, got array"));
}

TEST(SafetensorsErrors, OffsetsPastEndOfData) {
  const ScratchDir dir;
  const std::string message = open_error_for_entry(
      dir, R"({"dtype":"F32","shape":[2],"data_offsets":[8,16]})", f32_bytes({1.0f, 2.0f}));
  EXPECT_THAT(message, HasSubstr("tensor 't'"));
  EXPECT_THAT(message, HasSubstr("data_offsets end 16 runs past the end of the data section (8 bytes)"));
}

TEST(SafetensorsErrors, TruncatedInDataSection) {
  const ScratchDir dir;
  const fs::path path = dir.file("cut.safetensors");
  const std::string header = R"({"t":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}})";
  const std::string whole = raw_file(header, f32_bytes({1.0f, 2.0f, 3.0f, 4.0f}));
  write_bytes(path, whole);
  EXPECT_NO_THROW(SafetensorsFile::open(path));  // the uncut file is fine
  write_bytes(path, whole.substr(0, whole.size() - 6));  // cut 6 bytes into the last float
  const std::string message = open_error(path);
  EXPECT_THAT(message, HasSubstr(path.string()));
  EXPECT_THAT(message, HasSubstr("tensor 't'"));
  EXPECT_THAT(message, HasSubstr("data_offsets end 16 runs past the end of the data section (10 bytes)"));
}

TEST(SafetensorsErrors, DtypeMismatchBetweenShapeAndBytes) {
  const ScratchDir dir;
  // Three F32 elements need 12 bytes; the offsets span 8.
  const std::string message = open_error_for_entry(
      dir, R"({"dtype":"F32","shape":[3],"data_offsets":[0,8]})", f32_bytes({1.0f, 2.0f}));
  EXPECT_THAT(message, HasSubstr("tensor 't'"));
  EXPECT_THAT(message, HasSubstr("dtype mismatch"));
  EXPECT_THAT(message, HasSubstr("needs 12 bytes, data_offsets span 8 bytes"));
  // The same bytes as BF16 [3] are 6 bytes, not 8.
  EXPECT_THAT(open_error_for_entry(dir, R"({"dtype":"BF16","shape":[3],"data_offsets":[0,8]})",
                                   f32_bytes({1.0f, 2.0f})),
              HasSubstr("needs 6 bytes, data_offsets span 8 bytes"));
}

TEST(SafetensorsErrors, UnsupportedDtype) {
  const ScratchDir dir;
  const std::string message = open_error_for_entry(
      dir, R"({"dtype":"I8","shape":[4],"data_offsets":[0,4]})", "abcd");
  EXPECT_THAT(message, HasSubstr("tensor 't'"));
  EXPECT_THAT(message, HasSubstr("unsupported dtype 'I8'"));
  EXPECT_THAT(open_error_for_entry(dir, R"({"dtype":7,"shape":[4],"data_offsets":[0,4]})", "abcd"),
              HasSubstr("field 'dtype' must be a string"));
}

TEST(SafetensorsErrors, MissingFields) {
  const ScratchDir dir;
  EXPECT_THAT(open_error_for_entry(dir, R"({"shape":[1],"data_offsets":[0,4]})", "abcd"),
              HasSubstr("tensor 't': missing field 'dtype'"));
  EXPECT_THAT(open_error_for_entry(dir, R"({"dtype":"F32","data_offsets":[0,4]})", "abcd"),
              HasSubstr("tensor 't': missing field 'shape'"));
  EXPECT_THAT(open_error_for_entry(dir, R"({"dtype":"F32","shape":[1]})", "abcd"),
              HasSubstr("tensor 't': missing field 'data_offsets'"));
  EXPECT_THAT(open_error_for_entry(dir, R"([1, 2])", "abcd"),
              HasSubstr("tensor 't': entry must be a JSON object"));
}

TEST(SafetensorsErrors, BadShape) {
  const ScratchDir dir;
  EXPECT_THAT(open_error_for_entry(dir, R"({"dtype":"F32","shape":[-1,1],"data_offsets":[0,4]})", "abcd"),
              HasSubstr("shape[0] is negative (-1)"));
  EXPECT_THAT(open_error_for_entry(dir, R"({"dtype":"F32","shape":[1.5],"data_offsets":[0,4]})", "abcd"),
              HasSubstr("shape[0] must be an integer"));
  EXPECT_THAT(open_error_for_entry(dir, R"({"dtype":"F32","shape":4,"data_offsets":[0,4]})", "abcd"),
              HasSubstr("field 'shape' must be an array"));
  // 2^32 · 2^32 elements would overflow int64 if multiplied blindly.
  EXPECT_THAT(open_error_for_entry(
                  dir, R"({"dtype":"F32","shape":[4294967296,4294967296],"data_offsets":[0,4]})", "abcd"),
              HasSubstr("elements"));
}

TEST(SafetensorsErrors, BadOffsets) {
  const ScratchDir dir;
  EXPECT_THAT(open_error_for_entry(dir, R"({"dtype":"F32","shape":[1],"data_offsets":[4,0]})", "abcd"),
              HasSubstr("data_offsets must be ascending, got [4, 0]"));
  EXPECT_THAT(open_error_for_entry(dir, R"({"dtype":"F32","shape":[1],"data_offsets":[0]})", "abcd"),
              HasSubstr("must be two ascending integers"));
  EXPECT_THAT(open_error_for_entry(dir, R"({"dtype":"F32","shape":[1],"data_offsets":[0,4,8]})", "abcd"),
              HasSubstr("must be two ascending integers"));
  EXPECT_THAT(open_error_for_entry(dir, R"({"dtype":"F32","shape":[1],"data_offsets":[-4,0]})", "abcd"),
              HasSubstr("data_offsets[0] must be a non-negative integer"));
  EXPECT_THAT(open_error_for_entry(dir, R"({"dtype":"F32","shape":[1],"data_offsets":[0,"4"]})", "abcd"),
              HasSubstr("data_offsets[1] must be a non-negative integer"));
}

TEST(SafetensorsErrors, MissingTensorAndWrongShape) {
  const ScratchDir dir;
  const fs::path path = dir.file("ok.safetensors");
  write_bytes(path, raw_file(R"({"w":{"dtype":"F32","shape":[2,3],"data_offsets":[0,24]}})",
                             f32_bytes({1, 2, 3, 4, 5, 6})));
  const SafetensorsFile file = SafetensorsFile::open(path);
  const std::vector<int64_t> shape = {2, 3};
  try {
    file.read_f32("nope", shape);
    ADD_FAILURE() << "no error for a missing tensor";
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), HasSubstr("tensor 'nope' not found in " + path.string()));
  }
  const std::vector<int64_t> transposed = {3, 2};
  try {
    file.read_f32("w", transposed);
    ADD_FAILURE() << "no error for a wrong shape";
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), HasSubstr("tensor 'w'"));
    EXPECT_THAT(e.what(), HasSubstr("expected shape [3, 2], got [2, 3]"));
  }
}

TEST(SafetensorsErrors, MissingFileAndDirectory) {
  const ScratchDir dir;
  EXPECT_THAT(open_error(dir.file("absent.safetensors")), HasSubstr("cannot open"));
  fs::create_directories(dir.file("sub.safetensors"));
  EXPECT_THAT(open_error(dir.file("sub.safetensors")), HasSubstr("not a regular file"));
}

TEST(SafetensorsErrors, WriterRejectsInconsistentTensors) {
  const ScratchDir dir;
  const std::vector<float> values = {1.0f, 2.0f, 3.0f};
  const std::vector<NamedTensor> wrong_count = {{"w", {2, 2}, values}};
  EXPECT_THROW(write_safetensors(dir.file("w.safetensors"), wrong_count, DType::kF32), Error);
  const std::vector<NamedTensor> twice = {{"w", {3}, values}, {"w", {3}, values}};
  EXPECT_THROW(write_safetensors(dir.file("w.safetensors"), twice, DType::kF32), Error);
}

// Random corruptions of a valid file must end in a clean ls::Error or a successful read —
// never a crash, a hang or another exception type (STYLE.md §18).
TEST(SafetensorsFuzz, CorruptedFilesFailCleanly) {
  const uint64_t seed = 0x5AFE7E45;
  SCOPED_TRACE(fmt::format("seed {:#x}", seed));
  const ScratchDir dir;
  const std::string header =
      R"({"__metadata__":{"k":"v"},"a":{"dtype":"BF16","shape":[2,2],"data_offsets":[0,8]},)"
      R"("b":{"dtype":"F32","shape":[3],"data_offsets":[8,20]}})";
  const std::string valid = raw_file(header, std::string(8, '\x3F') + f32_bytes({1, 2, 3}));
  uint64_t state = seed;
  int errors_count = 0;
  for (int round = 0; round < 3000; ++round) {
    std::string bytes = valid;
    const uint64_t kind = next_random(state) % 3;
    if (kind == 0) {
      bytes.resize(next_random(state) % bytes.size());
    } else {
      const uint64_t flips = 1 + next_random(state) % 4;
      for (uint64_t f = 0; f < flips; ++f) {
        bytes[next_random(state) % bytes.size()] = static_cast<char>(next_random(state));
      }
    }
    if (kind == 2) bytes.replace(0, 8, u64_le(next_random(state) % (bytes.size() + 16)));
    // A fresh name per round: truncating and rewriting one file makes ext4 flush it each time.
    const fs::path path = dir.file(fmt::format("fuzz_{}.safetensors", round));
    write_bytes(path, bytes);
    try {
      const SafetensorsFile file = SafetensorsFile::open(path);
      for (const TensorInfo& info : file.tensors()) {
        EXPECT_EQ(file.read_f32(info.name, info.shape).size(),
                  static_cast<size_t>(info.elements_count()));
      }
    } catch (const Error&) {
      ++errors_count;
    }
    fs::remove(path);
  }
  EXPECT_GT(errors_count, 100);  // the corruptions did reach the checks
}

}  // namespace
}  // namespace ls
