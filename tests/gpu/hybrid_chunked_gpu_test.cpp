// The chunked scan inside the CUDA backend (kernels/mamba_scan.h, issue 19): a hybrid prompt of
// 200 tokens (a random Bamba checkpoint, tests/hybrid_checkpoint.h) prefilled in one forward op
// and cut into prefill chunks that end on the 64-position block grid gives the same bits — the
// prompt's last logits row, three decode steps' logits after it and the working state — in fp32
// and bf16, with decode graphs. That holds only if the backend hands the mixer each token's
// absolute position (a row's blocks placed by its own first token would move with the cut). A
// cut off the grid is compared within the fp32 reordering bound instead.
#include "core/executor.h"
#include "kernels/cuda_backend.h"
#include "tests/gpu/gpu_test_support.h"
#include "tests/hybrid_checkpoint.h"
#include "tests/test_support.h"

#include <gtest/gtest.h>

#include <unistd.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <vector>

namespace ls {
namespace {

namespace fs = std::filesystem;

constexpr RequestId kRequest = 9;
constexpr int32_t kPrompt = 200;
constexpr int32_t kDecodeSteps = 3;
constexpr int32_t kSlot = 2;

const ModelWeights& hybrid() {
  static const ModelWeights weights = [] {
    const fs::path dir =
        fs::temp_directory_path() / fmt::format("lockstep_{}_gpu_hybrid_chunked", ::getpid());
    fs::create_directories(dir);
    testing::write_hybrid_checkpoint(dir);
    ModelWeights loaded = load_hf_directory(dir);
    fs::remove_all(dir);
    return loaded;
  }();
  return weights;
}

ExecutorConfig chunk_config() {
  ExecutorConfig c = testing::small_config();
  c.context_length = 256;
  c.page_size = 16;
  c.prefill_chunk_tokens = kPrompt;
  c.mamba_slots_count = 4;
  return c;
}

// The prompt in forward ops of `cuts` tokens (request kRequest on pool row 1, slot kSlot, greedy
// on the last), then kDecodeSteps decode ops.
std::vector<ForwardOp> script(const std::vector<int32_t>& cuts) {
  const std::vector<int32_t> prompt = testing::prompt_for(kRequest, kPrompt);
  std::vector<ForwardOp> ops;
  int32_t begin = 0;
  for (const int32_t count : cuts) {
    ForwardOp op;
    op.rows.push_back(testing::prefill_row(kRequest, 1, begin, count, kPrompt));
    op.rows[0].mamba_working = kSlot;
    op.rows[0].refresh = {0, testing::pages_from(10, (kPrompt + kDecodeSteps + 15) / 16)};
    if (begin + count == kPrompt) op.rows[0].sampling = SamplingParams{};
    op.prefill_token_ids.assign(prompt.begin() + begin, prompt.begin() + begin + count);
    ops.push_back(op);
    begin += count;
  }
  ForwardOp decode;
  decode.rows.push_back(testing::decode_row(kRequest, 1));
  decode.rows[0].mamba_working = kSlot;
  for (int32_t s = 0; s < kDecodeSteps; ++s) ops.push_back(decode);
  return ops;
}

// The logits of the prompt's last op and of each decode op, then the working state.
std::vector<std::vector<float>> run(const std::vector<int32_t>& cuts, CudaPrecision precision) {
  const ExecutorConfig c = chunk_config();
  CudaBackend cuda(hybrid(), c, CudaBackendOptions{.precision = precision, .graphs = true});
  Executor executor(c, hybrid().config.vocab_size, cuda,
                    ExecutorOptions{.capture_logits = true});
  std::vector<std::vector<float>> out;
  const std::vector<ForwardOp> ops = script(cuts);
  for (size_t i = 0; i < ops.size(); ++i) {
    const StepResult r = executor.step(ops[i]);
    if (i + 1 >= cuts.size()) out.push_back(r.logits);
  }
  out.push_back(cuda.read_mamba_state(kSlot));
  return out;
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

TEST(HybridChunkedPrefill, CutsOnTheBlockGridGiveTheSameBits) {
  LS_SKIP_WITHOUT_DEVICE();
  for (const CudaPrecision precision : {CudaPrecision::kFp32, CudaPrecision::kBf16}) {
    SCOPED_TRACE(to_string(precision));
    const auto whole = run({kPrompt}, precision);
    ASSERT_EQ(whole.size(), size_t{kDecodeSteps} + 2);
    ASSERT_FALSE(whole[0].empty());
    ASSERT_GT(gpu_test::norm(whole.back()), 0.0);
    for (const std::vector<int32_t>& cuts :
         {std::vector<int32_t>{64, 136}, std::vector<int32_t>{128, 64, 8}}) {
      const auto cut = run(cuts, precision);
      ASSERT_EQ(cut.size(), whole.size());
      for (size_t i = 0; i < whole.size(); ++i) {
        EXPECT_TRUE(same_bits(cut[i], whole[i])) << "first cut " << cuts[0] << ", entry " << i;
      }
    }
  }
}

// Off the grid (100 + 100: the block [64, 128) runs sequentially in two pieces): fp32 within the
// chunked scan's bound (tests/gpu/mamba_scan_gpu_test.cpp), carried through four layers.
TEST(HybridChunkedPrefill, ACutOffTheGridAgreesToFp32Rounding) {
  LS_SKIP_WITHOUT_DEVICE();
  const auto whole = run({kPrompt}, CudaPrecision::kFp32);
  const auto cut = run({100, 100}, CudaPrecision::kFp32);
  ASSERT_EQ(cut.size(), whole.size());
  for (size_t i = 0; i < whole.size(); ++i) {
    EXPECT_LE(gpu_test::relative_error(cut[i], whole[i]), 1e-3) << "entry " << i;
  }
}

}  // namespace
}  // namespace ls
