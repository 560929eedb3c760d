// Shared builders for the trace tests: temp files, a header for the test harness, hand-made
// records, and a small recorded workload on the real executor.
#pragma once

#include "core/check.h"
#include "tests/test_support.h"
#include "trace/reader.h"
#include "trace/framing.h"
#include "trace/recorder.h"

#include <capnp/message.h>
#include <capnp/serialize.h>

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

namespace ls::trace::testing {

// A fresh file path under the temp dir, removed by the destructor.
class TempPath {
 public:
  explicit TempPath(const std::string& name)
      : path_(std::filesystem::temp_directory_path() /
              fmt::format("lockstep_trace_test_{}_{}", ::getpid(), name)) {
    std::filesystem::remove(path_);
  }
  ~TempPath() { std::filesystem::remove(path_); }
  TempPath(const TempPath&) = delete;
  TempPath& operator=(const TempPath&) = delete;
  const std::filesystem::path& path() const { return path_; }

 private:
  std::filesystem::path path_;
};

inline std::vector<std::byte> read_bytes(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::vector<char> chars((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::vector<std::byte> bytes(chars.size());
  std::memcpy(bytes.data(), chars.data(), chars.size());
  return bytes;
}

inline void write_bytes(const std::filesystem::path& path, std::span<const std::byte> bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
}

// Appends one record as the format frames it (trace/framing.h): a sealed frame header at the
// file's current end, then the message. Tests build records the recorder would refuse with it.
inline void append_framed(std::vector<std::byte>& bytes, capnp::MessageBuilder& message) {
  if (bytes.empty()) {  // a new file: the preamble first
    bytes.resize(framing::kPreambleBytes);
    framing::write_preamble(reinterpret_cast<unsigned char*>(bytes.data()), kFormatVersion);
  }
  const kj::Array<capnp::word> words = capnp::messageToFlatArray(message);
  const size_t at = bytes.size();
  bytes.resize(at + framing::kFrameHeaderBytes + words.size() * 8);
  std::memcpy(bytes.data() + at + framing::kFrameHeaderBytes, words.begin(), words.size() * 8);
  framing::seal_frame(reinterpret_cast<unsigned char*>(bytes.data() + at), words.size() * 8, at);
}

inline TraceHeader header_for(const ExecutorConfig& config, ExecutorOptions options = {}) {
  TraceHeader h;
  h.build_id = "lockstep-test 0.1.0";
  h.model = ls::testing::tiny_weights().config;
  h.weights = WeightSource{.kind = WeightSource::Kind::kSeed, .seed = 7};
  h.weights_digest = ls::testing::tiny_weights().digest();
  h.executor = config;
  h.executor_options = options;
  h.top_logits_count = 8;
  h.backend = "cpu";
  h.determinism_mode = "batch-invariant";
  h.machine = MachineInfo{.cpu_name = "test cpu", .gpu_name = "", .sm_count = 0};
  h.index_stride = 2;
  return h;
}

// The pages pool row r owns for its whole context: a fixed, disjoint range per row.
inline std::vector<int32_t> pages_of_pool_row(const ExecutorConfig& c, int32_t pool_row) {
  const int32_t width = c.table_width();
  return ls::testing::pages_from(1 + (pool_row - 1) * width, width);
}

// What a recorded run fed to and got from the executor, kept by the test as the expectation.
struct RecordedRun {
  std::vector<StepInputRecord> inputs;
  std::vector<StepResult> results;       // logits cleared
  std::vector<StateSnapshot> snapshots;  // of the op rows, after the step
  std::vector<TraceEvent> events;
};

// Runs `requests_count` requests (prompts of 3..12 tokens, chunked by 8, 2..6 generated tokens,
// a mix of greedy and seeded sampling, pool rows reused) through the real executor and records
// every step. Returns what was recorded, in order.
RecordedRun record_workload(const std::filesystem::path& path, int32_t requests_count,
                            RecorderOptions options = {}, ExecutorConfig config = ls::testing::small_config());

}  // namespace ls::trace::testing
