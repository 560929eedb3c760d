// Speculative decoding on the CPU reference (issue 7): the n-gram drafter, force-single-token on a
// recovered row with W > 1, the scheduler's page accounting with accepted lengths 0..W, greedy
// output identical with speculative decoding on or off, and drafters in traces and replay.
#include "core/check.h"
#include "core/cpu_backend.h"
#include "core/drafter.h"
#include "core/executor.h"
#include "core/scheduler.h"
#include "core/serving_loop.h"
#include "replay/replay.h"
#include "sim/oracle_drafter.h"
#include "sim/sweep.h"
#include "sim/trace_recording.h"
#include "tests/test_support.h"
#include "trace/reader.h"
#include "trace/recorder.h"
#include "trace/trace_observer.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <unistd.h>

#include <fmt/format.h>

#include <algorithm>
#include <filesystem>
#include <functional>

namespace ls {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using testing::decode_row;
using testing::pages_from;
using testing::prefill_row;
using testing::tiny_weights;

std::vector<int32_t> ngram(std::vector<int32_t> history, int32_t width) {
  NgramDrafter drafter;
  std::vector<int32_t> drafts(static_cast<size_t>(width - 1), -1);
  const DraftContext context{.history = history, .bonus = history.back(),
                             .position = static_cast<int32_t>(history.size()) - 1,
                             .verify_width = width, .vocab_size = 512};
  drafter.draft(context, drafts);
  return drafts;
}

TEST(NgramDrafter, ProposesWhatFollowedTheMostRecentEarlierMatch) {
  // The last 3 tokens (7 8 9) occurred twice; the more recent occurrence was followed by 4 5.
  EXPECT_THAT(ngram({7, 8, 9, 1, 2, 7, 8, 9, 4, 5, 6, 7, 8, 9}, 3), ElementsAre(4, 5));
  // No 3-gram or 2-gram match: the last token alone (9) matched at index 1.
  EXPECT_THAT(ngram({3, 9, 11, 12, 5, 9}, 4), ElementsAre(11, 12, 5));
  // A 3-gram match beats a more recent 1-gram match.
  EXPECT_THAT(ngram({1, 2, 3, 40, 9, 3, 50, 1, 2, 3}, 2), ElementsAre(40));
}

TEST(NgramDrafter, ContinuesALoopPastTheEndOfTheHistory) {
  // Period 3: the copy runs over the drafts it already proposed.
  EXPECT_THAT(ngram({5, 6, 7, 5, 6, 7}, 8), ElementsAre(5, 6, 7, 5, 6, 7, 5));
  EXPECT_THAT(ngram({4, 4}, 5), ElementsAre(4, 4, 4, 4));
}

TEST(NgramDrafter, PadsWithTheBonusTokenWhenNothingMatches) {
  EXPECT_THAT(ngram({1, 2, 3, 4}, 4), ElementsAre(4, 4, 4));
  EXPECT_THAT(ngram({9}, 3), ElementsAre(9, 9));
}

TEST(MakeDrafter, RebuildsNoneAndNgramAndRefusesOthersClearly) {
  EXPECT_EQ(make_drafter("none"), nullptr);
  EXPECT_EQ(make_drafter(""), nullptr);
  EXPECT_EQ(make_drafter("ngram")->name(), "ngram");
  try {
    make_drafter("oracle-mix(p=0.50)");
    FAIL() << "expected ls::Error";
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), HasSubstr("drafter 'oracle-mix(p=0.50)' cannot be rebuilt"));
    EXPECT_THAT(e.what(), HasSubstr("'ngram'"));
  }
}

TEST(OracleMixDrafter, ProposesTheReferenceWithProbabilityPAndJunkOtherwise) {
  std::vector<int32_t> reference(200);
  for (size_t i = 0; i < reference.size(); ++i) reference[i] = static_cast<int32_t>((i * 37) % 512);
  for (double p : {0.0, 0.5, 1.0}) {
    const sim::OracleMixDrafter drafter({{5, reference}}, p, 99);
    int32_t truths = 0, total = 0;
    for (int32_t position = 0; position + 8 < 200; ++position) {
      std::vector<int32_t> drafts(7);
      const std::vector<int32_t> history(reference.begin(), reference.begin() + position + 1);
      drafter.draft({.request_id = 5, .history = history, .bonus = history.back(),
                     .position = position, .verify_width = 8, .vocab_size = 512},
                    drafts);
      for (int32_t i = 0; i < 7; ++i) truths += drafts[i] == reference[position + 1 + i] ? 1 : 0;
      total += 7;
    }
    const double rate = static_cast<double>(truths) / total;
    EXPECT_NEAR(rate, p, 0.05) << "p " << p;
  }
}

