#include "trace/framing.h"

#include <fmt/format.h>
#include <xxhash.h>

#include <bit>
#include <cstring>

namespace ls::trace::framing {

namespace {

static_assert(std::endian::native == std::endian::little,
              "the framing's integers are little-endian in the file and in memory");

// "\0LSTRACE" read as a little-endian u64: the same magic as the header record's.
constexpr uint64_t kMagic = 0x4543415254534c00ull;
constexpr uint64_t kHeaderCheckSeed = 0x4c53465241484452ull;  // distinct from the payload's seed

uint32_t load_u32(const unsigned char* p) {
  uint32_t v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

uint64_t load_u64(const unsigned char* p) {
  uint64_t v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

uint32_t preamble_check(const unsigned char* p) {
  return static_cast<uint32_t>(XXH3_64bits(p, 12));
}

// Over the header's length and payload check, so any flip in the 16 header bytes is caught.
uint32_t header_check(uint32_t payload_bytes, uint64_t payload_check, uint64_t offset) {
  unsigned char fields[12];
  std::memcpy(fields, &payload_bytes, 4);
  std::memcpy(fields + 4, &payload_check, 8);
  return static_cast<uint32_t>(XXH3_64bits_withSeed(fields, sizeof fields, offset ^ kHeaderCheckSeed));
}

}  // namespace

void write_preamble(unsigned char* out, uint32_t format_version) {
  std::memcpy(out, &kMagic, 8);
  std::memcpy(out + 8, &format_version, 4);
  const uint32_t check = preamble_check(out);
  std::memcpy(out + 12, &check, 4);
}

PreambleStatus read_preamble(const unsigned char* data, uint32_t& format_version) {
  if (load_u64(data) != kMagic) return PreambleStatus::kNotPreamble;
  if (load_u32(data + 12) != preamble_check(data)) return PreambleStatus::kCorrupt;
  format_version = load_u32(data + 8);
  return PreambleStatus::kOk;
}

void seal_frame(unsigned char* frame, uint64_t payload_bytes, uint64_t offset) {
  const auto bytes = static_cast<uint32_t>(payload_bytes);
  const uint64_t payload_check = XXH3_64bits_withSeed(frame + kFrameHeaderBytes, payload_bytes, offset);
  const uint32_t check = header_check(bytes, payload_check, offset);
  std::memcpy(frame, &bytes, 4);
  std::memcpy(frame + 4, &check, 4);
  std::memcpy(frame + 8, &payload_check, 8);
}

Frame read_frame(const unsigned char* data, uint64_t size, uint64_t offset,
                 uint64_t payload_bytes_max, bool verify) {
  const uint64_t remaining = size - offset;
  if (remaining == 0) return {FrameStatus::kEnd};
  // A killed writer leaves a prefix of what it wrote: a short header is a torn tail.
  if (remaining < kFrameHeaderBytes) return {FrameStatus::kTorn};
  const unsigned char* p = data + offset;
  const uint32_t bytes = load_u32(p);
  const uint64_t payload_check = load_u64(p + 8);
  if (verify && load_u32(p + 4) != header_check(bytes, payload_check, offset)) {
    return {FrameStatus::kCorrupt, 0, "the frame header's check does not match"};
  }
  if (bytes % 8 != 0 || bytes < 8 || bytes > payload_bytes_max) {
    return {FrameStatus::kCorrupt, 0,
            fmt::format("the frame header's length {} is not a multiple of 8 in [8, {}]", bytes,
                        payload_bytes_max)};
  }
  if (bytes > remaining - kFrameHeaderBytes) return {FrameStatus::kTorn, bytes, {}};
  if (verify && XXH3_64bits_withSeed(p + kFrameHeaderBytes, bytes, offset) != payload_check) {
    return {FrameStatus::kCorrupt, bytes, "the message's checksum does not match its bytes"};
  }
  return {FrameStatus::kWhole, bytes, {}};
}

}  // namespace ls::trace::framing
