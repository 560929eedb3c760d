// Round trips of every record kind through the recorder and the reader, compared field by field
// with values written here by hand, and the digest helpers against XXH3 called directly.
#include "core/logits_digest.h"
#include "core/ops/nan_guard.h"
#include "tests/trace/trace_test_support.h"
#include "trace/checks.h"
#include "trace/digests.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <xxhash.h>

#include <cmath>
#include <algorithm>
#include <limits>
#include <random>

namespace ls::trace {
namespace {

using ::testing::ElementsAre;
using testing::header_for;
using testing::TempPath;

ForwardOp mixed_op() {
  ForwardOp op;
  OpRow prefill = ls::testing::prefill_row(41, 3, 4, 5, 12);
  prefill.refresh = {1, {17, 18, 19}};
  prefill.sampling = SamplingParams{.temperature = 0.7f, .top_k = 40, .top_p = 0.95f,
                                    .min_p = 0.05f, .seed = 0xfeedfacecafebeefULL};
  OpRow first_chunk = ls::testing::prefill_row(42, 5, 0, 3, 3);
  first_chunk.sampling = SamplingParams{};  // greedy, no seed
  OpRow decode = ls::testing::decode_row(7, 1);
  decode.decode_override = 99;
  decode.hist_token_length = 33;
  op.rows = {prefill, first_chunk, decode};
  op.prefill_token_ids = {1, 2, 3, 4, 5, 506, 507, 511};
  return op;
}

StepOutputRecord mixed_output() {
  StepOutputRecord out;
  out.step = 0;
  out.result.mode = ForwardMode::kMixed;
  out.result.prefill_rows_count = 2;
  out.result.verify_width = 1;
  out.result.tokens = {10, 11, 12};
  out.result.accepted_lengths = {1, 1, 0};
  out.result.logprobs = {-0.5f, -1.25f, -3.0f};
  out.result.nan_flags = {0, 0, 1};
  out.result.oov_flags = {0, 1, 0};
  out.logits_digests = {0x1111, 0x2222, 0xffffffffffffffffULL};
  out.valid_cache_lengths = {9, 3, 33};
  out.future_input_digests = {0xa, 0xb, 0xc};
  out.top_logits_count = 8;
  for (int32_t i = 0; i < 24; ++i) out.top_logits.push_back({i * 3, 1.5f - 0.25f * static_cast<float>(i)});
  return out;
}

TEST(TraceRoundTrip, HeaderInputOutputEventsAndFooterReadBackFieldByField) {
  TempPath file("roundtrip");
  TraceHeader header = header_for(ls::testing::small_config(), {.capture_logits = true,
                                                                .want_logprobs = true});
  header.weights = WeightSource{.kind = WeightSource::Kind::kDirectory, .directory = "/models/x"};
  header.machine = MachineInfo{.cpu_name = "cpu", .gpu_name = "H200", .sm_count = 132,
                               .driver_version = "580.1", .cuda_version = "13.0",
                               .cublas_version = "13.1.0"};
  const TraceEvent arrive{.kind = EventKind::kArrive, .request_id = 41, .step = 0};
  const TraceEvent retract{.kind = EventKind::kRetract, .request_id = 7, .step = 1,
                           .detail = "pages exhausted", .hist_token_length = 33};
  {
    auto recorder = Recorder::open(file.path(), header);
    recorder->record_event(arrive);
    recorder->record_input(0, mixed_op());
    recorder->record_output(mixed_output());
    recorder->record_event(retract);
    recorder->close();
  }
  TraceReader reader = TraceReader::open(file.path());
  const TraceHeader& h = reader.header();
  EXPECT_EQ(h.format_version, kFormatVersion);
  EXPECT_EQ(kFormatVersion, 5u);
  EXPECT_EQ(h.build_id, "lockstep-test 0.1.0");
  EXPECT_EQ(h.model.name, "tiny");
  EXPECT_EQ(h.model.hidden_size, 64);
  EXPECT_EQ(h.model.layers_count, 2);
  EXPECT_EQ(h.model.query_heads_count, 4);
  EXPECT_EQ(h.model.kv_heads_count, 2);
  EXPECT_EQ(h.model.head_dim, 16);
  EXPECT_EQ(h.model.ffn_size, 128);
  EXPECT_EQ(h.model.vocab_size, 512);
  EXPECT_EQ(h.model.rope_theta, 10000.0f);
  EXPECT_EQ(h.model.rms_eps, 1e-5f);
  EXPECT_FALSE(h.model.tied_embeddings);
  EXPECT_EQ(h.weights.kind, WeightSource::Kind::kDirectory);
  EXPECT_EQ(h.weights.directory, "/models/x");
  EXPECT_EQ(h.weights_digest, ls::testing::tiny_weights().digest());
  EXPECT_EQ(h.weights_digest_form, WeightsDigestForm::kBlocks);
  EXPECT_EQ(h.executor.max_batch_rows, 8);
  EXPECT_EQ(h.executor.context_length, 64);
  EXPECT_EQ(h.executor.page_size, 4);
  EXPECT_EQ(h.executor.pages_count, 200);
  EXPECT_EQ(h.executor.verify_width, 1);
  EXPECT_EQ(h.executor.prefill_chunk_tokens, 64);
  EXPECT_TRUE(h.executor_options.record);  // the header's captureLogits: digests recorded
  EXPECT_FALSE(h.executor_options.capture_logits);
  EXPECT_EQ(h.executor_options.top_logits_count, 8);
  EXPECT_TRUE(h.executor_options.want_logprobs);
  EXPECT_EQ(h.top_logits_count, 8);
  EXPECT_EQ(h.backend, "cpu");
  EXPECT_EQ(h.determinism_mode, "batch-invariant");
  EXPECT_EQ(h.machine, header.machine);
  EXPECT_EQ(h.index_stride, 2);

  TraceRecord record;
  ASSERT_TRUE(reader.next(record));
  EXPECT_EQ(std::get<TraceEvent>(record), arrive);
  ASSERT_TRUE(reader.next(record));
  const StepInputRecord& in = std::get<StepInputRecord>(record);
  EXPECT_EQ(in.step, 0);
  const ForwardOp expected = mixed_op();
  ASSERT_EQ(in.op.rows.size(), 3u);
  for (size_t i = 0; i < 3; ++i) {
    const OpRow& a = in.op.rows[i];
    const OpRow& b = expected.rows[i];
    EXPECT_EQ(a.kind, b.kind) << i;
    EXPECT_EQ(a.request_id, b.request_id) << i;
    EXPECT_EQ(a.pool_row, b.pool_row) << i;
    EXPECT_EQ(a.input_length, b.input_length) << i;
    EXPECT_EQ(a.prefix_length, b.prefix_length) << i;
    EXPECT_EQ(a.prompt_length, b.prompt_length) << i;
    EXPECT_EQ(a.decode_override, b.decode_override) << i;
    EXPECT_EQ(a.hist_token_length, b.hist_token_length) << i;
    EXPECT_EQ(a.refresh, b.refresh) << i;
    ASSERT_EQ(a.sampling.has_value(), b.sampling.has_value()) << i;
    if (a.sampling) {
      EXPECT_EQ(a.sampling->temperature, b.sampling->temperature) << i;
      EXPECT_EQ(a.sampling->top_k, b.sampling->top_k) << i;
      EXPECT_EQ(a.sampling->top_p, b.sampling->top_p) << i;
      EXPECT_EQ(a.sampling->min_p, b.sampling->min_p) << i;
      EXPECT_EQ(a.sampling->seed, b.sampling->seed) << i;
    }
  }
  EXPECT_FALSE(in.op.rows[2].sampling.has_value());
  EXPECT_EQ(in.op.rows[0].sampling->seed, std::optional<uint64_t>(0xfeedfacecafebeefULL));
  EXPECT_FALSE(in.op.rows[1].sampling->seed.has_value());
  EXPECT_THAT(in.op.prefill_token_ids, ElementsAre(1, 2, 3, 4, 5, 506, 507, 511));

  ASSERT_TRUE(reader.next(record));
  const StepOutputRecord& out = std::get<StepOutputRecord>(record);
  EXPECT_EQ(out.step, 0);
  EXPECT_EQ(out.result.mode, ForwardMode::kMixed);
  EXPECT_EQ(out.result.prefill_rows_count, 2);
  EXPECT_EQ(out.result.verify_width, 1);
  EXPECT_THAT(out.result.tokens, ElementsAre(10, 11, 12));
  EXPECT_THAT(out.result.accepted_lengths, ElementsAre(1, 1, 0));
  EXPECT_THAT(out.result.logprobs, ElementsAre(-0.5f, -1.25f, -3.0f));
  EXPECT_THAT(out.result.nan_flags, ElementsAre(0, 0, 1));
  EXPECT_THAT(out.result.oov_flags, ElementsAre(0, 1, 0));
  EXPECT_TRUE(out.result.logits.empty());
  EXPECT_THAT(out.logits_digests, ElementsAre(0x1111u, 0x2222u, 0xffffffffffffffffULL));
  EXPECT_THAT(out.valid_cache_lengths, ElementsAre(9, 3, 33));
  EXPECT_THAT(out.future_input_digests, ElementsAre(0xau, 0xbu, 0xcu));
  EXPECT_EQ(out.top_logits_count, 8);
  ASSERT_EQ(out.top_logits.size(), 24u);
  EXPECT_EQ(out.top_logits[5], (TopLogit{15, 0.25f}));
  EXPECT_EQ(out, mixed_output());

  ASSERT_TRUE(reader.next(record));
  EXPECT_EQ(std::get<TraceEvent>(record), retract);
  ASSERT_TRUE(reader.next(record));
  const TraceFooter& footer = std::get<TraceFooter>(record);
  EXPECT_EQ(footer.steps_count, 1);
  EXPECT_EQ(footer.outputs_count, 1);
  EXPECT_EQ(footer.events_count, 2);
  EXPECT_EQ(footer.index_stride, 2);
  ASSERT_EQ(footer.step_offsets.size(), 1u);
  EXPECT_GT(footer.step_offsets[0], 0u);
  EXPECT_FALSE(reader.next(record));
  EXPECT_TRUE(reader.at_end());
  EXPECT_FALSE(reader.truncation().has_value());
  EXPECT_EQ(reader.complete_steps(), 1);
  EXPECT_EQ(reader.records_read(), 6);
  EXPECT_EQ(reader.offset(), reader.file_bytes());
}

// Issue 11: the family, every RoPE parameter and the feature flags come back from the header, so
// replay rebuilds the same model (weights_from_seed of a Qwen shape needs them all).
TEST(TraceRoundTrip, HeaderKeepsTheFamilyAndEveryRopeParameter) {
  TempPath file("family");
  TraceHeader header = header_for(ls::testing::small_config(), {});
  header.model = model_config_named("qwen2.5-7b");
  header.model.name = "qwen-like";
  header.model.rope_type = RopeType::kLlama3;
  header.model.rope_factor = 8.0f;
  header.model.rope_low_freq_factor = 1.5f;
  header.model.rope_high_freq_factor = 3.5f;
  header.model.rope_original_max_positions = 4096;
  header.model.qk_norm = true;
  header.model.max_positions = 32768;
  header.model.sliding_window = 4096;
  header.model.partial_rotary_dim = 64;
  Recorder::open(file.path(), header)->close();
  const ModelConfig& m = TraceReader::open(file.path()).header().model;
  EXPECT_EQ(m.family, ModelFamily::kQwen2);
  EXPECT_EQ(m.partial_rotary_dim, 64);
  EXPECT_EQ(m.rotary_dim(), 64);
  EXPECT_EQ(m.rope(), header.model.rope());
  EXPECT_EQ(m.rope_theta, 1e6f);
  EXPECT_TRUE(m.qkv_bias);
  EXPECT_TRUE(m.qk_norm);
  EXPECT_EQ(m.max_positions, 32768);
  EXPECT_EQ(m.sliding_window, 4096);
  EXPECT_EQ(m.head_dim, 128);
}

// Issue 19: a hybrid's layer table, its Mamba2 shape and the state pool's size in the header, and
// every row's recurrent-state slots and the cache ops' state slots in the step input, read back as
// written; the reader refuses a slot outside the pool, naming the row and the field.
TEST(TraceRoundTrip, HybridHeaderAndStateSlotsReadBack) {
  TempPath file("hybrid");
  ExecutorConfig config = ls::testing::small_config();
  config.mamba_slots_count = 6;
  config.host_pages_count = 4;
  TraceHeader header = header_for(config, {});
  ModelConfig& m = header.model;
  m.name = "bamba-like";
  m.family = ModelFamily::kBamba;
  m.layer_kinds = {LayerKind::kMamba2, LayerKind::kAttention};
  m.mamba = MambaConfig{.heads_count = 8, .head_dim = 16, .groups_count = 2, .state_size = 16,
                        .conv_kernel = 4, .conv_bias = false, .dt_min = 0.05f, .dt_max = 1.5f};
  ForwardOp op;
  op.rows.push_back(ls::testing::decode_row(7, 1));
  op.rows.push_back(ls::testing::decode_row(8, 2));
  op.rows[0].mamba_working = 0, op.rows[0].mamba_checkpoint_dst = 5;
  op.rows[1].mamba_working = 3, op.rows[1].mamba_cow_src = 4, op.rows[1].mamba_branching_seqlen = 9;
  op.rows[1].hist_token_length = 9, op.rows[1].decode_override = 2;
  // A swap out carrying slot 5's state with its pages, and one without a state (-1).
  const std::vector<CacheOp> cache_ops = {
      {.kind = CacheOpKind::kSwapOut, .device_pages = {9, 10}, .host_pages = {3, 1}, .state_slot = 5},
      {.kind = CacheOpKind::kSwapIn, .device_pages = {11}, .host_pages = {0}}};
  {
    auto recorder = Recorder::open(file.path(), header);
    recorder->record_input(0, op, cache_ops, StepFaults{});
    recorder->close();
  }
  TraceReader reader = TraceReader::open(file.path());
  const TraceHeader& h = reader.header();
  EXPECT_EQ(h.model.family, ModelFamily::kBamba);
  EXPECT_EQ(h.model.layer_kinds, m.layer_kinds);
  EXPECT_EQ(h.model.mamba, m.mamba);
  EXPECT_EQ(h.executor.mamba_slots_count, 6);
  TraceRecord record;
  ASSERT_TRUE(reader.next(record));
  EXPECT_EQ(std::get<StepInputRecord>(record).op, op);
  EXPECT_EQ(std::get<StepInputRecord>(record).cache_ops, cache_ops);
  EXPECT_EQ(std::get<StepInputRecord>(record).cache_ops[0].state_slot, 5);

  StepInputRecord bad{.step = 1, .op = op};
  bad.op.rows[1].mamba_cow_src = 6;
  EXPECT_THAT([&] { check_step_input(bad, h, /*full=*/false); },
              ::testing::ThrowsMessage<Error>(::testing::HasSubstr(
                  "rows[1].mamba_cow_src = 6 is outside [-1, mamba_slots_count = 6)")));
  bad.op.rows[1].mamba_cow_src = 4, bad.op.rows[0].mamba_working = -1;
  EXPECT_THAT([&] { check_step_input(bad, h, /*full=*/true); },
              ::testing::ThrowsMessage<Error>(::testing::HasSubstr(
                  "mamba_working_index is -1, but the model has Mamba layers")));
}

// A record's index checks point at the broken field as values too (what the Python writer names
// the seed's field from): a prefill id past the vocabulary, with its row and its index.
TEST(TraceChecks, AnIdPastTheVocabularyNamesItsRowAndIndex) {
  const TraceHeader h = header_for(ls::testing::small_config());
  StepInputRecord record{.step = 0};
  record.op.rows = {ls::testing::prefill_row(1, 1, 0, 2, 2),
                    ls::testing::prefill_row(2, 2, 0, 3, 3)};
  record.op.prefill_token_ids = {1, 2, 3, h.model.vocab_size, 5};
  try {
    check_step_input(record, h, /*full=*/false);
    ADD_FAILURE() << "accepted";
  } catch (const OpFieldError& e) {
    EXPECT_EQ(e.at().field, OpField::kPrefillTokenIds);
    EXPECT_EQ(e.at().row, 1);
    EXPECT_EQ(e.at().element, 3);
  }
}

// trace.capnp's "DIGESTS" definition of a logits row's digest, written out again from the text
// (64-bit sums truncated at the end), so that a change of either shows.
uint64_t spec_logits_digest(const std::vector<float>& row) {
  uint64_t a = 0, b = 0;
  for (uint32_t i = 0; i < row.size(); ++i) {
    uint32_t u = 0;
    std::memcpy(&u, &row[i], 4);
    const uint64_t p = static_cast<uint64_t>(u ^ (i * 0x9E3779B1u)) * 0x85EBCA6Bull;
    a += (p >> 32) ^ (p & 0xFFFFFFFFu);
    b += static_cast<uint32_t>((u ^ 0x7F4A7C15u) * (2u * i + 1u));
  }
  uint64_t k = ((a & 0xFFFFFFFFu) << 32 | (b & 0xFFFFFFFFu)) ^
               (static_cast<uint64_t>(row.size()) * 0x9E3779B97F4A7C15ull);
  k ^= k >> 33, k *= 0xFF51AFD7ED558CCDull, k ^= k >> 33, k *= 0xC4CEB9FE1A85EC53ull, k ^= k >> 33;
  return k;
}

// The header's determinism mode takes effect (replay rebuilds it; --isolate needs
// "batch-invariant"), so a value the format does not define is refused, not read as "no promise".
TEST(TraceRoundTrip, AnUnknownDeterminismModeIsRefused) {
  TraceHeader h = header_for(ls::testing::small_config());
  for (const char* mode : {"batch-invariant", "default", "foreign", ""}) {
    h.determinism_mode = mode;
    EXPECT_NO_THROW(check_header(h)) << mode;
  }
  h.determinism_mode = "invariant";
  EXPECT_THAT([&] { check_header(h); },
              ::testing::ThrowsMessage<Error>(::testing::HasSubstr(
                  "determinism_mode 'invariant' is not one of batch-invariant, default, foreign")));
}

TEST(TraceDigests, LogitsDigestIsTheFormatsDefinitionAndFuturesAreXxh3) {
  const std::vector<float> row = {0.5f, -2.0f, 3.25f};
  EXPECT_EQ(logits_row_digest(row), spec_logits_digest(row));
  // The value a separate implementation of the text gives (Python, integers: see the commit that
  // set format 3), so that a change to the definition's constants shows even if both C++ copies
  // change together.
  EXPECT_EQ(logits_row_digest(row), 0x6cc2c76cb8e3c36aull) << std::hex << logits_row_digest(row);
  EXPECT_NE(logits_row_digest(row), logits_row_digest(std::vector<float>{0.5f, -2.0f, 3.5f}));
  // Every single-bit flip of every value changes it; so do swapping two values and −0 for +0.
  std::vector<float> long_row(1000);
  for (size_t i = 0; i < long_row.size(); ++i) long_row[i] = std::sin(0.37f * static_cast<float>(i));
  const uint64_t base = logits_row_digest(long_row);
  EXPECT_EQ(base, spec_logits_digest(long_row));
  for (size_t i = 0; i < long_row.size(); i += 37) {
    for (int bit = 0; bit < 32; ++bit) {
      std::vector<float> flipped = long_row;
      uint32_t u = 0;
      std::memcpy(&u, &flipped[i], 4);
      u ^= 1u << bit;
      std::memcpy(&flipped[i], &u, 4);
      ASSERT_NE(logits_row_digest(flipped), base) << "value " << i << " bit " << bit;
    }
  }
  std::vector<float> swapped = long_row;
  std::swap(swapped[3], swapped[4]);
  EXPECT_NE(logits_row_digest(swapped), base);
  EXPECT_NE(logits_row_digest(std::vector<float>{0.0f}), logits_row_digest(std::vector<float>{-0.0f}));
  // Sign flips: of two values (a lane of products alone would cancel: 2 · 2^31 ≡ 0) and of all.
  std::vector<float> two_flipped = long_row;
  two_flipped[10] = -two_flipped[10];
  two_flipped[500] = -two_flipped[500];
  EXPECT_NE(logits_row_digest(two_flipped), base);
  std::vector<float> negated = long_row;
  for (float& x : negated) x = -x;
  EXPECT_NE(logits_row_digest(negated), base);
  const int32_t ids[] = {7, 0x01020304};
  const unsigned char id_bytes[] = {7, 0, 0, 0, 4, 3, 2, 1};
  EXPECT_EQ(future_inputs_digest(ids), XXH3_64bits(id_bytes, 8));
}

TEST(TraceDigests, TopLogitsRankByLogitThenIdWithNaNLast) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const float inf = std::numeric_limits<float>::infinity();
  const std::vector<float> row = {1.0f, 5.0f, 5.0f, nan, -inf, 3.0f, inf};
  std::vector<TopLogit> top;
  append_top_logits(row, 4, top);
  EXPECT_THAT(top, ElementsAre(TopLogit{6, inf}, TopLogit{1, 5.0f}, TopLogit{2, 5.0f},
                               TopLogit{5, 3.0f}));
  top.clear();
  append_top_logits(row, 8, top);  // more than the row holds: all 7, NaN last
  ASSERT_EQ(top.size(), 7u);
  EXPECT_EQ(top[5], (TopLogit{4, -inf}));
  EXPECT_EQ(top[6].id, 3);
  EXPECT_TRUE(std::isnan(top[6].logit));
}

TEST(TraceDigests, StepOutputDigestsEveryLogitsRowAndTouchedRow) {
  StepResult result;
  result.mode = ForwardMode::kMixed;
  result.prefill_rows_count = 1;
  result.verify_width = 1;
  result.tokens = {2, 0};
  result.accepted_lengths = {1, 1};
  result.nan_flags = {0, 0};
  result.oov_flags = {0, 0};
  result.logits = {0.0f, 1.0f, 3.0f, 2.0f,   // row 0: top-2 is (2, 3), (3, 2)
                   9.0f, 1.0f, 1.0f, -1.0f};  // row 1: top-2 is (0, 9), (1, 1)
  StateSnapshot touched;
  touched.pool_rows = {4, 2};
  touched.valid_cache_length = {6, 11};
  touched.future_inputs = {2, 0};
  const StepOutputRecord out = make_step_output(5, result, touched, 2);
  EXPECT_EQ(out.step, 5);
  EXPECT_TRUE(out.result.logits.empty());
  EXPECT_EQ(out.result.tokens, result.tokens);
  const float row0[] = {0.0f, 1.0f, 3.0f, 2.0f};
  const float row1[] = {9.0f, 1.0f, 1.0f, -1.0f};
  EXPECT_THAT(out.logits_digests,
              ElementsAre(spec_logits_digest({row0, row0 + 4}), spec_logits_digest({row1, row1 + 4})));
  EXPECT_THAT(out.valid_cache_lengths, ElementsAre(6, 11));
  const int32_t f0 = 2, f1 = 0;
  EXPECT_THAT(out.future_input_digests, ElementsAre(XXH3_64bits(&f0, 4), XXH3_64bits(&f1, 4)));
  EXPECT_EQ(out.top_logits_count, 2);
  EXPECT_THAT(out.top_logits, ElementsAre(TopLogit{2, 3.0f}, TopLogit{3, 2.0f},
                                          TopLogit{0, 9.0f}, TopLogit{1, 1.0f}));
  StepResult moved = result;
  EXPECT_EQ(make_step_output(5, std::move(moved), touched, 2), out);
}

}  // namespace
}  // namespace ls::trace