// --- force-single-token on a recovered row with W > 1 ---------------------------------------------

// The greedy tokens of request `id` decoded alone with W = 1 and no drafter: the reference.
std::vector<int32_t> greedy_reference(RequestId id, const std::vector<int32_t>& prompt, int32_t count) {
  ExecutorConfig c = testing::small_config();
  CpuBackend backend(tiny_weights(), c);
  Executor executor(c, tiny_weights().config.vocab_size, backend);
  ForwardOp op;
  const int32_t n = static_cast<int32_t>(prompt.size());
  op.rows.push_back(prefill_row(id, 1, 0, n, n));
  op.rows[0].refresh = {0, pages_from(1, c.table_width())};
  op.rows[0].sampling = SamplingParams{};
  op.prefill_token_ids = prompt;
  std::vector<int32_t> tokens = executor.step(op).row_tokens(0);
  ForwardOp d;
  d.rows.push_back(decode_row(id, 1));
  while (static_cast<int32_t>(tokens.size()) < count) tokens.push_back(executor.step(d).tokens[0]);
  return tokens;
}

TEST(SpecDecode, ARecoveredRowWithWidthFourAcceptsExactlyOneToken) {
  ExecutorConfig c = testing::small_config();
  c.verify_width = 4;
  CpuBackend backend(tiny_weights(), c, nullptr, false, std::make_unique<NgramDrafter>());
  Executor executor(c, tiny_weights().config.vocab_size, backend);
  const int32_t rows_a[] = {1}, rows_b[] = {2};
  auto vcl_of = [&](std::span<const int32_t> rows) { return backend.read_state(rows).valid_cache_length[0]; };
  // A repetitive prompt so the n-gram drafter has something to propose.
  std::vector<int32_t> prompt;
  for (int32_t t = 0; t < 12; ++t) prompt.push_back(20 + t % 4);
  const std::vector<int32_t> expected = greedy_reference(7, prompt, 40);

  ForwardOp op;
  op.rows.push_back(prefill_row(7, 1, 0, 12, 12));
  op.rows[0].refresh = {0, pages_from(1, c.table_width())};
  op.rows[0].sampling = SamplingParams{};
  op.prefill_token_ids = prompt;
  std::vector<int32_t> tokens = executor.step(op).row_tokens(0);
  ForwardOp d;
  d.rows.push_back(decode_row(7, 1, 4));
  for (int32_t s = 0; s < 3; ++s) {
    const StepResult r = executor.step(d);
    EXPECT_GE(r.accepted_lengths[0], 1);
    const std::vector<int32_t> emitted = r.row_tokens(0);
    tokens.insert(tokens.end(), emitted.begin(), emitted.end());
  }
  const int32_t hist = vcl_of(rows_a);
  ASSERT_EQ(hist, 12 + static_cast<int32_t>(tokens.size()) - 1);

  // Retracted, recovered on pool row 2 with its KV in the same pages: the draft columns are dummies.
  ForwardOp recover;
  recover.rows.push_back(decode_row(7, 2, 4));
  recover.rows[0].hist_token_length = hist;
  recover.rows[0].decode_override = tokens.back();
  recover.rows[0].refresh = {0, pages_from(1, c.table_width())};
  recover.rows[0].sampling = SamplingParams{};
  const StepResult r = executor.step(recover);
  EXPECT_EQ(r.accepted_lengths[0], 1);
  EXPECT_EQ(vcl_of(rows_b), hist + 1);
  tokens.push_back(r.tokens[0]);
  ForwardOp next;
  next.rows.push_back(decode_row(7, 2, 4));
  while (tokens.size() < 30) {
    const std::vector<int32_t> emitted = executor.step(next).row_tokens(0);
    tokens.insert(tokens.end(), emitted.begin(), emitted.end());
  }
  tokens.resize(30);
  EXPECT_EQ(tokens, std::vector<int32_t>(expected.begin(), expected.begin() + 30));
}

