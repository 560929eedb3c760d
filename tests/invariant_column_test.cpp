// The driver of the CUDA determinism column (tests/invariant_column.h) on the CPU reference: the
// retraction workload the GPU tests serve, by swap and by recompute, gives every request its solo
// run's bits here too (the reference is batch invariant), with the coverage the GPU tests assert
// (retractions of the path asked for, 64 rows in a step) — so a GPU failure is the backend's, not
// the driver's bookkeeping. And the comparison flags one altered token, logprob bit, digest bit,
// top logit, missing row or extra row, and a backend whose digests depend on the batch.
#include "tests/invariant_column.h"
#include "tests/test_support.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdio>

namespace ls {
namespace {

using ::testing::HasSubstr;

constexpr int32_t kVocab = 512;

column::Served serve_on_cpu(const SchedulerConfig& config, const std::vector<RequestSpec>& requests) {
  CpuBackend backend(testing::tiny_weights(), executor_config_for(config));
  return column::serve(backend, config, kVocab, requests);
}

column::Served solo_on_cpu(const SchedulerConfig& config, const std::vector<RequestSpec>& requests) {
  CpuBackend backend(testing::tiny_weights(), executor_config_for(config));
  return column::serve_each_alone(backend, config, kVocab, requests);
}

void expect_solo_bits_under_retraction(bool swap) {
  const std::vector<RequestSpec> requests = column::workload(column::kPressureWorkload, kVocab);
  const SchedulerConfig batched = column::pressure_config(swap);
  const column::Served run = serve_on_cpu(batched, requests);
  const column::Served solo = solo_on_cpu(column::solo_config(batched, 13), requests);
  std::printf("cpu %s: %ld steps, %d rows at most, %ld swaps, %ld recomputes\n",
              swap ? "swap" : "recompute", static_cast<long>(run.steps_count), run.rows_in_step_max,
              static_cast<long>(run.swap_retractions), static_cast<long>(run.recompute_retractions));
  EXPECT_EQ(run.rows_in_step_max, 64);
  EXPECT_EQ(solo.rows_in_step_max, 1);
  EXPECT_EQ(solo.swap_retractions + solo.recompute_retractions, 0);
  if (swap) {
    EXPECT_GT(run.swap_retractions, 0);
  } else {
    EXPECT_EQ(run.swap_retractions, 0);
    EXPECT_GT(run.recompute_retractions, 0);
  }
  const column::Comparison c = column::compare(solo, run, requests, column::Match::kSolo);
  EXPECT_EQ(c.difference, "");
  EXPECT_GT(c.rows_compared, c.tokens_compared) << "re-derived rows compared too";
  EXPECT_GT(c.distinct_tokens.size(), 100u);
}

TEST(InvariantColumnCpu, RetractionBySwapGivesEverySoloRunsBits) { expect_solo_bits_under_retraction(true); }

TEST(InvariantColumnCpu, RetractionByRecomputeGivesEverySoloRunsBits) {
  expect_solo_bits_under_retraction(false);
}

// A small workload served at batch 4 and alone: they agree, and one changed bit anywhere is named.
TEST(InvariantColumnCpu, TheComparisonFlagsOneAlteredBit) {
  const std::vector<RequestSpec> requests =
      column::workload({.count = 6, .prompt_min = 1, .prompt_max = 40, .new_min = 4, .new_max = 12,
                        .seed = 3},
                       kVocab);
  SchedulerConfig config;
  config.max_batch_rows = 4;
  config.context_length = 64;
  config.page_size = 4;
  config.prefill_chunk_tokens = 16;
  config.pages_count = 200;
  const column::Served solo = solo_on_cpu(column::solo_config(config, 7), requests);
  const column::Served run = serve_on_cpu(config, requests);
  ASSERT_EQ(column::compare(solo, run, requests, column::Match::kSolo).difference, "");
  ASSERT_EQ(column::compare(run, run, requests, column::Match::kSameSchedule).difference, "");
  ASSERT_NE(column::compare(solo, run, requests, column::Match::kSameSchedule).difference, "")
      << "a different chunking is not the same schedule";

  const RequestSpec& r = requests[2];
  const int32_t emitted_at = static_cast<int32_t>(r.prompt.size()) + 1;  // its second token's row
  const auto altered = [&](auto change) {
    column::Served copy = run;
    change(copy, copy.rows.at(r.id).at(emitted_at).front());
    return column::compare(solo, copy, requests, column::Match::kSolo).difference;
  };
  EXPECT_THAT(altered([](column::Served& s, column::RowBits&) { s.tokens.at(3).back() ^= 1; }),
              HasSubstr("request 3: emitted tokens differ"));
  EXPECT_THAT(altered([](column::Served&, column::RowBits& b) { b.token ^= 1; }),
              HasSubstr("request 3, sequence length"));
  EXPECT_THAT(altered([](column::Served&, column::RowBits& b) { b.logprob_bits ^= 1; }),
              HasSubstr("logprob bits"));
  EXPECT_THAT(altered([](column::Served&, column::RowBits& b) { b.digest ^= uint64_t{1} << 63; }),
              HasSubstr("logits digest"));
  EXPECT_THAT(altered([](column::Served&, column::RowBits& b) { b.top[7] ^= 1; }),
              HasSubstr("top logit 7"));
  EXPECT_THAT(altered([&](column::Served& s, column::RowBits&) { s.rows.at(r.id).erase(emitted_at); }),
              HasSubstr("no row at sequence length"));
  // The same schedule: a row computed once more is a difference.
  column::Served extra = run;
  auto& rows = extra.rows.at(r.id).at(emitted_at);
  rows.push_back(rows.front());
  EXPECT_THAT(column::compare(run, extra, requests, column::Match::kSameSchedule).difference,
              HasSubstr("rows at sequence length"));
}

// The CPU reference with one batch-dependent bit: a step of `rows_min` rows or more flips the
// lowest bit of its last row's logits digest (the tokens stay right, so only the digests tell).
class DigestFlippingBackend final : public testing::CpuBackendWrapper {
 public:
  DigestFlippingBackend(const ExecutorConfig& config, int32_t rows_min)
      : CpuBackendWrapper(testing::tiny_weights(), config), rows_min_(rows_min) {}
  void finish_step(const StepPlan& plan, StepResult& result) override {
    inner_.finish_step(plan, result);
    if (static_cast<int32_t>(result.logits_digests.size()) >= rows_min_) {
      result.logits_digests.back() ^= 1;
      ++flips_count;
    }
  }

  int64_t flips_count = 0;

 private:
  int32_t rows_min_;
};

// The driver end to end against a backend that is not batch invariant: the run is flagged.
TEST(InvariantColumnCpu, ABatchDependentDigestFailsTheSoloComparison) {
  const std::vector<RequestSpec> requests = column::workload(column::kPressureWorkload, kVocab);
  const SchedulerConfig batched = column::pressure_config(/*swap=*/true);
  DigestFlippingBackend broken(executor_config_for(batched), 48);
  const column::Served run = column::serve(broken, batched, kVocab, requests);
  ASSERT_GT(broken.flips_count, 0);
  const column::Served solo = solo_on_cpu(column::solo_config(batched, 13), requests);
  const column::Comparison c = column::compare(solo, run, requests, column::Match::kSolo);
  EXPECT_THAT(c.difference, HasSubstr("logits digest"));
  EXPECT_EQ(run.tokens, solo.tokens) << "the flip changes digests only";
}

}  // namespace
}  // namespace ls

