// The checksummed framing of a trace file (trace/trace.capnp "FILE LAYOUT" is the contract): a
// 16-byte preamble, then one frame per record — a 16-byte frame header and the record's Cap'n
// Proto message. Every byte of the file is covered by a check: the preamble by its own, a frame
// header by its header check, a message by its payload check. The checks are seeded with the
// frame's byte offset, so a record copied to another place does not check out there either.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace ls::trace::framing {

inline constexpr uint64_t kPreambleBytes = 16;
inline constexpr uint64_t kFrameHeaderBytes = 16;

// Writes the preamble of a trace of `format_version` into out[0, kPreambleBytes).
void write_preamble(unsigned char* out, uint32_t format_version);

enum class PreambleStatus { kOk, kNotPreamble, kCorrupt };
// Reads the preamble at the start of `data` (size >= kPreambleBytes): kNotPreamble when the magic
// is absent (e.g. a trace of format version 1, which had no preamble), kCorrupt when the magic is
// there but the check fails.
PreambleStatus read_preamble(const unsigned char* data, uint32_t& format_version);

// Fills the frame header at frame[0, kFrameHeaderBytes) for the `payload_bytes` that follow it;
// `offset` is the frame's byte offset in the file.
void seal_frame(unsigned char* frame, uint64_t payload_bytes, uint64_t offset);

enum class FrameStatus {
  kEnd,      // no bytes left
  kTorn,     // the file ends inside the frame, and every byte present checks out
  kCorrupt,  // a byte present does not check out
  kWhole,
};

struct Frame {
  FrameStatus status = FrameStatus::kEnd;
  uint64_t payload_bytes = 0;  // kWhole, kTorn (when the header is whole)
  std::string problem;         // kCorrupt: which check failed
};

// The frame at `offset` of a file of `size` bytes. `payload_bytes_max` bounds a message.
// `verify` false skips both checks (the fuzzer's mode: it cannot forge a checksum, and the
// decoder behind the framing must still survive any bytes).
Frame read_frame(const unsigned char* data, uint64_t size, uint64_t offset,
                 uint64_t payload_bytes_max, bool verify = true);

}  // namespace ls::trace::framing
