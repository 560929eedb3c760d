// libFuzzer target for the trace reader (STYLE.md §18): any byte string must give either records
// or an ls::Error — never a crash, a hang, an abort or unbounded memory. Each input is read twice:
// with the checksums verified (the framing's own checks: a mutation almost never passes them),
// and with them off, so that the decoder and the record checks behind the framing see mutated
// messages too (a fuzzer cannot forge an XXH3 checksum). The corpus is format version 5, made
// by fuzz/make_corpus.sh with lockstep itself (it says which runs and cuts); rerun it when the
// format changes. The format-3 traces this build still reads are tests/fixtures/trace/*.trace,
// a second corpus directory in the run below (libFuzzer adds what it finds to the first only).
// Build: cmake -S . -B build-fuzz -G Ninja -DCMAKE_CXX_COMPILER=clang++ -DCMAKE_C_COMPILER=clang \
//          -DLOCKSTEP_FUZZ=ON -DLOCKSTEP_CUDA=OFF -DLOCKSTEP_WERROR=OFF && ninja -C build-fuzz lockstep_fuzz_trace_reader
// Run:   build-fuzz/fuzz/lockstep_fuzz_trace_reader -max_total_time=600 fuzz/corpus/trace_reader \
//          tests/fixtures/trace
#include "core/check.h"
#include "trace/reader.h"

#include <cstddef>
#include <cstdint>
#include <span>

namespace {

void read_all(const uint8_t* data, size_t size, bool verify_checksums) {
  try {
    ls::trace::TraceReaderOptions options;
    options.verify_checksums = verify_checksums;
    ls::trace::TraceReader reader = ls::trace::TraceReader::from_bytes(
        std::as_bytes(std::span<const uint8_t>(data, size)), options, "fuzz");
    ls::trace::TraceRecord record;
    while (reader.next(record)) {
    }
    if (auto cut = reader.truncation()) (void)cut->describe();
  } catch (const ls::Error&) {
    // A clear error is the expected outcome for most inputs.
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  read_all(data, size, true);
  read_all(data, size, false);
  return 0;
}
