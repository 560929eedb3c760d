// Forward-op validation: one test per rejected field, each checking the error names the field,
// the row and the limit.
#include "core/check.h"
#include "core/forward_op.h"
#include "tests/test_support.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace ls {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;
using testing::decode_row;
using testing::prefill_row;
using testing::small_config;

constexpr int32_t kVocab = 512;

// A valid MIXED op: one prefill row of 4 tokens, one decode row.
ForwardOp valid_op() {
  ForwardOp op;
  op.rows.push_back(prefill_row(10, 1, 0, 4, 4));
  op.rows[0].refresh = {0, {1, 2}};
  op.rows.push_back(decode_row(11, 2));
  op.prefill_token_ids = {1, 2, 3, 4};
  return op;
}

std::string error_of(const ForwardOp& op, ExecutorConfig config = small_config()) {
  try {
    validate_forward_op(op, config, kVocab);
  } catch (const Error& e) {
    return e.what();
  }
  return "<accepted>";
}

TEST(ForwardOpValidation, AcceptsAValidMixedOp) { EXPECT_EQ(error_of(valid_op()), "<accepted>"); }

TEST(ForwardOpValidation, ModesFollowFromCounts) {
  EXPECT_EQ(forward_mode_of(0, 0), ForwardMode::kIdle);
  EXPECT_EQ(forward_mode_of(3, 3), ForwardMode::kExtend);
  EXPECT_EQ(forward_mode_of(1, 3), ForwardMode::kMixed);
  EXPECT_EQ(forward_mode_of(0, 3), ForwardMode::kDecode);
  EXPECT_EQ(valid_op().mode(), ForwardMode::kMixed);
}

TEST(ForwardOpValidation, RejectsUnknownPoolRow) {
  ForwardOp op = valid_op();
  op.rows[1].pool_row = 9;  // rows are 1..8
  EXPECT_THAT(error_of(op), AllOf(HasSubstr("row 1"), HasSubstr("pool_row 9"),
                                  HasSubstr("max_batch_rows = 8")));
  op.rows[1].pool_row = 0;  // row 0 is reserved
  EXPECT_THAT(error_of(op), HasSubstr("pool_row 0 is unknown"));
}

TEST(ForwardOpValidation, RejectsPoolRowUsedTwice) {
  ForwardOp op = valid_op();
  op.rows[1].pool_row = 1;
  EXPECT_THAT(error_of(op), AllOf(HasSubstr("row 1"), HasSubstr("pool_row 1 is used")));
}

TEST(ForwardOpValidation, RejectsPageOutOfRange) {
  ForwardOp op = valid_op();
  op.rows[0].refresh.pages[1] = 200;  // pages_count = 200
  EXPECT_THAT(error_of(op), AllOf(HasSubstr("row 0"), HasSubstr("refresh.pages[1] = 200"),
                                  HasSubstr("pages_count = 200")));
  op.rows[0].refresh.pages[1] = 0;
  EXPECT_THAT(error_of(op), HasSubstr("dummy page"));
}

TEST(ForwardOpValidation, RejectsNegativeRefreshBegin) {
  ForwardOp op = valid_op();
  op.rows[0].refresh.begin = -1;
  EXPECT_THAT(error_of(op), AllOf(HasSubstr("row 0"), HasSubstr("refresh.begin")));
}

TEST(ForwardOpValidation, RejectsPrefixPlusInputPastContext) {
  ForwardOp op = valid_op();
  op.rows[0].prefix_length = 61;  // 61 + 4 = 65 > L = 64
  op.rows[0].prompt_length = 65;
  EXPECT_THAT(error_of(op), AllOf(HasSubstr("row 0"), HasSubstr("= 65"),
                                  HasSubstr("context_length L = 64")));
}

TEST(ForwardOpValidation, RejectsPrefillRowAfterDecodeRow) {
  ForwardOp op = valid_op();
  std::swap(op.rows[0], op.rows[1]);
  EXPECT_THAT(error_of(op), AllOf(HasSubstr("row 1"), HasSubstr("prefill rows must come first")));
}

TEST(ForwardOpValidation, RejectsLengthsThatDoNotSum) {
  ForwardOp op = valid_op();
  op.prefill_token_ids.push_back(5);
  EXPECT_THAT(error_of(op), AllOf(HasSubstr("prefill_token_ids holds 5"), HasSubstr("sum to 4")));
}

TEST(ForwardOpValidation, RejectsTokenIdOutsideVocabulary) {
  ForwardOp op = valid_op();
  op.prefill_token_ids[2] = kVocab;
  EXPECT_THAT(error_of(op), AllOf(HasSubstr("row 0"), HasSubstr("token id 512"),
                                  HasSubstr("vocab_size = 512")));
  op.prefill_token_ids[2] = -3;
  EXPECT_THAT(error_of(op), HasSubstr("token id -3"));
}

TEST(ForwardOpValidation, RejectsDecodeOverrideOutsideVocabulary) {
  ForwardOp op = valid_op();
  op.rows[1].decode_override = kVocab + 1;
  EXPECT_THAT(error_of(op), AllOf(HasSubstr("row 1"), HasSubstr("decode_override 513")));
}