// --- greedy invariance and the scheduler with W > 1 -----------------------------------------------

using Outcomes = std::map<RequestId, std::vector<int32_t>>;
using DrafterFactory = std::function<std::unique_ptr<Drafter>(const Outcomes& reference)>;

std::vector<RequestSpec> greedy_workload(int32_t count, int32_t context_length) {
  std::vector<RequestSpec> specs;
  for (int32_t i = 0; i < count; ++i) {
    RequestSpec s;
    s.id = static_cast<RequestId>(10 + i);
    const int32_t length = 6 + (i * 7) % 20;
    for (int32_t t = 0; t < length; ++t) {
      // Half the prompts repeat a short phrase (prompt lookup's workload), half do not.
      s.prompt.push_back(i % 2 == 0 ? 30 + (t % 5) * 3 + i : (i * 131 + t * 71) % 512);
    }
    s.max_new_tokens = i == count - 1 ? context_length : 16 + (i * 5) % 24;  // the last runs into L
    specs.push_back(std::move(s));
  }
  return specs;
}

struct SpecRun {
  Outcomes tokens;
  int64_t steps = 0;
  int64_t accounting_failures = 0;
  std::string first_accounting_failure;
};

// Runs the workload through the production scheduler and serving loop, checking the scheduler's
// page accounting after every step.
SpecRun run_workload(const SchedulerConfig& sc, std::unique_ptr<Drafter> drafter) {
  const ExecutorConfig ec = executor_config_for(sc);
  CpuBackend backend(tiny_weights(), ec, nullptr, false, std::move(drafter));
  Executor executor(ec, tiny_weights().config.vocab_size, backend);
  Scheduler scheduler(sc);
  for (const RequestSpec& s : greedy_workload(8, sc.context_length)) {
    scheduler.submit(s, tiny_weights().config.vocab_size);
  }
  SpecRun run;
  ServingLoopOptions options;
  options.on_step = [&](const ServingProgress&) {
    const std::string problem = scheduler.check_accounting();
    if (!problem.empty() && run.accounting_failures++ == 0) run.first_accounting_failure = problem;
  };
  run.steps = run_serving_loop(scheduler, executor, options).steps_count;
  for (const auto& [id, outcome] : scheduler.outcomes()) run.tokens[id] = outcome.tokens;
  EXPECT_EQ(scheduler.free_pages_count() + scheduler.cached_pages_count(), sc.pages_count - 1);
  EXPECT_EQ(scheduler.free_pool_rows_count(), sc.max_batch_rows);
  return run;
}

SchedulerConfig spec_scheduler(int32_t width, bool overlap, int32_t pages_count) {
  SchedulerConfig sc;
  sc.max_batch_rows = 4;
  sc.prefill_chunk_tokens = 48;
  sc.page_size = 4;
  sc.context_length = 72;
  sc.pages_count = pages_count;
  sc.host_pages_count = 24;
  sc.verify_width = width;
  sc.overlap = overlap;
  return sc;
}

const Outcomes& plain_outcomes() {
  static const Outcomes outcomes = run_workload(spec_scheduler(1, true, 400), nullptr).tokens;
  return outcomes;
}

sim::References references_of(const Outcomes& generated) {
  sim::References refs;
  for (const RequestSpec& s : greedy_workload(8, 72)) {
    std::vector<int32_t> tokens = s.prompt;
    tokens.insert(tokens.end(), generated.at(s.id).begin(), generated.at(s.id).end());
    refs[s.id] = std::move(tokens);
  }
  return refs;
}

struct InvarianceCase {
  int32_t width;
  std::string drafter;  // "ngram", "oracle-0", "oracle-50", "oracle-100"
};

class SpecInvariance : public ::testing::TestWithParam<InvarianceCase> {};

std::unique_ptr<Drafter> drafter_for(const std::string& name) {
  if (name == "ngram") return std::make_unique<NgramDrafter>();
  const double p = name == "oracle-0" ? 0.0 : name == "oracle-50" ? 0.5 : 1.0;
  return std::make_unique<sim::OracleMixDrafter>(references_of(plain_outcomes()), p, 1234);
}

