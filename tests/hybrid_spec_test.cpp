// Speculative decoding on a hybrid (Mamba2 + attention) model on the CPU reference (issue 19):
// a verified decode row's state after each verify token, the commit of the one after the last
// accepted token, the page-boundary snapshot by the rule with a drafter, and greedy tokens and
// logits bits the same with the drafter on and off (tests/hybrid_spec_properties.h).
#include "tests/hybrid_spec_properties.h"

#include "core/check.h"
#include "core/cpu_backend.h"
#include "core/executor.h"
#include "core/drafter.h"
#include "tests/test_support.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <filesystem>

namespace ls {
namespace {

namespace fs = std::filesystem;
using testing::decode_row;
using testing::pages_from;
using testing::prefill_row;
using testing::prompt_for;

std::vector<RequestSpec> greedy_requests(int32_t count, int32_t vocab, int32_t new_tokens) {
  std::vector<RequestSpec> requests;
  for (RequestId id = 1; id <= static_cast<RequestId>(count); ++id) {
    requests.push_back(RequestSpec{.id = id,
                                   .prompt = prompt_for(id, 5 + 9 * static_cast<int32_t>(id), vocab),
                                   .max_new_tokens = new_tokens});
  }
  return requests;
}

// Issue 19's acceptance on tiny-hybrid: greedy tokens and the logits bits of every accepted
// position are the same with the drafter on (W 2 and 4, drafts right 0%, 60% and 100% of the
// time) and off, prefilled in chunks of 1, 5 and 16 tokens, pages of 4 so verify rows cross page
// boundaries, with the prefix cache (checkpoints by the rule with a drafter) and under page
// pressure (retraction by recompute).
TEST(HybridSpec, GreedyTokensAreBitIdenticalWithTheDrafterOnAndOff) {
  const ModelWeights& weights = hybrid_spec::tiny_hybrid_weights();
  const std::vector<RequestSpec> requests = greedy_requests(4, weights.config.vocab_size, 14);
  int64_t partial = 0, retractions = 0;
  for (const int32_t chunk : {1, 5, 16}) {
    for (const int32_t width : {2, 4}) {
      for (const int32_t acceptance : {0, 60, 100}) {
        hybrid_spec::SpecWorld world{.max_batch_rows = 3, .page_size = 4, .chunk = chunk,
                                     .verify_width = width, .acceptance = acceptance};
        world.prefix_cache = chunk == 5;
        world.tight_pool = chunk == 16;
        hybrid_spec::SpecRun drafted;
        EXPECT_EQ(hybrid_spec::same_with_and_without_drafter(weights, world, requests, &drafted), "");
        for (const RequestSpec& r : requests) EXPECT_EQ(drafted.tokens.at(r.id).size(), size_t{14});
        partial += drafted.partial_rows;
        retractions += drafted.retractions;
      }
    }
  }
  EXPECT_GT(partial, 0);  // rows that rejected a draft: the commit keeps an earlier state
  EXPECT_GT(retractions, 0);
}

// The same on the HF Bamba fixture (tests/fixtures/hf/bamba, as Hugging Face reads it).
TEST(HybridSpec, TheBambaFixtureGivesTheSameTokensWithTheDrafterOnAndOff) {
  const fs::path fixture = fs::path(LOCKSTEP_SOURCE_DIR) / "tests" / "fixtures" / "hf" / "bamba";
  const ModelWeights weights = load_hf_directory(fixture);
  const std::vector<RequestSpec> requests = greedy_requests(3, weights.config.vocab_size, 12);
  for (const int32_t chunk : {3, 16}) {
    const hybrid_spec::SpecWorld world{.max_batch_rows = 2, .page_size = 4, .chunk = chunk,
                                       .verify_width = 3, .acceptance = 60};
    hybrid_spec::SpecRun drafted;
    EXPECT_EQ(hybrid_spec::same_with_and_without_drafter(weights, world, requests, &drafted), "");
    EXPECT_GT(drafted.partial_rows, 0);
  }
}

// A prefix hit on a checkpoint the drafted run snapshotted: the cached run's tokens (requests
// that share a 24-token prefix, the later ones hitting it) are the plain run's.
TEST(HybridSpec, APrefixHitOnACheckpointOfAVerifiedRowGivesTheSameTokens) {
  const ModelWeights& weights = hybrid_spec::tiny_hybrid_weights();
  hybrid_spec::SpecWorkload w;
  w.world = {.max_batch_rows = 2, .page_size = 4, .chunk = 8, .verify_width = 3, .acceptance = 60,
             .prefix_cache = true};
  w.prompt_lengths = {10, 30, 30, 30};
  w.shared_prefix = {10, 30, 30, 30};  // request 1 decodes across the pages the others hit
  w.new_tokens = {16, 6, 6, 6};
  hybrid_spec::SpecRun drafted;
  EXPECT_EQ(hybrid_spec::same_with_and_without_drafter(weights, w.world,
                                                       w.requests(weights.config.vocab_size), &drafted),
            "");
  EXPECT_GT(drafted.prefix_hit_tokens, 0);
}

// A prefix hit on a checkpoint a verified row snapshotted while decoding: request 1 (a 6-token
// prompt: its prefill ends no page, so it leaves no checkpoint) decodes 20 tokens with W = 3,
// crossing page boundaries 8 … 24 inside verify rows; request 2, served after it on the one batch
// row, prompts with request 1's prompt and first 16 generated tokens and a suffix, so its hit can
// only stop at a decode-time checkpoint. Its tokens and logits bits equal the W = 1 run's.
TEST(HybridSpec, APrefixHitOnAVerifiedRowsCheckpointGivesTheSameTokens) {
  const ModelWeights& weights = hybrid_spec::tiny_hybrid_weights();
  const int32_t vocab = weights.config.vocab_size;
  const RequestSpec first{.id = 1, .prompt = prompt_for(1, 6, vocab), .max_new_tokens = 20};
  hybrid_spec::SpecWorld world{.max_batch_rows = 1, .page_size = 4, .chunk = 8, .verify_width = 3,
                               .acceptance = 60, .prefix_cache = true};
  const hybrid_spec::SpecRun alone = hybrid_spec::serve(weights, world, {first}, false);
  ASSERT_EQ(alone.tokens.at(1).size(), size_t{20});
  RequestSpec second{.id = 2, .prompt = first.prompt, .max_new_tokens = 6};
  second.prompt.insert(second.prompt.end(), alone.tokens.at(1).begin(), alone.tokens.at(1).begin() + 16);
  const std::vector<int32_t> suffix = prompt_for(2, 3, vocab);
  second.prompt.insert(second.prompt.end(), suffix.begin(), suffix.end());
  hybrid_spec::SpecRun drafted;
  EXPECT_EQ(hybrid_spec::same_with_and_without_drafter(weights, world, {first, second}, &drafted), "");
  EXPECT_GE(drafted.prefix_hit_tokens, 8) << "request 2 hit no checkpoint of request 1's decode";
  EXPECT_GT(drafted.partial_rows, 0);
}

// Proposes fixed drafts for the first verify round: `drafts`, once.
class FixedDrafter final : public Drafter {
 public:
  explicit FixedDrafter(std::vector<int32_t> drafts) : drafts_(std::move(drafts)) {}
  void draft(const DraftContext&, std::span<int32_t> out) const override {
    for (size_t i = 0; i < out.size(); ++i) out[i] = drafts_.at(i);
  }
  std::string name() const override { return "fixed"; }

