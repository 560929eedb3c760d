// libFuzzer target for the model files a checkpoint directory holds (STYLE.md §18): they are
// untrusted, so any byte string read as a safetensors file, or as a config.json, must give tensors
// or a model config — or an ls::Error naming what is wrong — never a crash, a sanitizer report,
// unbounded memory or another exception (a library's own exception escaping is not a clear
// error). The first byte picks the reader: even, the rest is a safetensors file (every tensor it
// lists is read at its own shape); odd, the rest is config.json (parsed, then validated). The
// corpus, fuzz/corpus/model_files, is made by fuzz/make_model_corpus.sh: small safetensors files
// of each dtype and the config.json of every tests/fixtures/hf family.
// Build: as fuzz/trace_reader_fuzz.cpp, target lockstep_fuzz_model_files.
// Run:   build-fuzz/fuzz/lockstep_fuzz_model_files -max_total_time=600 fuzz/corpus/model_files
#include "core/check.h"
#include "core/model/safetensors.h"
#include "core/model/weights.h"

#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>
#include <string_view>

namespace {

// SafetensorsFile maps a file: the input is written to one in memory-backed /dev/shm, per process.
const std::filesystem::path& scratch_path() {
  static const std::filesystem::path path =
      std::filesystem::path("/dev/shm") / ("lockstep_fuzz_model_" + std::to_string(getpid()));
  return path;
}

void read_safetensors(std::string_view bytes) {
  {
    std::ofstream out(scratch_path(), std::ios::binary | std::ios::trunc);
    out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  }
  try {
    const ls::SafetensorsFile file = ls::SafetensorsFile::open(scratch_path());
    for (const ls::TensorInfo& tensor : file.tensors()) {
      (void)file.read_f32(tensor.name, tensor.shape);
    }
  } catch (const ls::Error&) {
    // A clear error is the expected outcome for most inputs.
  }
}

void read_config(std::string_view text) {
  try {
    ls::model_config_from_hf_json(std::string(text), "fuzz").validate();
  } catch (const ls::Error&) {
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const std::string_view rest(reinterpret_cast<const char*>(data) + 1, size - 1);
  if (data[0] % 2 == 0) {
    read_safetensors(rest);
  } else {
    read_config(rest);
  }
  return 0;
}
