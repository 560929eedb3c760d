// Tensor parallelism on the CPU reference (issue 18): the Megatron layout and its refusals, TP N
// bit-identical run to run, TP N equal to TP 1 within the stated tolerance, the IDLE forward's
// collectives, a trace recorded at TP 2 replayed at TP 2 (exact) and TP 1 (teacher-forced), and
// the simulator at TP 2.
#include "core/check.h"
#include "core/cpu_backend.h"
#include "core/executor.h"
#include "core/model/weights.h"
#include "core/tensor_parallel.h"
#include "replay/replay.h"
#include "sim/sweep.h"
#include "sim/trace_recording.h"
#include "sim/world.h"
#include "tests/test_support.h"
#include "tests/tp_workload.h"
#include "trace/reader.h"
#include "trace/recorder.h"
#include "trace/trace_observer.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <string>
#include <unistd.h>

namespace ls {
namespace {

namespace fs = std::filesystem;
using testing::decode_row;
using testing::pages_from;
using testing::prefill_row;
using testing::prompt_for;

// TP N vs TP 1 (fp32, the o and down all-reduces re-associated): over each logits row,
// max |Δlogit| / max |logit| must stay below this, and every greedy token must agree.
constexpr double kTpRelativeTolerance = 1e-5;

// --- the layout -----------------------------------------------------------------------------

std::string refusal(const ModelConfig& model, int32_t degree) {
  try {
    make_tp_layout(model, degree);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(TpLayout, TinyAtTwoSplitsHeadsFfnAndVocabularyInHalves) {
  const TpLayout tp = make_tp_layout(model_config_named("tiny"), 2);  // 4 heads, 2 kv, ffn 128
  EXPECT_EQ(tp.query_heads(0), (ShardRange{0, 2}));
  EXPECT_EQ(tp.query_heads(1), (ShardRange{2, 2}));
  EXPECT_EQ(tp.kv_heads(0), (ShardRange{0, 1}));
  EXPECT_EQ(tp.kv_heads(1), (ShardRange{1, 1}));
  EXPECT_EQ(tp.ffn(1), (ShardRange{64, 64}));
  EXPECT_EQ(tp.vocab(1), (ShardRange{256, 256}));
}

TEST(TpLayout, AVocabularyTheDegreeDoesNotDivideLeavesTheLastShardShorter) {
  ModelConfig model = model_config_named("tiny");
  model.vocab_size = 511;
  const TpLayout tp = make_tp_layout(model, 2);
  EXPECT_EQ(tp.vocab(0), (ShardRange{0, 256}));
  EXPECT_EQ(tp.vocab(1), (ShardRange{256, 255}));
}

TEST(TpLayout, RefusesByNameADegreeTheModelCannotShard) {
  const ModelConfig tiny = model_config_named("tiny");  // 4 heads, 2 kv heads, ffn 128
  EXPECT_NE(refusal(tiny, 4).find("kv heads (num_key_value_heads) = 2"), std::string::npos)
      << refusal(tiny, 4);
  EXPECT_NE(refusal(tiny, 3).find("attention heads (num_attention_heads) = 4"), std::string::npos)
      << refusal(tiny, 3);
  ModelConfig odd_ffn = tiny;
  odd_ffn.ffn_size = 127;
  EXPECT_NE(refusal(odd_ffn, 2).find("ffn size (intermediate_size) = 127"), std::string::npos)
      << refusal(odd_ffn, 2);
  EXPECT_NE(refusal(tiny, 0).find("must be in [1, 8], got 0"), std::string::npos);
  EXPECT_NE(refusal(tiny, 9).find("must be in [1, 8], got 9"), std::string::npos);
  EXPECT_EQ(refusal(tiny, 2), "");
  EXPECT_THROW(CpuBackend(testing::tiny_weights(), testing::small_config(), nullptr, false, nullptr, 4),
               Error);
}

TEST(TpLayout, TheStubModelRefusesTensorParallelism) {
  try {
    CpuBackend backend(testing::tiny_weights(), testing::small_config(), nullptr,
                       /*stub_model=*/true, nullptr, 2);
    FAIL() << "the stub model accepted --tp 2";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("stub model"), std::string::npos) << e.what();
  }
}

// --- one rank's shard (what a CUDA rank uploads) ---------------------------------------------

TEST(TpRankShard, RankOneOfTinyAtTwoHoldsTheSecondHalfAndAShardOfTheModel) {
  const ModelConfig tiny = model_config_named("tiny");  // 4 heads, 2 kv, ffn 128, vocab 512
  const TpRankShard shard = make_rank_shard(tiny, 2, 1);
  EXPECT_EQ(shard.query_heads, (ShardRange{2, 2}));
  EXPECT_EQ(shard.kv_heads, (ShardRange{1, 1}));
  EXPECT_EQ(shard.ffn, (ShardRange{64, 64}));
  EXPECT_EQ(shard.vocab, (ShardRange{256, 256}));
  EXPECT_EQ(shard.vocab_rows, 256);
  const ModelConfig local = rank_model_config(tiny, shard);
  EXPECT_EQ(local.query_heads_count, 2);
  EXPECT_EQ(local.kv_heads_count, 1);
  EXPECT_EQ(local.ffn_size, 64);
  EXPECT_EQ(local.hidden_size, tiny.hidden_size);
  EXPECT_EQ(local.vocab_size, 512);
  EXPECT_EQ(local.head_dim, tiny.head_dim);
}

TEST(TpRankShard, TheLastRanksHeadShardIsPaddedToTheFirstRanksRows) {
  ModelConfig model = model_config_named("tiny");
  model.vocab_size = 511;
  const TpRankShard last = make_rank_shard(model, 2, 1);
  EXPECT_EQ(last.vocab, (ShardRange{256, 255}));
  EXPECT_EQ(last.vocab_rows, 256);
}

TEST(TpRankShard, RefusesARankOutsideTheGroup) {
  EXPECT_THROW(make_rank_shard(model_config_named("tiny"), 2, 2), Error);
  EXPECT_THROW(make_rank_shard(model_config_named("tiny"), 2, -1), Error);
}

TEST(TpRankShard, RowsAreAViewAndColumnsAreCopiedRowByRow) {
  // [3, 4]: element (r, c) = 10·r + c.
  const std::vector<float> tensor = {0, 1, 2, 3, 10, 11, 12, 13, 20, 21, 22, 23};
  const std::span<const float> rows = shard_rows(tensor, 4, ShardRange{1, 2});
  EXPECT_EQ(rows.data(), tensor.data() + 4);
  EXPECT_EQ(std::vector<float>(rows.begin(), rows.end()),
            (std::vector<float>{10, 11, 12, 13, 20, 21, 22, 23}));
  std::vector<float> storage;
  const std::span<const float> columns = shard_columns(tensor, 3, 4, ShardRange{2, 2}, storage);
  EXPECT_EQ(std::vector<float>(columns.begin(), columns.end()),
            (std::vector<float>{2, 3, 12, 13, 22, 23}));
  const std::span<const float> all = shard_columns(tensor, 3, 4, ShardRange{0, 4}, storage);
  EXPECT_EQ(all.data(), tensor.data());  // every column: the tensor itself, no copy
  EXPECT_EQ(head_elements(ShardRange{1, 2}, 8), (ShardRange{8, 16}));
}

TEST(CpuTpGroup, AllReduceAddsTheRanksInRankOrder) {
  CpuTpGroup group(3, 1);
  // Chosen so that the association shows: (1e8 + 1) + -1e8 = 0 in fp32, 1e8 + (1 + -1e8) = 0 too,
  // but (1e8 + -1e8) + 1 = 1: rank order gives 0, another order would give 1.
  const std::vector<float> partials = {1e8f, 1.0f, -1e8f};
  std::vector<float> out(1);
  group.all_reduce_sum(partials, out);
  EXPECT_EQ(out[0], (1e8f + 1.0f) + -1e8f);
  EXPECT_EQ(out[0], 0.0f);
}

// --- TP N vs TP 1 over a fixed workload ---------------------------------------------------------

using testing::bit_identical;
using testing::compare_tp_runs;
using testing::kTpWorkloadDecodeSteps;
using testing::TpWorkloadRun;

// tests/tp_workload.h's workload, greedy, on the CPU reference at `tp_degree`.
TpWorkloadRun run_workload(const ModelWeights& weights, int32_t tp_degree) {
  const ExecutorConfig config = testing::small_config();
  CpuBackend backend(weights, config, nullptr, false, nullptr, tp_degree);
  return testing::run_tp_workload(backend, config, weights.config.vocab_size, /*sampled=*/false);
}

void expect_tpn_within_tolerance_of_tp1(const ModelWeights& weights, int32_t degree,
                                        const std::string& label) {
  const TpWorkloadRun tp1 = run_workload(weights, 1);
  const TpWorkloadRun tp2 = run_workload(weights, degree);
  const TpWorkloadRun tp2_again = run_workload(weights, degree);
  EXPECT_TRUE(bit_identical(tp2, tp2_again)) << label << ": differs run to run";
  const testing::TpAgreement a = compare_tp_runs(tp1, tp2, weights.config.vocab_size);
  std::printf("%s vs TP 1: max relative logit difference %.3g (tolerance %.0e), %ld/%ld "
              "greedy tokens equal, %ld logits differ in their bits\n",
              label.c_str(), a.relative_max, kTpRelativeTolerance, static_cast<long>(a.tokens_equal),
              static_cast<long>(a.tokens_count), static_cast<long>(a.logits_differing));
  ASSERT_GT(a.norm, 0) << label;
  ASSERT_GE(a.tokens_count, 3 * kTpWorkloadDecodeSteps) << label;
  EXPECT_LE(a.relative_max, kTpRelativeTolerance) << label;
  EXPECT_EQ(a.tokens_equal, a.tokens_count) << label;
  // The all-reduce re-associates o and down: were TP N bit-identical to TP 1, it would not be
  // simulating the ranks at all.
  EXPECT_GT(a.logits_differing, 0) << label << ": computed exactly TP 1's bits";
}

TEST(TensorParallel, TinyAtTp2IsBitIdenticalRunToRunAndWithinToleranceOfTp1) {
  expect_tpn_within_tolerance_of_tp1(testing::tiny_weights(), 2, "tiny, TP 2");
}

TEST(TensorParallel, FourRanksOverAnMhaTinyAreBitIdenticalRunToRunAndWithinToleranceOfTp1) {
  // Four partials per all-reduce: unlike two (a + b = b + a), their order shows in the bits.
  ModelConfig mha = model_config_named("tiny");
  mha.kv_heads_count = mha.query_heads_count;
  const ModelWeights weights = weights_from_seed(mha, 7);
  expect_tpn_within_tolerance_of_tp1(weights, 4, "tiny (MHA), TP 4");
}

TEST(TensorParallel, HfQwen3FixtureAtTp2IsBitIdenticalRunToRunAndWithinToleranceOfTp1) {
  // Qwen3: per-head q/k norms, which must stay on the rank that owns the head.
  const ModelWeights weights = load_hf_directory(LOCKSTEP_SOURCE_DIR "/tests/fixtures/hf/qwen3");
  expect_tpn_within_tolerance_of_tp1(weights, 2, "hf qwen3, TP 2");
}

TEST(TensorParallel, HfQwen2FixtureAtTp2IsWithinToleranceOfTp1) {
  // Qwen2: q/k/v biases, split by the same columns as their weights.
  const ModelWeights weights = load_hf_directory(LOCKSTEP_SOURCE_DIR "/tests/fixtures/hf/qwen2");
  expect_tpn_within_tolerance_of_tp1(weights, 2, "hf qwen2, TP 2");
}

// --- the IDLE forward ------------------------------------------------------------------------

TEST(TensorParallel, AnIdleStepIssuesTheBusyStepsCollectivesWithNoRowsAndChangesNothing) {
  const ExecutorConfig config = testing::small_config();
  const int32_t layers = testing::tiny_weights().config.layers_count;
  auto prefill = [] {
    ForwardOp op;
    op.rows.push_back(prefill_row(5, 1, 0, 6, 6));
    op.rows[0].refresh = {0, pages_from(1, 8)};
    op.rows[0].sampling = SamplingParams{};
    op.prefill_token_ids = prompt_for(5, 6);
    return op;
  };
  ForwardOp decode;
  decode.rows.push_back(decode_row(5, 1));
  // Two executors over one workload; the second runs an IDLE step between prefill and decode.
  CpuBackend plain_backend(testing::tiny_weights(), config, nullptr, false, nullptr, 2);
  Executor plain(config, 512, plain_backend, {.capture_logits = true});
  CpuBackend idle_backend(testing::tiny_weights(), config, nullptr, false, nullptr, 2);
  Executor with_idle(config, 512, idle_backend, {.capture_logits = true});
  plain.step(prefill());
  with_idle.step(prefill());
  const std::vector<CollectiveCall> busy = idle_backend.collectives();
  const StepResult idle = with_idle.step(ForwardOp{});
  EXPECT_EQ(idle.mode, ForwardMode::kIdle);
  const std::vector<CollectiveCall> idle_calls = idle_backend.collectives();
  ASSERT_EQ(busy.size(), static_cast<size_t>(2 * layers + 1));
  ASSERT_EQ(idle_calls.size(), busy.size()) << "the ranks of a DP group would deadlock";
  for (size_t i = 0; i < busy.size(); ++i) {
    EXPECT_EQ(idle_calls[i].kind, busy[i].kind) << "call " << i;
    EXPECT_GT(busy[i].elements_count, 0) << "call " << i;
    EXPECT_EQ(idle_calls[i].elements_count, 0) << "call " << i;
  }
  EXPECT_EQ(busy.back().kind, CollectiveKind::kAllGather);
  const StepResult a = plain.step(decode);
  const StepResult b = with_idle.step(decode);
  ASSERT_EQ(a.logits.size(), b.logits.size());
  EXPECT_EQ(std::memcmp(a.logits.data(), b.logits.data(), a.logits.size() * sizeof(float)), 0)
      << "the IDLE step changed the state the next step reads";
  EXPECT_EQ(a.tokens, b.tokens);
}

// --- traces ----------------------------------------------------------------------------------

using testing::kSimWeightsSeed;
using testing::sim_weights;

fs::path temp_path(const std::string& name) {
  const fs::path dir = fs::temp_directory_path() / fmt::format("lockstep-tp-test-{}", ::getpid());
  fs::create_directories(dir);
  return dir / name;
}

// Records simulator seed `seed` at TP `tp_degree` to `path`.
sim::SimSummary record_seed(uint64_t seed, int32_t tp_degree, const fs::path& path) {
  const sim::SimParams params = sim::derive_params(seed, {.tp_degree = tp_degree});
  const WeightSource source{WeightSource::Kind::kSeed, kSimWeightsSeed, ""};
  trace::TraceHeader header =
      trace::make_trace_header(sim_weights(), source, sim::executor_config_for(params), "cpu");
  header.tp_degree = tp_degree;
  auto recorder = trace::Recorder::open(path, header);
  sim::SimTraceObserver observer(*recorder);
  sim::WorldOptions world{.observer = &observer,
                          .executor_options = trace::recording_executor_options()};
  const sim::SimSummary summary = sim::run_world(params, sim_weights(), world);
  recorder->close();
  return summary;
}

TEST(TensorParallelTrace, RecordedAtTp2ReplaysExactlyAtTp2AndTeacherForcedAtTp1) {
  const fs::path path = temp_path("tp2.trace");
  const sim::SimSummary recorded = record_seed(3, 2, path);
  ASSERT_TRUE(recorded.passed());
  ASSERT_GT(recorded.tokens_generated, 0);
  EXPECT_EQ(trace::TraceReader::open(path).header().tp_degree, 2);

  const replay::ReplayReport exact = replay::replay_trace(path, {});
  EXPECT_EQ(exact.tp_degree, 2);
  EXPECT_FALSE(exact.divergence.has_value())
      << "step " << exact.divergence->step << " field " << exact.divergence->field;
  EXPECT_GT(exact.steps_compared, 10);

  replay::ReplayOptions forced;
  forced.mode = replay::ReplayMode::kTeacherForced;
  forced.tp_degree = 1;
  const replay::ReplayReport tp1 = replay::replay_trace(path, forced);
  EXPECT_EQ(tp1.tp_degree, 1);
  std::printf("TP 2 trace teacher-forced at TP 1: %ld/%ld tokens equal, max |dlogit| %.3g\n",
              static_cast<long>(tp1.tokens_equal), static_cast<long>(tp1.tokens_count),
              tp1.logit_delta_max);
  ASSERT_GT(tp1.tokens_count, 0);
  EXPECT_EQ(tp1.tokens_equal, tp1.tokens_count);
  EXPECT_GT(tp1.logit_delta_max, 0.0f) << "TP 1 replayed TP 2's bits: the degree was not applied";
  EXPECT_LE(tp1.logit_delta_max, 1e-4f);
}

TEST(TensorParallelTrace, ExactReplayRefusesADegreeOtherThanTheRecordedOne) {
  const fs::path path = temp_path("tp2-refuse.trace");
  ASSERT_TRUE(record_seed(4, 2, path).passed());
  replay::ReplayOptions options;
  options.tp_degree = 1;
  try {
    replay::replay_trace(path, options);
    FAIL() << "exact replay at TP 1 of a TP 2 trace was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("exact replay refuses --tp 1"), std::string::npos)
        << e.what();
  }
}

// Recorded in format 3 by the build of e2f9ad6, before the NCCL header fields (the fuzzer's seed
// corpus of then: `lockstep generate --record` of examples/prompts.jsonl's first line).
constexpr const char* kFormat3Trace =
    LOCKSTEP_SOURCE_DIR "/tests/fixtures/trace/format3-tiny-run-1-request.trace";

TEST(TensorParallelTrace, ATraceFromBeforeTheFieldReadsAsTp1) {
  const trace::TraceReader reader = trace::TraceReader::open(kFormat3Trace);
  EXPECT_EQ(reader.header().format_version, 3u);
  EXPECT_EQ(reader.header().tp_degree, 1);
}

TEST(TensorParallelTrace, TheRecorderRefusesADegreeTheRecordedModelCannotShard) {
  trace::TraceHeader header = trace::make_trace_header(
      sim_weights(), WeightSource{WeightSource::Kind::kSeed, 0, ""}, testing::small_config(), "cpu");
  header.tp_degree = 4;  // tiny has 2 kv heads
  try {
    trace::Recorder::open(temp_path("tp4.trace"), header);
    FAIL() << "a TP 4 header for tiny was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("header: tp_degree"), std::string::npos) << e.what();
  }
}

TEST(TensorParallelTrace, TheNcclFieldsReadBackAndATraceFromBeforeThemHasNone) {
  const trace::TraceReader old = trace::TraceReader::open(kFormat3Trace);
  EXPECT_EQ(old.header().nccl_version, 0);
  EXPECT_EQ(old.header().nccl_algo, "");
  EXPECT_EQ(old.header().nccl_proto, "");
  trace::TraceHeader header = trace::make_trace_header(
      sim_weights(), WeightSource{WeightSource::Kind::kSeed, 0, ""}, testing::small_config(), "cuda");
  header.tp_degree = 2;
  header.nccl_version = 22703;
  header.nccl_algo = "Ring";
  header.nccl_proto = "Simple";
  const fs::path path = temp_path("tp2-nccl.trace");
  trace::Recorder::open(path, header)->close();
  const trace::TraceReader reader = trace::TraceReader::open(path);
  EXPECT_EQ(reader.header().nccl_version, 22703);
  EXPECT_EQ(reader.header().nccl_algo, "Ring");
  EXPECT_EQ(reader.header().nccl_proto, "Simple");
}

TEST(TensorParallelTrace, TheRecorderRefusesNcclFieldsAtTp1OrOnlySomeOfThem) {
  const auto refusal = [](int32_t degree, int32_t version, const std::string& algo) {
    trace::TraceHeader header = trace::make_trace_header(
        sim_weights(), WeightSource{WeightSource::Kind::kSeed, 0, ""}, testing::small_config(),
        "cuda");
    header.tp_degree = degree;
    header.nccl_version = version;
    header.nccl_algo = algo;
    header.nccl_proto = algo.empty() ? "" : "Simple";
    try {
      trace::Recorder::open(temp_path("tp-nccl-refused.trace"), header)->close();
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  EXPECT_NE(refusal(1, 22703, "Ring").find("header: nccl_version 22703 is set at tp_degree 1"),
            std::string::npos) << refusal(1, 22703, "Ring");
  EXPECT_NE(refusal(2, 22703, "").find("all three are set or none"), std::string::npos)
      << refusal(2, 22703, "");
  EXPECT_NE(refusal(2, 0, "Ring").find("all three are set or none"), std::string::npos);
  EXPECT_EQ(refusal(2, 22703, "Ring"), "");
  EXPECT_EQ(refusal(2, 0, ""), "");  // the CPU reference's TP 2: no library ran collectives
}

// --- the simulator ---------------------------------------------------------------------------

TEST(TensorParallelSim, SeedsAtTp2PassEveryCheckerAndTheirTwinRuns) {
  for (const bool speculative : {false, true}) {
    for (uint64_t seed = 1; seed <= 4; ++seed) {
      const sim::SimParams params =
          sim::derive_params(seed, {.speculative = speculative, .tp_degree = 2});
      ASSERT_EQ(params.tp_degree, 2);
      const sim::SeedVerdict v = sim::run_seed(params, sim_weights(), {}, /*twin=*/true);
      EXPECT_TRUE(v.summary.passed()) << sim::reproduce_command(params, {.tp_degree = 2}) << ": "
                                      << (v.summary.failures.empty() ? "" : v.summary.failures[0].detail);
      EXPECT_TRUE(v.twin_checked && v.twin_ok()) << "seed " << seed << " differs run to run at TP 2";
      EXPECT_GT(v.summary.tokens_generated, 0);
    }
  }
}

TEST(TensorParallelSim, TheReproduceCommandNamesTheDegree) {
  const sim::SimParams params = sim::derive_params(5, {.tp_degree = 2});
  EXPECT_NE(sim::reproduce_command(params, {.tp_degree = 2}).find("--tp 2"), std::string::npos);
  EXPECT_NE(params.describe().find("TP 2"), std::string::npos);
  // The degree is an override drawn from nothing: the seed's other parameters are unchanged.
  sim::SimParams tp1 = sim::derive_params(5, {});
  tp1.tp_degree = 2;
  EXPECT_EQ(tp1.describe(), params.describe());
}

}  // namespace
}  // namespace ls