 private:
  std::vector<int32_t> drafts_;
};

// One verified decode row by hand. The reference: prefill 6 tokens, then 4 decode steps with
// W = 1, keeping the working state after each (states[k]: after k decode tokens) and the tokens
// e0 … e4. Then W = 4 with the drafts [e1, e2, junk]: the row accepts 3 (two drafts and the
// correction e3), so the working slot must hold states[3] — not states[4], whose last token was
// the rejected draft — and vcl 6 → 9 crosses the page boundary 8, whose checkpoint holds the state
// after the inputs at positions 6 and 7: states[2].
TEST(HybridSpec, TheWorkingSlotHoldsTheStateAfterTheLastAcceptedToken) {
  const ModelWeights& weights = hybrid_spec::tiny_hybrid_weights();
  const int32_t vocab = weights.config.vocab_size;
  ExecutorConfig c = testing::small_config();  // P 4
  c.mamba_slots_count = 4;
  const std::vector<int32_t> prompt = prompt_for(7, 6, vocab);
  const auto prefill = [&] {
    ForwardOp op;
    op.rows = {prefill_row(1, 1, 0, 6, 6)};
    op.rows[0].mamba_working = 0, op.rows[0].refresh = {0, pages_from(10, 4)};
    op.rows[0].sampling = SamplingParams{};
    op.prefill_token_ids = prompt;
    return op;
  };
  std::vector<std::vector<float>> states;
  std::vector<int32_t> emitted;
  {
    CpuBackend backend(weights, c);
    Executor executor(c, vocab, backend);
    emitted.push_back(executor.step(prefill()).tokens[0]);
    states.push_back(backend.read_mamba_state(0));
    for (int32_t k = 0; k < 4; ++k) {
      ForwardOp d;
      d.rows = {decode_row(1, 1)};
      d.rows[0].mamba_working = 0;
      emitted.push_back(executor.step(d).tokens[0]);
      states.push_back(backend.read_mamba_state(0));
    }
  }
  ExecutorConfig spec = c;
  spec.verify_width = 4;
  const int32_t junk = (emitted[3] + 1) % vocab;
  CpuBackend backend(weights, spec, nullptr, false,
                     std::make_unique<FixedDrafter>(std::vector<int32_t>{emitted[1], emitted[2], junk}));
  Executor executor(spec, vocab, backend);
  ASSERT_EQ(executor.step(prefill()).tokens[0], emitted[0]);
  ForwardOp d;
  d.rows = {decode_row(1, 1, 4)};
  d.rows[0].mamba_working = 0, d.rows[0].mamba_checkpoint_dst = 2;
  const StepResult r = executor.step(d);
  ASSERT_EQ(r.accepted_lengths[0], 3);
  EXPECT_EQ(std::vector<int32_t>(r.tokens.begin(), r.tokens.begin() + 3),
            (std::vector<int32_t>{emitted[1], emitted[2], emitted[3]}));
  EXPECT_TRUE(backend.read_mamba_state(0) == states[3]) << "the working state is not the state "
                                                           "after the last accepted token";
  EXPECT_FALSE(states[3] == states[4]);
  EXPECT_TRUE(backend.read_mamba_state(2) == states[2]) << "the checkpoint at page boundary 8";
  // The next round continues from there: W = 4 again, its first token is e4's successor.
  ForwardOp next;
  next.rows = {decode_row(1, 1, 4)};
  next.rows[0].mamba_working = 0;
  EXPECT_EQ(executor.step(next).tokens[0], emitted[4]);
}

TEST(HybridSpecProperty, GreedyTokensAreTheSameWithAndWithoutTheDrafter) {
  const std::optional<std::string> failure = hybrid_spec::counterexample(100);
  EXPECT_FALSE(failure.has_value()) << *failure;
}

}  // namespace
}  // namespace ls
