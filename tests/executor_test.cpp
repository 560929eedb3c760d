// The executor's per-step rules on the CPU backend. Expected values are worked out by hand from
// the rules in DESIGN.md (slot = page·P + q mod P, vcl arithmetic, the context clamp), or come
// from an independent run (a second harness), never from the code under test.
#include "core/check.h"
#include "core/executor.h"
#include "tests/test_support.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>

namespace ls {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using testing::decode_row;
using testing::Harness;
using testing::pages_from;
using testing::prefill_row;
using testing::prompt_for;
using testing::small_config;

// Prefills `length` prompt tokens of request `id` on `pool_row` in one chunk, with `pages`.
StepResult prefill(Harness& h, RequestId id, int32_t pool_row, int32_t length,
                   std::vector<int32_t> pages, SamplingParams sampling = {}) {
  ForwardOp op;
  op.rows.push_back(prefill_row(id, pool_row, 0, length, length));
  op.rows[0].refresh = {0, std::move(pages)};
  op.rows[0].sampling = sampling;
  op.prefill_token_ids = prompt_for(id, length);
  return h.executor.step(op);
}

TEST(SlotRule, MapsPositionsThroughTheTableAndOverflowsToTheDummySlot) {
  const std::vector<int32_t> table = {5, 9, 2};  // Wp = 3, P = 4
  EXPECT_EQ(slot_for(table, 4, 0), 20);   // page 5 · 4 + 0
  EXPECT_EQ(slot_for(table, 4, 5), 37);   // page 9 · 4 + 1
  EXPECT_EQ(slot_for(table, 4, 11), 11);  // page 2 · 4 + 3
  EXPECT_EQ(slot_for(table, 4, 12), 0);   // column 3 ≥ Wp: the dummy slot
  EXPECT_EQ(slot_for(table, 4, 1000), 0);
}

TEST(Executor, FillsPositionsAndSlotsByTheSlotRule) {
  Harness h;
  prefill(h, 1, 3, 6, {7, 4});  // positions 0..5 → pages 7 (0..3), 4 (4..5)
  const InputSnapshot in = h.backend.read_inputs();
  EXPECT_THAT(std::vector<int32_t>(in.positions.begin(), in.positions.begin() + 6),
              ElementsAre(0, 1, 2, 3, 4, 5));
  EXPECT_THAT(std::vector<int64_t>(in.slots.begin(), in.slots.begin() + 6),
              ElementsAre(28, 29, 30, 31, 16, 17));
  ForwardOp op;
  op.rows.push_back(decode_row(1, 3));
  h.executor.step(op);  // vcl 6 → position 6 → page 4, offset 2 → slot 18
  const InputSnapshot decode = h.backend.read_inputs();
  EXPECT_EQ(decode.positions[0], 6);
  EXPECT_EQ(decode.slots[0], 18);
}

TEST(Executor, ClampsRefreshSlicesAtTheTableWidth) {
  Harness h;  // L = 64, P = 4: Wp = ⌊(64 + 4) / 4⌋ = 17 columns
  ASSERT_EQ(h.config.table_width(), 17);
  ForwardOp op;
  op.rows.push_back(prefill_row(1, 2, 0, 4, 4));
  op.rows[0].refresh = {15, {40, 41, 42, 43}};  // only columns 15 and 16 exist
  op.rows[0].sampling = SamplingParams{};
  op.prefill_token_ids = {1, 2, 3, 4};
  h.executor.step(op);
  const int32_t rows[] = {2};
  const StateSnapshot s = h.backend.read_state(rows);
  EXPECT_EQ(s.table[15], 40);
  EXPECT_EQ(s.table[16], 41);
  EXPECT_EQ(h.executor.stats().table_slices_clamped, 1);
}

TEST(Executor, DecodeInputComesFromTheLastSampledTokenOrTheOverride) {
  Harness h;
  const StepResult first = prefill(h, 1, 1, 5, {1, 2});
  ForwardOp op;
  op.rows.push_back(decode_row(1, 1));
  const StepResult second = h.executor.step(op);
  EXPECT_EQ(h.backend.read_inputs().input_ids[0], first.tokens[0]);
  op.rows[0].decode_override = 77;
  h.executor.step(op);
  EXPECT_EQ(h.backend.read_inputs().input_ids[0], 77);
  EXPECT_NE(second.tokens.size(), 0u);
}

TEST(Executor, ResetsVclOnEveryPrefillChunk) {
  Harness h;
  const std::vector<int32_t> prompt = prompt_for(5, 10);
  auto chunk = [&](int32_t prefix, int32_t length) {
    ForwardOp op;
    op.rows.push_back(prefill_row(5, 4, prefix, length, 10));
    if (prefix == 0) {
      op.rows[0].refresh = {0, {10, 11, 12}};
      op.rows[0].sampling = SamplingParams{};
    }
    op.prefill_token_ids.assign(prompt.begin() + prefix, prompt.begin() + prefix + length);
    h.executor.step(op);
    return h.vcl(4);
  };
  EXPECT_EQ(chunk(0, 4), 4);
  EXPECT_EQ(chunk(4, 3), 7);
  // The same chunk sent again resets to its prefix first: 4 + 3, not 7 + 3.
  EXPECT_EQ(chunk(4, 3), 7);
  EXPECT_EQ(chunk(7, 3), 10);
}

// Seed test_model_executor_retraction: in one MIXED op, a prefill row gets prefix + chunk, a
// normal decode row grows by one, and a recovered row restarts from hist_token_length.
TEST(Executor, RecoversARetractedRowInAMixedBatch) {
  Harness h;
  prefill(h, 1, 1, 6, {1, 2, 3});         // an unrelated request on row 1
  prefill(h, 2, 2, 2, {4, 5});            // B: vcl 2
  const StepResult c_prefill = prefill(h, 3, 3, 8, {6, 7});  // C: vcl 8, KV positions 0..7
  ASSERT_EQ(h.vcl(3), 8);

  // C is retracted: its pool row is dropped and it comes back on row 5 with the same pages,
  // resuming from KV length 7 with its last prompt token as the explicit input.
  ForwardOp op;
  OpRow a = prefill_row(11, 6, 0, 4, 4);  // a fresh prefill row leads the MIXED op
  a.refresh = {0, {8}};
  a.sampling = SamplingParams{};
  op.rows.push_back(a);
  op.prefill_token_ids = prompt_for(11, 4);
  op.rows.push_back(decode_row(2, 2));
  OpRow c = decode_row(3, 5);
  c.decode_override = prompt_for(3, 8)[7];
  c.hist_token_length = 7;
  c.refresh = {0, {6, 7}};
  c.sampling = SamplingParams{};
  op.rows.push_back(c);
  const StepResult r = h.executor.step(op);

  EXPECT_EQ(r.mode, ForwardMode::kMixed);
  EXPECT_EQ(h.vcl(6), 4);  // prefix 0 + 4
  EXPECT_EQ(h.vcl(2), 3);  // 2 + 1
  EXPECT_EQ(h.vcl(5), 8);  // hist 7 + 1
  const InputSnapshot in = h.backend.read_inputs();
  EXPECT_EQ(in.positions[5], 7);
  EXPECT_EQ(in.slots[5], 7 * 4 + 3);  // position 7 → column 1 → page 7, offset 3
  // The recovered step recomputes position 7 from the same KV: its logits are the prefill's.
  const size_t v = 512;
  ASSERT_EQ(r.logits.size(), 3 * v);
  EXPECT_EQ(std::memcmp(r.logits.data() + 2 * v, c_prefill.logits.data(), v * sizeof(float)), 0);
  EXPECT_EQ(r.tokens[2], c_prefill.tokens[0]);
}

// Stub verifier: accepts every column and emits ids 100, 101, ... (or a fixed id).
class AcceptAllVerifier final : public Verifier {
 public:
  explicit AcceptAllVerifier(int32_t fixed_id = -1) : fixed_id_(fixed_id) {}
  int32_t verify(const VerifyRow& row, std::span<int32_t> out, SamplingScratch&) const override {
    const int32_t w = static_cast<int32_t>(row.inputs.size());
    for (int32_t i = 0; i < w; ++i) out[i] = fixed_id_ != -1 ? fixed_id_ : 100 + i;
    return row.force_single ? 1 : w;
  }

