// The chunked scan inside the CUDA backend (kernels/mamba_scan.h, issue 19), on a random Bamba
// checkpoint (tests/hybrid_checkpoint.h): two requests' prompts of 200 tokens prefilled in three
// forward ops cut two ways, then decoded together. Request X starts with 40 tokens (off the
// 64-position block grid) in both, then is cut at 128 or at 192; its companion Y is cut to keep
// every op's token count the same in both scripts (so every matrix product runs the same plan:
// kernels/gemm_plans.h pins an algorithm per token count). Every cut after X's first lands on the
// grid, so the mixer gives the same bits both ways — if and only if the backend hands it each
// token's absolute position: with positions counted from each chunk's first token, X's chunk
// from 40 would put its blocks at 40, 104, ... in one script and not the other. Compared in bits:
// the prompts' last logits rows, three decode steps' logits and both working states, fp32 and
// bf16, with decode graphs.
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
using gpu_test::same_bits;

constexpr int32_t kPrompt = 200;
constexpr int32_t kDecodeSteps = 3;

// A request's fixed placement.
struct Request {
  RequestId id;
  int32_t pool_row, slot, first_page;
};
constexpr Request kX{9, 1, 2, 10};
constexpr Request kY{11, 2, 3, 40};

// One row of a prefill op: `count` prompt tokens of `request` from `begin`.
struct Piece {
  Request request;
  int32_t begin, count;
};

const ModelWeights& hybrid() { return testing::hybrid_checkpoint_weights(); }

ExecutorConfig chunk_config() {
  ExecutorConfig c = testing::small_config();
  c.context_length = 256;
  c.page_size = 16;
  c.prefill_chunk_tokens = 2 * kPrompt;
  c.mamba_slots_count = 4;
  return c;
}

OpRow prefill(const Piece& p) {
  OpRow row = testing::prefill_row(p.request.id, p.request.pool_row, p.begin, p.count, kPrompt);
  row.mamba_working = p.request.slot;
  row.refresh = {0, testing::pages_from(p.request.first_page, (kPrompt + kDecodeSteps + 15) / 16)};
  if (p.begin == 0) row.sampling = SamplingParams{};  // a request new to its pool row names them
  return row;
}

// The prefill ops (rows in the pieces' order), then kDecodeSteps decode ops of X and Y.
std::vector<ForwardOp> script(const std::vector<std::vector<Piece>>& prefill_ops) {
  std::vector<ForwardOp> ops;
  for (const std::vector<Piece>& pieces : prefill_ops) {
    ForwardOp op;
    for (const Piece& p : pieces) {
      op.rows.push_back(prefill(p));
      const std::vector<int32_t> prompt = testing::prompt_for(p.request.id, kPrompt);
      op.prefill_token_ids.insert(op.prefill_token_ids.end(), prompt.begin() + p.begin,
                                  prompt.begin() + p.begin + p.count);
    }
    ops.push_back(op);
  }
  ForwardOp decode;
  for (const Request& r : {kX, kY}) {
    decode.rows.push_back(testing::decode_row(r.id, r.pool_row));
    decode.rows.back().mamba_working = r.slot;
  }
  for (int32_t s = 0; s < kDecodeSteps; ++s) ops.push_back(decode);
  return ops;
}

// X cut at 40 and 128, Y at 64 and 128: ops of 104, 152 and 144 tokens.
std::vector<ForwardOp> cut_at_128() {
  return script({{{kX, 0, 40}, {kY, 0, 64}},
                 {{kX, 40, 88}, {kY, 64, 64}},
                 {{kX, 128, 72}, {kY, 128, 72}}});
}

// X cut at 40 and 192, Y at 64 only (absent from the second op): the same token counts.
std::vector<ForwardOp> cut_at_192() {
  return script({{{kX, 0, 40}, {kY, 0, 64}}, {{kX, 40, 152}}, {{kX, 192, 8}, {kY, 64, 136}}});
}

// The last prefill op's logits and each decode op's, then X's and Y's working states.
std::vector<std::vector<float>> run(const std::vector<ForwardOp>& ops, CudaPrecision precision) {
  const ExecutorConfig c = chunk_config();
  CudaBackend cuda(hybrid(), c, CudaBackendOptions{.precision = precision, .graphs = true});
  Executor executor(c, hybrid().config.vocab_size, cuda,
                    ExecutorOptions{.capture_logits = true});
  std::vector<std::vector<float>> out;
  for (size_t i = 0; i < ops.size(); ++i) {
    const StepResult r = executor.step(ops[i]);
    if (i + kDecodeSteps + 1 >= ops.size()) out.push_back(r.logits);
  }
  out.push_back(cuda.read_mamba_state(kX.slot));
  out.push_back(cuda.read_mamba_state(kY.slot));
  return out;
}

TEST(HybridChunkedPrefill, CutsOnTheBlockGridGiveTheSameBits) {
  LS_SKIP_WITHOUT_DEVICE();
  for (const CudaPrecision precision : {CudaPrecision::kFp32, CudaPrecision::kBf16}) {
    SCOPED_TRACE(to_string(precision));
    const auto a = run(cut_at_128(), precision);
    const auto b = run(cut_at_192(), precision);
    ASSERT_EQ(a.size(), size_t{kDecodeSteps} + 3);
    ASSERT_EQ(b.size(), a.size());
    ASSERT_EQ(a[0].size(), 2 * static_cast<size_t>(hybrid().config.vocab_size));
    ASSERT_GT(gpu_test::norm(a.back()), 0.0);
    for (size_t i = 0; i < a.size(); ++i) EXPECT_TRUE(same_bits(a[i], b[i])) << "entry " << i;
    // X and Y differ (the comparison can tell the rows apart).
    EXPECT_FALSE(same_bits(a[a.size() - 2], a[a.size() - 1]));
  }
}

}  // namespace
}  // namespace ls