// Issue 7's acceptance: greedy output with speculative decoding on (W in 2..8, any acceptance
// rate) is token-for-token what it is with speculative decoding off.
TEST_P(SpecInvariance, GreedyOutputIsIdenticalWithSpeculativeDecodingOff) {
  const InvarianceCase c = GetParam();
  const Outcomes& expected = plain_outcomes();
  ASSERT_EQ(expected.size(), 8u);
  const SpecRun run = run_workload(spec_scheduler(c.width, true, 400), drafter_for(c.drafter));
  EXPECT_EQ(run.accounting_failures, 0) << run.first_accounting_failure;
  for (const auto& [id, tokens] : expected) {
    ASSERT_FALSE(tokens.empty());
    EXPECT_EQ(run.tokens.at(id), tokens) << "request " << id << ", W " << c.width << ", " << c.drafter;
  }
  if (c.drafter == "oracle-100") {
    // Full acceptance: far fewer steps than tokens.
    int64_t generated = 0;
    for (const auto& [id, tokens] : expected) generated += static_cast<int64_t>(tokens.size());
    EXPECT_LT(run.steps * 2, generated);
  }
}

INSTANTIATE_TEST_SUITE_P(
    WidthsAndDrafters, SpecInvariance,
    ::testing::Values(InvarianceCase{2, "ngram"}, InvarianceCase{4, "ngram"}, InvarianceCase{8, "ngram"},
                      InvarianceCase{3, "oracle-0"}, InvarianceCase{5, "oracle-50"},
                      InvarianceCase{8, "oracle-50"}, InvarianceCase{2, "oracle-100"},
                      InvarianceCase{7, "oracle-100"}),
    [](const ::testing::TestParamInfo<InvarianceCase>& case_info) {
      std::string name = "W" + std::to_string(case_info.param.width) + "_" + case_info.param.drafter;
      std::replace(name.begin(), name.end(), '-', '_');
      return name;
    });

// Page pressure with W in 2..8, overlap on and off: accepted lengths vary over 0..W, requests are
// retracted (swap and recompute) and recovered with force-single rows, and the accounting holds
// after every step with no page leaked — and the greedy tokens still match.
TEST(SpecScheduler, PageAccountingHoldsUnderPressureForEveryWidth) {
  const Outcomes& expected = plain_outcomes();
  for (int32_t width = 2; width <= 8; ++width) {
    for (bool overlap : {true, false}) {
      // Room for about two full contexts: decode growth must retract.
      const SpecRun run = run_workload(spec_scheduler(width, overlap, 2 * ((72 + 2 * width) / 4 + 2) + 1),
                                       std::make_unique<NgramDrafter>());
      EXPECT_EQ(run.accounting_failures, 0) << "W " << width << ": " << run.first_accounting_failure;
      EXPECT_EQ(run.tokens, expected) << "W " << width << (overlap ? " with" : " without") << " overlap";
    }
  }
}

// --- traces and replay -----------------------------------------------------------------------------

namespace fs = std::filesystem;

const ModelWeights& sim_weights() {
  static const ModelWeights weights = weights_from_seed(model_config_named("tiny"), 0);
  return weights;
}

fs::path temp_path(const std::string& name) {
  const fs::path dir = fs::temp_directory_path() / fmt::format("lockstep-spec-test-{}", ::getpid());
  fs::create_directories(dir);
  return dir / name;
}

// The first speculative seed at or after `from` whose drafter is `kind`.
sim::SimParams spec_seed(sim::SimDrafter kind, uint64_t from) {
  sim::SimOverrides o;
  o.speculative = true;
  for (uint64_t seed = from;; ++seed) {
    const sim::SimParams p = sim::derive_params(seed, o);
    if (p.drafter == kind) return p;
  }
}

sim::SimSummary record(const sim::SimParams& params, const fs::path& path) {
  const WeightSource source{WeightSource::Kind::kSeed, 0, ""};
  trace::TraceHeader header =
      trace::make_trace_header(sim_weights(), source, sim::executor_config_for(params), "cpu");
  header.drafter = params.drafter_name();
  auto recorder = trace::Recorder::open(path, header);
  sim::SimTraceObserver observer(*recorder);
  sim::WorldOptions world{.observer = &observer, .executor_options = trace::recording_executor_options()};
  const sim::SimSummary summary = sim::run_world(params, sim_weights(), world);
  recorder->close();
  return summary;
}

