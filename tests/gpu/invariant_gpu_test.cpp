// Batch-invariant mode on CUDA (issue 15, `--determinism invariant`): a recorded run of many
// requests of mixed lengths, chunked prefill and retraction under page pressure, replayed one
// request at a time (`replay --isolate`, exact) on the GPU — every compared output of the request
// (tokens, logits digests, the top-8 logits, the row's state) bit for bit. And the refusals: a
// default-mode CUDA trace cannot be isolated, and what the mode cannot cover is named.
#include "core/check.h"
#include "kernels/cuda_backend.h"
#include "tests/gpu/backend_test_support.h"
#include "tests/gpu/cli_support.h"
#include "tests/gpu/gpu_test_support.h"
#include "tests/test_support.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <vector>

namespace ls {
namespace {

namespace fs = std::filesystem;

using gpu_test::cli_bin_dir;

// The command's exit status, its output kept in `log`.
int run(const std::string& command, const fs::path& log) {
  const int status = std::system((command + " > " + log.string() + " 2>&1").c_str());
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

std::string text_of(const fs::path& file) {
  std::ifstream in(file);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

class CudaBatchInvariant : public ::testing::Test {
 protected:
  void SetUp() override {
    LS_SKIP_WITHOUT_DEVICE();
    lockstep = (cli_bin_dir() / "lockstep").string();
    ASSERT_TRUE(fs::exists(lockstep)) << "lockstep must be in " << cli_bin_dir() << " (LOCKSTEP_BIN_DIR)";
    dir = fs::temp_directory_path() / "lockstep_invariant_gpu";
    fs::create_directories(dir);
    log = dir / "log.txt";
  }

  // `count` prompts of 1..160 tokens asking 1..48 new ones, greedy and seeded sampling mixed.
  std::string write_prompts(int32_t count) {
    const fs::path path = dir / "prompts.jsonl";
    std::ofstream out(path);
    std::mt19937 gen(15);
    for (int32_t i = 1; i <= count; ++i) {
      out << "{\"id\": " << i << ", \"prompt\": [";
      const int32_t length = 1 + static_cast<int32_t>(gen() % 160);
      for (int32_t t = 0; t < length; ++t) out << (t ? ", " : "") << gen() % 512;
      out << "], \"max_new_tokens\": " << 1 + gen() % 48;
      if (i % 2 == 0) out << ", \"temperature\": 0.8, \"top_k\": 40, \"seed\": " << i;
      out << "}\n";
    }
    return path.string();
  }

  std::string lockstep;
  fs::path dir, log;
};

TEST_F(CudaBatchInvariant, AThousandRequestsRecordedTogetherReplayAloneBitForBit) {
  const std::string prompts = write_prompts(1000);
  const std::string trace = (dir / "invariant.trace").string();
  fs::remove(trace);
  // Batch 64, 96-token prefill chunks, 48 pages of 16 for 64 rows of up to 208 tokens: the
  // scheduler retracts under page pressure.
  ASSERT_EQ(run(lockstep + " generate --backend cuda --determinism invariant --prompts " + prompts +
                    " --max-batch-rows 64 --prefill-chunk-tokens 96 --context-length 256 --pages 48"
                    " --record " + trace + " -q",
                log), 0) << text_of(log);
  ASSERT_EQ(run(lockstep + " trace inspect " + trace, log), 0) << text_of(log);
  const std::string inspected = text_of(log);
  EXPECT_THAT(inspected, ::testing::HasSubstr("batch-invariant"));
  EXPECT_THAT(inspected, ::testing::HasSubstr("retract")) << "no retraction: no page pressure";
  ASSERT_EQ(run(lockstep + " replay " + trace + " --backend cuda -q", log), 0) << text_of(log);
  std::mt19937 gen(20);
  for (int32_t k = 0; k < 20; ++k) {
    const int32_t request = 1 + static_cast<int32_t>(gen() % 1000);
    ASSERT_EQ(run(lockstep + " replay " + trace + " --backend cuda -q --isolate " +
                      std::to_string(request), log), 0)
        << "request " << request << ":\n" << text_of(log);
    EXPECT_THAT(text_of(log), ::testing::HasSubstr("IDENTICAL")) << "request " << request;
  }
}

// The same 300 requests served at batch 64 with 96-token prefill chunks, at batch 5 with 13-token
// chunks, and at batch 64 with 512-token chunks and no page pressure: every request's tokens
// (greedy and sampled) are the same — co-batch, chunking, pool row and retraction change nothing.
TEST_F(CudaBatchInvariant, BatchSizeChunkingAndPagePressureLeaveEveryRequestsTokens) {
  const std::string prompts = write_prompts(300);
  const std::vector<std::string> shapes = {
      "--max-batch-rows 64 --prefill-chunk-tokens 96 --pages 48",
      "--max-batch-rows 5 --prefill-chunk-tokens 13 --pages 80",
      "--max-batch-rows 64 --prefill-chunk-tokens 512 --pages 0"};
  std::vector<std::string> outputs;
  for (size_t i = 0; i < shapes.size(); ++i) {
    const fs::path out = dir / ("outputs-" + std::to_string(i) + ".jsonl");
    ASSERT_EQ(run(lockstep + " generate --backend cuda --determinism invariant --context-length 256 " +
                      shapes[i] + " --prompts " + prompts + " -o " + out.string() + " -q", log), 0)
        << shapes[i] << ":\n" << text_of(log);
    outputs.push_back(text_of(out));
    ASSERT_FALSE(outputs.back().empty()) << shapes[i];
    EXPECT_EQ(outputs.back(), outputs.front()) << shapes[i] << " against " << shapes[0];
  }
}

TEST_F(CudaBatchInvariant, ADefaultModeTraceIsNotIsolatedAndTheModeRefusesWhatItCannotCover) {
  const std::string prompts = write_prompts(8);
  const std::string trace = (dir / "default.trace").string();
  fs::remove(trace);
  ASSERT_EQ(run(lockstep + " generate --backend cuda --prompts " + prompts + " --record " + trace +
                    " -q", log), 0) << text_of(log);
  EXPECT_EQ(run(lockstep + " replay " + trace + " --backend cuda --isolate 3 -q", log), 2);
  EXPECT_THAT(text_of(log), ::testing::HasSubstr("determinism mode 'default'"));
  EXPECT_EQ(run(lockstep + " generate --backend cuda --determinism invariant --prompts " + prompts +
                    " --verify-width 4 --drafter ngram -q", log), 2);
  EXPECT_THAT(text_of(log), ::testing::HasSubstr("batch_invariant"));
  const ExecutorConfig ec = executor_config_for(gpu_test::tiny_scheduler());
  const auto build = [&](const CudaBackendOptions& o) { CudaBackend b(testing::tiny_weights(), ec, o); };
  using ::testing::HasSubstr;
  using ::testing::ThrowsMessage;
  EXPECT_THAT([&] { build({.gemv_tokens_max = 1, .small_m_gemm_tokens_max = 64, .batch_invariant = true}); },
              ThrowsMessage<Error>(HasSubstr("needs gemv_tokens_max 0, not 1")));
  EXPECT_THAT([&] { build(batch_invariant_options({.precision = CudaPrecision::kFp32})); },
              ThrowsMessage<Error>(HasSubstr("runs bf16 only")));
  CudaBackendOptions tiles = batch_invariant_options({});
  tiles.prefill_attention_by_decode_kernel = false;
  EXPECT_THAT([&] { build(tiles); },
              ThrowsMessage<Error>(HasSubstr("needs prefill_attention_by_decode_kernel")));
  build(batch_invariant_options({}));
}

}  // namespace
}  // namespace ls
