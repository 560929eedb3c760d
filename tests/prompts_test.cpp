// The JSONL prompt reader: defaults, and errors that name the line and the field.
#include "core/check.h"
#include "core/prompts.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <sstream>

namespace ls {
namespace {

using ::testing::AllOf;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

std::vector<RequestSpec> parse(const std::string& text) {
  std::istringstream in(text);
  return parse_prompts_jsonl(in, "p.jsonl", 512, 64);
}

std::string error_of(const std::string& text) {
  try {
    parse(text);
  } catch (const Error& e) {
    return e.what();
  }
  return "<accepted>";
}

TEST(Prompts, ReadsFieldsAndDefaults) {
  const auto r = parse(
      "{\"prompt\": [1, 2, 3]}\n\n"
      "{\"id\": 9, \"prompt\": [4], \"max_new_tokens\": 5, \"temperature\": 0.5, \"top_k\": 3, "
      "\"seed\": 11, \"stop\": [2]}\n");
  ASSERT_EQ(r.size(), 2u);
  EXPECT_EQ(r[0].id, 1u);  // line number
  EXPECT_THAT(r[0].prompt, ElementsAre(1, 2, 3));
  EXPECT_EQ(r[0].max_new_tokens, 16);
  EXPECT_EQ(r[1].id, 9u);
  EXPECT_EQ(r[1].max_new_tokens, 5);
  EXPECT_FLOAT_EQ(r[1].sampling.temperature, 0.5f);
  EXPECT_EQ(r[1].sampling.top_k, 3);
  EXPECT_EQ(r[1].sampling.seed, 11u);
  EXPECT_THAT(r[1].stop_ids, ElementsAre(2));
}

TEST(Prompts, ErrorsNameTheLineAndTheField) {
  EXPECT_THAT(error_of("{\"prompt\": [1]}\n{\"prompt\": [1, 600]}"),
              AllOf(HasSubstr("p.jsonl:2"), HasSubstr("'prompt'[1] = 600")));
  EXPECT_THAT(error_of("{\"prompt\": [1]\n"), AllOf(HasSubstr("p.jsonl:1"), HasSubstr("not valid JSON")));
  EXPECT_THAT(error_of("{\"promt\": [1]}"), HasSubstr("unknown field 'promt'"));
  EXPECT_THAT(error_of("{\"id\": 3}"), HasSubstr("'prompt' is required"));
  EXPECT_THAT(error_of("{\"prompt\": \"hello\"}"), HasSubstr("array of token ids"));
  EXPECT_THAT(error_of("{\"prompt\": [1], \"top_p\": 2}"), AllOf(HasSubstr("p.jsonl:1"), HasSubstr("top_p")));
  EXPECT_THAT(error_of("{\"prompt\": [1], \"max_new_tokens\": 0}"), HasSubstr("max_new_tokens"));
  EXPECT_THAT(error_of("{\"prompt\": [1], \"temperature\": \"hot\"}"), HasSubstr("wrong type"));
  EXPECT_THAT(error_of("{\"id\": 1, \"prompt\": [1]}\n{\"id\": 1, \"prompt\": [2]}"),
              AllOf(HasSubstr("p.jsonl:2"), HasSubstr("already used")));
  EXPECT_THAT(error_of(""), HasSubstr("no requests"));
  std::string long_prompt = "{\"prompt\": [";
  for (int i = 0; i < 64; ++i) long_prompt += (i ? ",1" : "1");
  EXPECT_THAT(error_of(long_prompt + "]}"), HasSubstr("context_length L = 64"));
}

}  // namespace
}  // namespace ls