// A recording step's greedy rows take their token from the row's recorded top logits
// (core/sampling.h greedy_token): the served tokens are those of a run that records nothing, with
// and without speculative decoding (greedy verification reads the top of every draft column).
TEST(SpecTrace, RecordingLeavesEveryServedTokenAsItIs) {
  std::vector<sim::SimParams> worlds = {sim::derive_params(3, {}), sim::derive_params(11, {})};
  for (uint64_t from : {1, 20}) worlds.push_back(spec_seed(sim::SimDrafter::kNgram, from));
  for (const sim::SimParams& params : worlds) {
    const sim::SimSummary plain = sim::run_world(params, sim_weights(), {});
    const sim::SimSummary recording = sim::run_world(
        params, sim_weights(), {.executor_options = trace::recording_executor_options()});
    ASSERT_TRUE(plain.passed()) << params.describe();
    EXPECT_GT(plain.tokens_generated, 0) << params.describe();
    EXPECT_EQ(recording.tokens_generated, plain.tokens_generated) << params.describe();
    EXPECT_EQ(recording.fingerprint, plain.fingerprint) << params.describe();
  }
}

TEST(SpecTrace, AnNgramRunRecordsItsDrafterAndDraftsAndReplaysIdentical) {
  for (uint64_t from : {1, 20, 40}) {
    const sim::SimParams params = spec_seed(sim::SimDrafter::kNgram, from);
    const fs::path path = temp_path(fmt::format("ngram-{}.trace", params.seed));
    ASSERT_TRUE(record(params, path).passed()) << params.describe();
    trace::TraceReader reader = trace::TraceReader::open(path);
    EXPECT_EQ(reader.header().drafter, "ngram");
    EXPECT_EQ(reader.header().executor.verify_width, params.verify_width);
    trace::TraceRecord rec;
    int64_t with_drafts = 0;
    while (reader.next(rec)) {
      if (const auto* out = std::get_if<trace::StepOutputRecord>(&rec)) {
        EXPECT_EQ(out->drafts.size(), out->result.accepted_lengths.size() * static_cast<size_t>(params.verify_width));
        with_drafts += out->drafts.empty() ? 0 : 1;
      }
    }
    EXPECT_GT(with_drafts, 0);
    const replay::ReplayReport r = replay::replay_trace(path, {.weights = &sim_weights()});
    EXPECT_FALSE(r.divergence) << r.divergence->describe();
    EXPECT_GT(r.steps_compared, 0);
    fs::remove(path);
  }
}

TEST(SpecTrace, ReplayRebuildingADifferentDrafterDivergesAtTheDrafts) {
  const sim::SimParams params = spec_seed(sim::SimDrafter::kNgram, 1);
  const fs::path path = temp_path("relabelled.trace");
  ASSERT_TRUE(record(params, path).passed());
  // The same records under a header that names no drafter: replay proposes other drafts.
  trace::TraceReader reader = trace::TraceReader::open(path);
  trace::TraceHeader header = reader.header();
  header.drafter = "none";
  const fs::path relabelled = temp_path("relabelled-none.trace");
  {
    auto recorder = trace::Recorder::open(relabelled, header);
    trace::TraceRecord rec;
    while (reader.next(rec)) {
      if (auto* in = std::get_if<trace::StepInputRecord>(&rec)) recorder->record_input(std::move(*in));
      else if (auto* out = std::get_if<trace::StepOutputRecord>(&rec)) recorder->record_output(std::move(*out));
    }
    recorder->close();
  }
  const replay::ReplayReport r = replay::replay_trace(relabelled, {.weights = &sim_weights()});
  ASSERT_TRUE(r.divergence);
  EXPECT_EQ(r.divergence->field, "drafts") << r.divergence->describe();
  fs::remove(path);
  fs::remove(relabelled);
}

TEST(SpecTrace, AnOracleMixTraceSaysReplayCannotRebuildItsDrafter) {
  const sim::SimParams params = spec_seed(sim::SimDrafter::kOracleMix, 1);
  const fs::path path = temp_path("oracle.trace");
  ASSERT_TRUE(record(params, path).passed());
  EXPECT_EQ(trace::TraceReader::open(path).header().drafter, params.drafter_name());
  try {
    replay::replay_trace(path, {.weights = &sim_weights()});
    FAIL() << "expected ls::Error";
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), HasSubstr("cannot be rebuilt"));
  }
  fs::remove(path);
}

}  // namespace
}  // namespace ls
