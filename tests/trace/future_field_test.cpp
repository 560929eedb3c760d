// Schema evolution: a trace written with tests/trace/future_trace.capnp — the current layout plus
// new fields and a new record kind, each with a new ordinal — reads with the current reader.
#include "tests/trace/trace_test_support.h"
#include "trace/future_trace.capnp.h"

#include <capnp/message.h>
#include <capnp/serialize.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace ls::trace {
namespace {

namespace fs = future_schema;
using ::testing::ElementsAre;

class FutureWriter {
 public:
  template <typename Fill>
  void add(Fill fill) {
    capnp::MallocMessageBuilder message;
    fill(message.initRoot<fs::Record>());
    testing::append_framed(bytes, message);
  }
  std::vector<std::byte> bytes;
};

// A header of today's layout (tiny from seed 7) with a future field set.
void fill_header(fs::Header::Builder h) {
  const ExecutorConfig c = ls::testing::small_config();
  const ModelConfig& m = ls::testing::tiny_weights().config;
  h.setMagic(fs::TRACE_MAGIC);
  h.setFormatVersion(kFormatVersion);
  h.setBuildId("lockstep 9.9 (future)");
  auto model = h.initModel();
  model.setName("tiny");
  model.setHiddenSize(m.hidden_size);
  model.setLayersCount(m.layers_count);
  model.setQueryHeadsCount(m.query_heads_count);
  model.setKvHeadsCount(m.kv_heads_count);
  model.setHeadDim(m.head_dim);
  model.setFfnSize(m.ffn_size);
  model.setVocabSize(m.vocab_size);
  model.setRopeTheta(m.rope_theta);
  model.setRmsEps(m.rms_eps);
  h.initWeights().getSource().setSeed(7);
  auto e = h.initExecutor();
  e.setMaxBatchRows(c.max_batch_rows);
  e.setContextLength(c.context_length);
  e.setPageSize(c.page_size);
  e.setPagesCount(c.pages_count);
  e.setVerifyWidth(c.verify_width);
  e.setPrefillChunkTokens(c.prefill_chunk_tokens);
  h.setBackend("cuda");
  h.setIndexStride(1);
  h.setHostName("future-host");  // FUTURE field
}

TEST(FutureSchema, CurrentReaderReadsATraceWithNewFieldsAndSkipsNewRecordKinds) {
  FutureWriter w;
  w.add([&](fs::Record::Builder r) { fill_header(r.initHeader()); });
  w.add([&](fs::Record::Builder r) {
    auto in = r.initStepInput();
    in.setStep(0);
    auto row = in.initRows(1)[0];
    row.setKind(fs::RowKind::PREFILL);
    row.setRequestId(77);
    row.setPoolRow(2);
    row.setInputLength(3);
    row.setPromptLength(3);
    row.setDecodeOverride(-1);
    row.setHistTokenLength(-1);
    auto pages = row.initRefreshPages(2);
    pages.set(0, 10);
    pages.set(1, 11);
    row.getSampling().initParams().setTopK(-1);
    row.getSampling().getParams().setTopP(1.0f);
    row.setPriority(-5);  // FUTURE field inside a list element
    auto ids = in.initPrefillTokenIds(3);
    ids.set(0, 4);
    ids.set(1, 5);
    ids.set(2, 6);
    auto slots = in.initRecurrentSlots(1);  // FUTURE field
    slots.set(0, 3);
  });
  w.add([&](fs::Record::Builder r) {  // FUTURE record kind
    auto note = r.initFutureNote();
    note.setText("a record this reader does not know");
    note.setValue(42);
  });
  w.add([&](fs::Record::Builder r) {
    auto out = r.initStepOutput();
    out.setStep(0);
    out.setMode(fs::ForwardMode::EXTEND);
    out.setPrefillRowsCount(1);
    out.setVerifyWidth(1);
    out.initTokens(1).set(0, 300);
    out.initAcceptedLengths(1).set(0, 1);
    out.initNanFlags(1).set(0, 0);
    out.initOovFlags(1).set(0, 0);
  });

  TraceReader reader = TraceReader::from_bytes(w.bytes);
  EXPECT_EQ(reader.header().build_id, "lockstep 9.9 (future)");
  EXPECT_EQ(reader.header().backend, "cuda");
  TraceRecord record;
  ASSERT_TRUE(reader.next(record));
  const StepInputRecord& in = std::get<StepInputRecord>(record);
  ASSERT_EQ(in.op.rows.size(), 1u);
  EXPECT_EQ(in.op.rows[0].request_id, 77u);
  EXPECT_EQ(in.op.rows[0].pool_row, 2);
  EXPECT_EQ(in.op.rows[0].input_length, 3);
  EXPECT_THAT(in.op.rows[0].refresh.pages, ElementsAre(10, 11));
  ASSERT_TRUE(in.op.rows[0].sampling.has_value());
  EXPECT_EQ(in.op.rows[0].sampling->top_k, -1);
  EXPECT_THAT(in.op.prefill_token_ids, ElementsAre(4, 5, 6));
  ASSERT_TRUE(reader.next(record));  // the future record is skipped
  const StepOutputRecord& out = std::get<StepOutputRecord>(record);
  EXPECT_THAT(out.result.tokens, ElementsAre(300));
  EXPECT_FALSE(reader.next(record));
  EXPECT_EQ(reader.unknown_records_skipped(), 1);
  EXPECT_EQ(reader.complete_steps(), 1);
  // Written without a footer: reported as such.
  ASSERT_TRUE(reader.truncation().has_value());
  EXPECT_EQ(reader.truncation()->trailing_bytes, 0u);
}

// A value of an enum this reader does not know is not skipped like a field: the weights digest's
// form decides how replay checks the weights, so a form of the future is refused by name.
TEST(FutureSchema, AWeightsDigestFormOfTheFutureIsRefusedByName) {
  FutureWriter w;
  w.add([&](fs::Record::Builder r) {
    fill_header(r.initHeader());
    r.getHeader().getWeights().setDigestForm(fs::WeightsDigestForm::FROM_THE_FUTURE);
  });
  try {
    TraceReader::from_bytes(w.bytes);
    FAIL() << "a digest form of the future was read";
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), ::testing::HasSubstr(
                              "weights.digestForm 2 is not a digest form this build knows"));
  }
}

}  // namespace
}  // namespace ls::trace