 private:
  int32_t fixed_id_;
};

TEST(Executor, ClampsAcceptedLengthsAtTheContextLimit) {
  ExecutorConfig c = small_config();
  c.context_length = 16;
  c.verify_width = 4;  // Wp = ⌈(16 + 4) / 4⌉ = 5
  Harness h(c, std::make_unique<AcceptAllVerifier>());
  prefill(h, 1, 1, 10, pages_from(1, 5));
  ASSERT_EQ(h.vcl(1), 10);
  ForwardOp op;
  op.rows.push_back(decode_row(1, 1, 4));
  StepResult r = h.executor.step(op);  // room 16 − 10 = 6 ≥ 4: a' = 4
  EXPECT_EQ(r.accepted_lengths[0], 4);
  EXPECT_THAT(r.tokens, ElementsAre(100, 101, 102, 103));
  EXPECT_EQ(h.vcl(1), 14);
  r = h.executor.step(op);  // room 2: a' = min(4, 2) = 2
  EXPECT_EQ(r.accepted_lengths[0], 2);
  EXPECT_THAT(r.row_tokens(0), ElementsAre(100, 101));
  EXPECT_EQ(h.vcl(1), 16);
  r = h.executor.step(op);  // room 0: a' = 0, vcl stays at L
  EXPECT_EQ(r.accepted_lengths[0], 0);
  EXPECT_EQ(h.vcl(1), 16);
}

TEST(Executor, ClampsOutputIdsAndFlagsOutOfVocabularyRows) {
  ExecutorConfig c = small_config();
  Harness high(c, std::make_unique<AcceptAllVerifier>(512 + 5));
  prefill(high, 1, 1, 4, {1});
  prefill(high, 2, 2, 4, {2});
  ForwardOp op;
  op.rows.push_back(prefill_row(3, 3, 0, 4, 4));  // sampled normally: in range
  op.rows[0].refresh = {0, {3}};
  op.rows[0].sampling = SamplingParams{};
  op.prefill_token_ids = prompt_for(3, 4);
  op.rows.push_back(decode_row(1, 1));
  StepResult r = high.executor.step(op);
  EXPECT_EQ(r.tokens[1], 511);
  EXPECT_THAT(r.oov_flags, ElementsAre(0, 1));

  Harness low(c, std::make_unique<AcceptAllVerifier>(-7));
  prefill(low, 1, 1, 4, {1});
  ForwardOp d;
  d.rows.push_back(decode_row(1, 1));
  r = low.executor.step(d);
  EXPECT_EQ(r.tokens[0], 0);
  EXPECT_THAT(r.oov_flags, ElementsAre(1));
}

// Runs one decode step of three requests, poisoning row 1 when asked.
StepResult three_row_decode(Harness& h, bool poison, float value) {
  for (int32_t i = 1; i <= 3; ++i) prefill(h, i, i, 5, {2 * i, 2 * i + 1});
  ForwardOp op;
  for (int32_t i = 1; i <= 3; ++i) op.rows.push_back(decode_row(i, i));
  if (poison) h.executor.poison_next_step({1}, value);
  return h.executor.step(op);
}

TEST(Executor, NanGuardFlagsOnlyThePoisonedRowAndSanitisesIt) {
  Harness clean, poisoned;
  const StepResult expected = three_row_decode(clean, false, 0);
  const StepResult r = three_row_decode(poisoned, true, std::nanf(""));
  EXPECT_THAT(r.nan_flags, ElementsAre(0, 1, 0));
  const size_t v = 512;
  for (size_t i = 0; i < v; ++i) ASSERT_EQ(r.logits[v + i], -1e30f) << "vocab id " << i;
  EXPECT_EQ(std::memcmp(r.logits.data(), expected.logits.data(), v * sizeof(float)), 0);
  EXPECT_EQ(std::memcmp(r.logits.data() + 2 * v, expected.logits.data() + 2 * v, v * sizeof(float)),
            0);
  EXPECT_EQ(r.tokens[1], 0);  // all logits equal: greedy takes the lowest id
}

TEST(Executor, SanitisesInfinitiesWithoutFlagging) {
  Harness h;
  const StepResult plus = three_row_decode(h, true, INFINITY);
  EXPECT_THAT(plus.nan_flags, ElementsAre(0, 0, 0));
  EXPECT_EQ(plus.logits[512], 1e30f);
  Harness g;
  const StepResult minus = three_row_decode(g, true, -INFINITY);
  EXPECT_EQ(minus.logits[512 + 7], -1e30f);
}

TEST(Executor, RequiresSamplingParametersForARequestNewToItsPoolRow) {
  Harness h;
  ForwardOp op;
  op.rows.push_back(prefill_row(1, 1, 0, 2, 2));
  op.prefill_token_ids = {3, 4};
  try {
    h.executor.step(op);
    FAIL() << "accepted a new request without sampling parameters";
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), HasSubstr("new to pool row 1"));
  }
  EXPECT_EQ(h.vcl(1), 0);  // nothing changed
}