TEST(ForwardOpValidation, RejectsDecodeInputLengthOtherThanVerifyWidth) {
  ForwardOp op = valid_op();
  op.rows[1].input_length = 2;
  EXPECT_THAT(error_of(op), AllOf(HasSubstr("row 1"), HasSubstr("verify width W = 1")));
}

TEST(ForwardOpValidation, RejectsTooManyRows) {
  ForwardOp op;
  for (int32_t i = 0; i < 9; ++i) op.rows.push_back(decode_row(100 + i, 1 + i % 8));
  EXPECT_THAT(error_of(op), AllOf(HasSubstr("9 rows"), HasSubstr("max_batch_rows B = 8")));
}

TEST(ForwardOpValidation, RejectsPrefillTokensOverChunkBudget) {
  ExecutorConfig config = small_config();
  config.prefill_chunk_tokens = 3;
  EXPECT_THAT(error_of(valid_op(), config),
              AllOf(HasSubstr("input_length 4"), HasSubstr("prefill_chunk_tokens = 3")));
}

TEST(ForwardOpValidation, RejectsEmptyPrefillChunk) {
  ForwardOp op = valid_op();
  op.rows[0].input_length = 0;
  op.prefill_token_ids.clear();
  EXPECT_THAT(error_of(op), AllOf(HasSubstr("row 0"), HasSubstr("input_length must be >= 1")));
}

TEST(ForwardOpValidation, RejectsPromptShorterThanChunkEnd) {
  ForwardOp op = valid_op();
  op.rows[0].prompt_length = 3;
  EXPECT_THAT(error_of(op), AllOf(HasSubstr("row 0"), HasSubstr("prompt_length 3")));
}

TEST(ForwardOpValidation, RejectsHistoryWithoutOverride) {
  ForwardOp op = valid_op();
  op.rows[1].hist_token_length = 5;
  EXPECT_THAT(error_of(op), AllOf(HasSubstr("row 1"), HasSubstr("needs a decode_override")));
  op.rows[1].decode_override = 3;
  op.rows[1].hist_token_length = 65;
  EXPECT_THAT(error_of(op), AllOf(HasSubstr("hist_token_length 65"),
                                  HasSubstr("context_length L = 64")));
}

TEST(ForwardOpValidation, RejectsDuplicateRequestId) {
  ForwardOp op = valid_op();
  op.rows[1].request_id = 10;
  EXPECT_THAT(error_of(op), AllOf(HasSubstr("row 1"), HasSubstr("request id 10 appears")));
}

TEST(ForwardOpValidation, RejectsBadSamplingParameters) {
  ForwardOp op = valid_op();
  op.rows[0].sampling = SamplingParams{.temperature = 1.0f, .top_p = 0.0f};
  EXPECT_THAT(error_of(op), AllOf(HasSubstr("row 0"), HasSubstr("top_p")));
}

// The refusal carries its field, row and element as values (what the Python module names the
// seed's field from), the same as its message says in words.
OpFieldAt refused_at(const ForwardOp& op) {
  try {
    validate_forward_op(op, small_config(), kVocab);
  } catch (const OpFieldError& e) {
    return e.at();
  }
  ADD_FAILURE() << "the op was accepted";
  return OpFieldAt(OpField::kKind, -2);
}

TEST(ForwardOpValidation, ARefusalCarriesItsFieldRowAndElement) {
  ForwardOp op = valid_op();
  op.rows[0].refresh.pages[1] = 999;
  OpFieldAt at = refused_at(op);
  EXPECT_EQ(at.field, OpField::kRefreshPages);
  EXPECT_EQ(at.row, 0);
  EXPECT_EQ(at.element, 1);

  op = valid_op();
  op.prefill_token_ids[2] = kVocab;
  at = refused_at(op);
  EXPECT_EQ(at.field, OpField::kPrefillTokenIds);
  EXPECT_EQ(at.row, 0);
  EXPECT_EQ(at.element, 2);

  op = valid_op();
  op.rows[1].sampling = SamplingParams{.temperature = 1.0f, .min_p = 2.0f};
  at = refused_at(op);
  EXPECT_EQ(at.field, OpField::kSampling);
  EXPECT_EQ(at.row, 1);
  EXPECT_EQ(at.part, "min_p");

  op = valid_op();
  op.rows[1].hist_token_length = 5;  // a recovered row without its last token
  at = refused_at(op);
  EXPECT_EQ(at.field, OpField::kHistTokenLength);
  EXPECT_EQ(at.row, 1);

  op = valid_op();
  op.rows[1].prompt_length = 3;  // on a decode row
  EXPECT_EQ(refused_at(op).field, OpField::kPromptLength);
  op.rows[1].prefix_length = 2;
  EXPECT_EQ(refused_at(op).field, OpField::kPrefixLength);

  op = valid_op();
  op.rows.push_back(decode_row(12, 2));  // pool row 2 again
  at = refused_at(op);
  EXPECT_EQ(at.field, OpField::kPoolRow);
  EXPECT_EQ(at.row, 2);
}

}  // namespace
}  // namespace ls
