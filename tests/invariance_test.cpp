// The CPU reference's batch invariance, compared bit for bit: a request's logits do not depend on
// how its prompt was chunked, on what else is in the batch, or on its pool row — for `tiny`, whose
// products take a token at a time, and for a model wide enough that they take tiles of tokens
// (testing::tiled_weights), where a chunk's tokens share tiles with each other and other rows'.
#include "core/executor.h"
#include "tests/test_support.h"

#include <gtest/gtest.h>

#include <cstring>

namespace ls {
namespace {

using testing::decode_row;
using testing::Harness;
using testing::pages_from;
using testing::prefill_row;
using testing::prompt_for;

constexpr int32_t kPromptTokens = 40;
constexpr int32_t kDecodeSteps = 8;
constexpr RequestId kSubject = 42;
constexpr size_t kVocab = 512;

// The subject's logits rows, one per step: the final prefill chunk, then each decode step.
using LogitsTrace = std::vector<std::vector<float>>;

std::vector<float> row_logits(const StepResult& r, int32_t logits_row) {
  const auto begin = r.logits.begin() + static_cast<ptrdiff_t>(logits_row * kVocab);
  return {begin, begin + static_cast<ptrdiff_t>(kVocab)};
}

bool bit_identical(const LogitsTrace& a, const LogitsTrace& b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i) {
    if (a[i].size() != b[i].size()) return false;
    if (std::memcmp(a[i].data(), b[i].data(), a[i].size() * sizeof(float)) != 0) return false;
  }
  return true;
}

bool non_degenerate(const LogitsTrace& t) {
  double norm = 0;
  for (const auto& row : t) for (float x : row) norm += double{x} * x;
  return t.size() == kDecodeSteps + 1 && norm > 0;
}

const ModelWeights& weights_named(const std::string& name) {
  return name == "tiled" ? testing::tiled_weights() : testing::tiny_weights();
}

class ChunkInvariance : public ::testing::TestWithParam<std::string> {};
class PoolRowInvariance : public ::testing::TestWithParam<std::string> {};
class BatchInvariance : public ::testing::TestWithParam<std::string> {};

// Prefills the subject (a prompt of `prompt_tokens`) in chunks of the given sizes on `pool_row`,
// then decodes it greedily.
LogitsTrace run_chunked(const std::vector<int32_t>& chunks, int32_t pool_row,
                        const ModelWeights& weights, int32_t prompt_tokens = kPromptTokens,
                        const ExecutorConfig& config = testing::small_config()) {
  Harness h(config, nullptr, {.capture_logits = true}, weights);
  const std::vector<int32_t> prompt = prompt_for(kSubject, prompt_tokens);
  const int32_t pages = (prompt_tokens + kDecodeSteps + config.page_size - 1) / config.page_size;
  LogitsTrace trace;
  int32_t prefix = 0;
  for (int32_t chunk : chunks) {
    ForwardOp op;
    op.rows.push_back(prefill_row(kSubject, pool_row, prefix, chunk, prompt_tokens));
    if (prefix == 0) {
      op.rows[0].refresh = {0, pages_from(20, pages)};
      op.rows[0].sampling = SamplingParams{};
    }
    op.prefill_token_ids.assign(prompt.begin() + prefix, prompt.begin() + prefix + chunk);
    const StepResult r = h.executor.step(op);
    prefix += chunk;
    if (prefix == prompt_tokens) trace.push_back(row_logits(r, 0));
  }
  ForwardOp decode;
  decode.rows.push_back(decode_row(kSubject, pool_row));
  for (int32_t s = 0; s < kDecodeSteps; ++s) trace.push_back(row_logits(h.executor.step(decode), 0));
  return trace;
}

TEST_P(ChunkInvariance, OneTwoAndFiveChunksGiveBitIdenticalLogits) {
  const ModelWeights& w = weights_named(GetParam());
  const LogitsTrace one = run_chunked({40}, 1, w);
  ASSERT_TRUE(non_degenerate(one));
  EXPECT_TRUE(bit_identical(one, run_chunked({20, 20}, 1, w)));
  EXPECT_TRUE(bit_identical(one, run_chunked({8, 8, 8, 8, 8}, 1, w)));
  EXPECT_TRUE(bit_identical(one, run_chunked({1, 13, 26}, 1, w)));
  EXPECT_TRUE(bit_identical(one, run_chunked(std::vector<int32_t>(40, 1), 1, w)));  // singly
}

TEST_P(PoolRowInvariance, TheSameRequestOnAnotherPoolRowGivesBitIdenticalLogits) {
  const ModelWeights& w = weights_named(GetParam());
  EXPECT_TRUE(bit_identical(run_chunked({40}, 1, w), run_chunked({40}, 7, w)));
}

// The subject in a batch with seven other requests of different lengths, sharing every step:
// their prefill rows in the same EXTEND op, their decode rows in the same DECODE ops.
LogitsTrace run_crowded(const ModelWeights& weights) {
  ExecutorConfig config = testing::small_config();
  config.prefill_chunk_tokens = 128;  // all eight prompts in one op (also a different buffer size)
  Harness h(config, nullptr, {.capture_logits = true}, weights);
  ForwardOp prefill;
  ForwardOp decode;
  int32_t subject_row = 0;
  for (int32_t i = 0; i < 8; ++i) {
    const RequestId id = i == 3 ? kSubject : 100 + static_cast<RequestId>(i);
    const int32_t length = i == 3 ? kPromptTokens : 3 + 2 * i;
    OpRow row = prefill_row(id, 8 - i, 0, length, length);
    row.refresh = {0, pages_from(1 + 14 * i, 14)};
    row.sampling = SamplingParams{.temperature = i == 3 ? 0.0f : 0.9f};
    const std::vector<int32_t> prompt = prompt_for(id, length);
    prefill.prefill_token_ids.insert(prefill.prefill_token_ids.end(), prompt.begin(), prompt.end());
    prefill.rows.push_back(row);
    decode.rows.push_back(decode_row(id, 8 - i));
    if (i == 3) subject_row = i;
  }
  LogitsTrace trace;
  trace.push_back(row_logits(h.executor.step(prefill), subject_row));
  for (int32_t s = 0; s < kDecodeSteps; ++s) {
    trace.push_back(row_logits(h.executor.step(decode), subject_row));
  }
  return trace;
}

TEST_P(BatchInvariance, AloneAndWithSevenOthersGiveBitIdenticalLogits) {
  const ModelWeights& w = weights_named(GetParam());
  const LogitsTrace alone = run_chunked({40}, 5, w);
  ASSERT_TRUE(non_degenerate(alone));
  EXPECT_TRUE(bit_identical(alone, run_crowded(w)));
}

// A tiled model with 16 query heads of 64, so that a prefill tile's attention past ~256 keys
// splits its (token, head) pairs over threads (CpuModel::attend_tile, on 2 cores or more), while
// a token alone attends on one thread: a 300-token prompt in one chunk and a token at a time give
// bit-identical logits.
TEST(ThreadedAttention, OneChunkAndATokenAtATimeGiveBitIdenticalLogits) {
  static const ModelWeights weights = [] {
    ModelConfig c = testing::tiled_weights().config;
    c.name = "tiny-wide-heads";
    c.query_heads_count = 16;
    return weights_from_seed(c, 7);
  }();
  constexpr int32_t kPrompt = 300;
  ExecutorConfig config = testing::small_config();
  config.context_length = 512, config.prefill_chunk_tokens = kPrompt;
  const LogitsTrace one = run_chunked({kPrompt}, 1, weights, kPrompt, config);
  ASSERT_TRUE(non_degenerate(one));
  EXPECT_TRUE(bit_identical(one, run_chunked(std::vector<int32_t>(kPrompt, 1), 1, weights,
                                             kPrompt, config)));
}

INSTANTIATE_TEST_SUITE_P(TokenAtATimeAndTiled, ChunkInvariance, ::testing::Values("tiny", "tiled"));
INSTANTIATE_TEST_SUITE_P(TokenAtATimeAndTiled, PoolRowInvariance,
                         ::testing::Values("tiny", "tiled"));
INSTANTIATE_TEST_SUITE_P(TokenAtATimeAndTiled, BatchInvariance, ::testing::Values("tiny", "tiled"));

}  // namespace
}  // namespace ls
