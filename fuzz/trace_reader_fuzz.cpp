// libFuzzer target for the trace reader (STYLE.md §18): any byte string must give either records
// or an ls::Error — never a crash, a hang, an abort or unbounded memory.
// Build: cmake -S . -B build-fuzz -G Ninja -DCMAKE_CXX_COMPILER=clang++ -DCMAKE_C_COMPILER=clang \
//          -DLOCKSTEP_FUZZ=ON -DLOCKSTEP_CUDA=OFF -DLOCKSTEP_WERROR=OFF && ninja -C build-fuzz lockstep_fuzz_trace_reader
// Run:   build-fuzz/fuzz/lockstep_fuzz_trace_reader -max_total_time=600 fuzz/corpus/trace_reader
#include "core/check.h"
#include "trace/reader.h"

#include <cstddef>
#include <cstdint>
#include <span>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  try {
    ls::trace::TraceReader reader = ls::trace::TraceReader::from_bytes(
        std::as_bytes(std::span<const uint8_t>(data, size)), {}, "fuzz");
    ls::trace::TraceRecord record;
    while (reader.next(record)) {
    }
    if (auto cut = reader.truncation()) (void)cut->describe();
  } catch (const ls::Error&) {
    // A clear error is the expected outcome for most inputs.
  }
  return 0;
}