namespace ls::trace {
namespace {

// append_top_logits against a full sort by the format's order, on rows with many ties, ±0,
// ±inf and NaN, for every k.
// The digest's paths (AVX-512 where the CPU has it, and the portable loop) against the text's
// definition, over every length up to 300 (the vector loop and its scalar tail) and longer rows
// with special values and random bits.
TEST(TraceDigests, EveryDigestPathIsTheFormatsDefinition) {
  std::mt19937 rng(5);
  std::vector<float> row;
  for (size_t n = 0; n <= 300; ++n) {
    row.resize(n);
    for (float& x : row) {
      const uint32_t u = static_cast<uint32_t>(rng());
      std::memcpy(&x, &u, 4);
    }
    const uint64_t expected = spec_logits_digest(row);
    ASSERT_EQ(logits_row_digest(row), expected) << "length " << n;
    ASSERT_EQ(logits_row_digest_portable(row), expected) << "length " << n;
  }
  for (const size_t n : {4095, 4096, 128256, 151936}) {
    row.resize(n);
    for (float& x : row) x = std::normal_distribution<float>(0.0f, 3.0f)(rng);
    row[n / 3] = std::numeric_limits<float>::infinity();
    row[n / 2] = std::numeric_limits<float>::quiet_NaN();
    row[n - 1] = -0.0f;
    const uint64_t expected = spec_logits_digest(row);
    EXPECT_EQ(logits_row_digest(row), expected) << "length " << n;
    EXPECT_EQ(logits_row_digest_portable(row), expected) << "length " << n;
  }
}

// The guard's row pass and the recorded step's pass (both paths each) against rule 5 value by
// value, the digest's definition of the row it leaves and a full sort of that row: every length up
// to 300 (the vector loop and its masked tail) and rows over several chunks, rows of random bits
// (NaNs and infinities among them) and rows with ties, every k.
TEST(TraceDigests, EverySanitisePathIsTheGuardAndEveryRecordPathItsDigestAndTopK) {
  std::mt19937 rng(8);
  const float specials[] = {std::numeric_limits<float>::quiet_NaN(), -std::numeric_limits<float>::quiet_NaN(),
                            std::numeric_limits<float>::infinity(), -std::numeric_limits<float>::infinity(),
                            -0.0f, 1e30f, -1e30f, 0.0f};
  std::vector<size_t> lengths;
  for (size_t n = 0; n <= 300; ++n) lengths.push_back(n);
  for (const size_t n : {4095, 4096, 4097, 4096 + 130, 9000}) lengths.push_back(n);
  for (const size_t n : lengths) {
    std::vector<float> row(n);
    for (float& x : row) {
      const uint32_t u = static_cast<uint32_t>(rng());
      std::memcpy(&x, &u, 4);
      if (rng() % 8 == 0) x = specials[rng() % 8];
      if (n % 5 == 0) x = static_cast<float>(rng() % 7);  // many ties
    }
    if (n % 3 == 0) {  // some rows without a NaN
      for (float& x : row) x = std::isnan(x) ? 2.0f : x;
    }
    std::vector<float> expected = row;
    bool expected_nan = false;
    for (float& x : expected) {
      expected_nan |= std::isnan(x);
      x = ops::sanitised_logit(x);
    }
    std::vector<int32_t> order(n);
    for (size_t i = 0; i < n; ++i) order[i] = static_cast<int32_t>(i);
    std::stable_sort(order.begin(), order.end(),
                     [&](int32_t a, int32_t b) { return expected[a] > expected[b]; });
    for (const auto path : {sanitise_logits_row, sanitise_logits_row_portable}) {
      std::vector<float> got = row;
      ASSERT_EQ(path(got), expected_nan) << "length " << n;
      ASSERT_EQ(std::memcmp(got.data(), expected.data(), n * sizeof(float)), 0) << "length " << n;
    }
    for (const auto path : {sanitise_and_record_row, sanitise_and_record_row_portable}) {
      for (int32_t k = 0; k <= kTopLogitsCountMax; k += (n > 300 ? 4 : 1)) {
        std::vector<float> got = row;
        uint64_t digest = 0;
        std::vector<TopLogit> top;
        ASSERT_EQ(path(got, k, digest, top), expected_nan) << "length " << n;
        ASSERT_EQ(std::memcmp(got.data(), expected.data(), n * sizeof(float)), 0) << "length " << n;
        ASSERT_EQ(digest, spec_logits_digest(expected)) << "length " << n;
        ASSERT_EQ(top.size(), std::min<size_t>(static_cast<size_t>(k), n)) << "length " << n;
        for (size_t j = 0; j < top.size(); ++j) {
          ASSERT_EQ(top[j].id, order[j]) << "length " << n << " k " << k << " rank " << j
                                         << (path == sanitise_and_record_row ? "" : " (portable)");
          ASSERT_EQ(digest::bits_of(top[j].logit), digest::bits_of(expected[order[j]]));
        }
      }
    }
  }
}

TEST(TraceDigests, TopLogitsEqualAFullSortOnRowsWithTiesAndNaNs) {
  std::mt19937_64 rng(99);
  const float specials[] = {0.0f, -0.0f, 1.0f, -1.0f, std::numeric_limits<float>::infinity(),
                            -std::numeric_limits<float>::infinity(),
                            std::numeric_limits<float>::quiet_NaN(), 2.5f};
  for (int trial = 0; trial < 600; ++trial) {
    // Short rows take the plain scan; long ones (up to 2 chunks of 4096) the blocked path, with
    // ties at the k-th value and, in some rows, no NaN at all or a single one.
    const bool long_row = trial % 2 == 1;
    std::vector<float> row(long_row ? 100 + rng() % 9000 : 1 + rng() % 40);
    const int kinds = trial % 3 == 0 ? 6 : 8;  // 6: no NaN
    for (float& x : row) x = specials[rng() % static_cast<unsigned>(kinds)];
    if (long_row && trial % 5 == 0) {
      for (float& x : row) x = static_cast<float>(rng() % 1000) * 0.25f;
    }
    if (long_row && trial % 7 == 0) {  // logits as a model gives them: few reach the bound
      for (float& x : row) x = std::normal_distribution<float>(0.0f, 2.0f)(rng);
    }
    std::vector<int32_t> order(row.size());
    for (size_t i = 0; i < row.size(); ++i) order[i] = static_cast<int32_t>(i);
    std::sort(order.begin(), order.end(), [&](int32_t a, int32_t b) {
      const bool an = std::isnan(row[a]), bn = std::isnan(row[b]);
      if (an != bn) return bn;
      if (!an && row[a] != row[b]) return row[a] > row[b];
      return a < b;
    });
    for (int32_t k = 0; k <= kTopLogitsCountMax; ++k) {
      // Both paths: AVX-512 where the CPU has it, and the portable one.
      for (const auto path : {append_top_logits, append_top_logits_portable}) {
        std::vector<TopLogit> top;
        path(row, k, top);
        ASSERT_EQ(top.size(), std::min<size_t>(static_cast<size_t>(k), row.size()));
        for (size_t j = 0; j < top.size(); ++j) {
          ASSERT_EQ(top[j].id, order[j]) << "trial " << trial << " k " << k << " rank " << j
                                         << (path == append_top_logits ? "" : " (portable)");
        }
      }
    }
  }
}

}  // namespace
}  // namespace ls::trace