TEST(Executor, RejectedOpsChangeNoState) {
  Harness h;
  prefill(h, 1, 1, 5, {1, 2});
  ForwardOp bad;
  bad.rows.push_back(decode_row(1, 1));
  bad.rows.push_back(decode_row(2, 1));  // pool row used twice
  EXPECT_THROW(h.executor.step(bad), Error);
  EXPECT_EQ(h.vcl(1), 5);
  EXPECT_EQ(h.executor.stats().steps_count, 1);
}

TEST(Executor, IdleStepDoesNothing) {
  Harness h;
  const StepResult r = h.executor.step(ForwardOp{});
  EXPECT_EQ(r.mode, ForwardMode::kIdle);
  EXPECT_TRUE(r.tokens.empty());
}

TEST(Executor, ScrubsTheTailOfTheInputBuffers) {
  Harness h;
  prefill(h, 1, 1, 30, pages_from(1, 8));
  ForwardOp op;
  op.rows.push_back(decode_row(1, 1));
  h.executor.step(op);
  const InputSnapshot in = h.backend.read_inputs();
  for (size_t t = 1; t < in.input_ids.size(); ++t) {
    ASSERT_EQ(in.input_ids[t], 1) << t;
    ASSERT_EQ(in.positions[t], 0) << t;
    ASSERT_EQ(in.slots[t], 0) << t;
  }
}

