// The trace reader (DESIGN.md "Trace"): treats every file as untrusted. The file is memory-mapped
// and read one message at a time, each with its own Cap'n Proto reader and traversal limit; every
// record is decoded into the plain types of trace/records.h and checked against the header's
// limits and the ordering rules (trace/checks.h) before it is returned. Memory does not grow with
// the trace's length: records are decoded into the caller's storage and mapped pages behind the
// cursor are released as it advances.
//
//   auto reader = trace::TraceReader::open("run.trace");   // reads and checks the header
//   trace::TraceRecord record;
//   while (reader.next(record)) {
//     if (auto* in = std::get_if<trace::StepInputRecord>(&record)) { ... }
//   }
//   if (auto cut = reader.truncation()) std::puts(cut->describe().c_str());
//
// Errors (bad magic, an old format version, an index out of range, broken ordering) are
// ls::Error whose message names the file, the record number, its byte offset, the step and the
// field; a checksum that does not match before the end of the file is a TraceCorruption, whose
// message also says how many later records are intact. A cut-off tail is not an error: next()
// returns false and truncation() says where the trace ends, and that the footer is missing.
#pragma once

#include "trace/records.h"

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <span>
#include <string>

namespace ls::trace {

struct TraceReaderOptions {
  // Run ls::validate_forward_op on every step input (the index checks always run).
  bool validate_ops = true;
  // Mapped pages behind the cursor are dropped (madvise) every this many bytes.
  uint64_t release_window_bytes = uint64_t{16} << 20;
  // Check the preamble's, every frame header's and every message's checksum. Only the fuzzer
  // turns this off (it cannot forge a checksum, and the decoder behind must survive any bytes).
  bool verify_checksums = true;
};

// A byte of the file that does not check out, or a record whose framing is broken, before the
// end of the file: the file is damaged inside (not a cut-off tail). Replay and check exit 2.
class TraceCorruption : public Error {
 public:
  using Error::Error;
};

// Where and how a trace without its footer ends (a killed process, or a writer without footer):
// every whole record before complete_bytes checked out, and is usable.
struct TraceTruncation {
  int64_t complete_steps = 0;        // steps whose output (or rejection) was read
  std::optional<int64_t> open_step;  // the first step whose input was read but not its output
  uint64_t complete_bytes = 0;       // bytes of the preamble and whole records
  uint64_t trailing_bytes = 0;       // bytes of the partial record after them, dropped
  int64_t complete_records = 0;      // header included
  bool footer_missing = true;        // always: a trace with its footer is not truncated
  // "the trace ends at byte 4096 without its footer (...) after 57 complete records; 27
  // complete steps; step 28 has no output; 312 bytes of a partial record dropped"
  std::string describe() const;
};

class TraceReader {
 public:
  static TraceReader open(const std::filesystem::path& path, TraceReaderOptions options = {});
  // Reads a copy of `bytes` (for the fuzzer and tests); `name` labels error messages.
  static TraceReader from_bytes(std::span<const std::byte> bytes, TraceReaderOptions options = {},
                                std::string name = "<bytes>");
  ~TraceReader();
  TraceReader(TraceReader&&) noexcept;
  TraceReader& operator=(TraceReader&&) noexcept;

  const TraceHeader& header() const;

  // The next record after the header; false at the end of the complete prefix (then see
  // truncation() and footer()). Decodes into `out`, reusing its vectors when it already holds the
  // same kind of record. Throws ls::Error on a bad record; the reader is unusable afterwards.
  bool next(TraceRecord& out);
  std::optional<TraceRecord> next();

  int64_t records_read() const;       // messages read so far, header included
  uint64_t offset() const;            // byte offset of the next message
  uint64_t file_bytes() const;
  int64_t complete_steps() const;     // so far
  int64_t step_inputs_read() const;
  int64_t step_outputs_read() const;
  int64_t events_read() const;
  int64_t unknown_records_skipped() const;  // record kinds from a newer writer
  bool at_end() const;                // next() has returned false
  // Set once at_end() when the file ends inside a step or inside a record.
  std::optional<TraceTruncation> truncation() const;
  // The footer, once read (a trace closed cleanly ends with one).
  const std::optional<TraceFooter>& footer() const;

 private:
  struct Impl;
  explicit TraceReader(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// Reads and checks a whole trace without keeping its records: what `trace inspect` summarises.
struct TraceSummary {
  TraceHeader header;
  int64_t records_count = 0;
  int64_t step_inputs_count = 0;
  int64_t step_outputs_count = 0;
  int64_t events_count = 0;
  int64_t complete_steps = 0;
  bool has_footer = false;
  std::optional<TraceTruncation> truncation;
};
TraceSummary verify_trace(const std::filesystem::path& path, TraceReaderOptions options = {});

}  // namespace ls::trace