TEST(Executor, DrawsDependOnSeedAndPositionNotOnBatchOrPoolRow) {
  const SamplingParams sampling{.temperature = 1.0f, .seed = 1234};
  auto run = [&](int32_t pool_row, int32_t neighbours, SamplingParams s) {
    Harness h;
    std::vector<int32_t> tokens;
    ForwardOp op;
    int32_t page = 1;
    for (int32_t n = 0; n < neighbours; ++n) {
      const int32_t row = n + 1 == pool_row ? 8 : n + 1;
      prefill(h, 100 + n, row, 3 + n, pages_from(page, 8), SamplingParams{.temperature = 0.7f});
      page += 8;
      op.rows.push_back(decode_row(100 + n, row));
    }
    tokens.push_back(prefill(h, 42, pool_row, 9, pages_from(page, 8), s).tokens[0]);
    op.rows.push_back(decode_row(42, pool_row));
    for (int32_t step = 0; step < 12; ++step) tokens.push_back(h.executor.step(op).tokens.back());
    return tokens;
  };
  const std::vector<int32_t> alone = run(1, 0, sampling);
  EXPECT_EQ(run(6, 5, sampling), alone);
  SamplingParams other = sampling;
  other.seed = 1235;
  EXPECT_NE(run(1, 0, other), alone);  // the seed matters: the draws are not degenerate
}

}  // namespace
}  // namespace ls
