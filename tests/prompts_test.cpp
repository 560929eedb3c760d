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
              AllOf(HasSubstr("p.jsonl:2"), HasSubstr("field 'prompt[1]' must be an integer in [0, 511], got 600")));
  EXPECT_THAT(error_of("{\"prompt\": [1]\n"), AllOf(HasSubstr("p.jsonl:1"), HasSubstr("not valid JSON")));
  EXPECT_THAT(error_of("{\"promt\": [1]}"), HasSubstr("unknown field 'promt'"));
  EXPECT_THAT(error_of("{\"id\": 3}"), HasSubstr("'prompt' is required"));
  EXPECT_THAT(error_of("{\"prompt\": \"hello\"}"), HasSubstr("array of token ids"));
  EXPECT_THAT(error_of("{\"prompt\": [1], \"top_p\": 2}"), AllOf(HasSubstr("p.jsonl:1"), HasSubstr("top_p")));
  EXPECT_THAT(error_of("{\"prompt\": [1], \"max_new_tokens\": 0}"), HasSubstr("max_new_tokens"));
  EXPECT_THAT(error_of("{\"prompt\": [1], \"temperature\": \"hot\"}"), HasSubstr("field 'temperature' must be a number, got string"));
  EXPECT_THAT(error_of("{\"id\": 1, \"prompt\": [1]}\n{\"id\": 1, \"prompt\": [2]}"),
              AllOf(HasSubstr("p.jsonl:2"), HasSubstr("already used")));
  EXPECT_THAT(error_of(""), HasSubstr("no requests"));
  std::string long_prompt = "{\"prompt\": [";
  for (int i = 0; i < 64; ++i) long_prompt += (i ? ",1" : "1");
  EXPECT_THAT(error_of(long_prompt + "]}"), HasSubstr("context_length L = 64"));
}

// Every number is range-checked in its own 64-bit (or double) type before it is narrowed, and the
// error quotes it as written: no wrap (4294967300 -> 4), no truncation (4.5 -> 4), no reformat.
TEST(Prompts, RefusesNumbersThatANarrowingWouldChange) {
  const auto refuses = [](const std::string& field_and_value, const std::string& expected) {
    EXPECT_THAT(error_of("{\"prompt\": [1], " + field_and_value + "}"),
                AllOf(HasSubstr("p.jsonl:1"), HasSubstr(expected)))
        << field_and_value;
  };
  refuses("\"max_new_tokens\": 4294967300",
          "field 'max_new_tokens' must be an integer in [1, 2147483647], got 4294967300");
  refuses("\"max_new_tokens\": 4.5", "field 'max_new_tokens' must be an integer in [1, 2147483647], got 4.5");
  refuses("\"max_new_tokens\": 1e12", "field 'max_new_tokens' must be an integer in [1, 2147483647], got 1e12");
  refuses("\"top_k\": 4294967299", "field 'top_k' must be an integer in [-2147483648, 2147483647], got 4294967299");
  refuses("\"id\": -5", "field 'id' must be an integer in [0, 18446744073709551615], got -5");
  refuses("\"id\": 1.5", "field 'id' must be an integer in [0, 18446744073709551615], got 1.5");
  refuses("\"seed\": 18446744073709551616",
          "field 'seed' must be an integer in [0, 18446744073709551615], got 18446744073709551616");
  refuses("\"seed\": -1", "field 'seed' must be an integer in [0, 18446744073709551615], got -1");
  refuses("\"temperature\": 1e39", "field 'temperature' = 1e39 is outside the range of a float");
  refuses("\"stop\": [2.0]", "field 'stop[0]' must be an integer in [0, 511], got 2.0");
  // The largest values each type holds are accepted as they are.
  const auto r = parse("{\"id\": 18446744073709551615, \"prompt\": [1], \"seed\": 18446744073709551615, "
                       "\"max_new_tokens\": 2147483647}");
  EXPECT_EQ(r[0].id, 18446744073709551615u);
  EXPECT_EQ(r[0].sampling.seed, 18446744073709551615u);
  EXPECT_EQ(r[0].max_new_tokens, 2147483647);
}

TEST(Prompts, RefusesAKeyThatAppearsTwice) {
  EXPECT_THAT(error_of("{\"id\": 1, \"id\": 2, \"prompt\": [1]}"),
              AllOf(HasSubstr("p.jsonl:1"), HasSubstr("key 'id' appears twice")));
}

}  // namespace
}  // namespace ls
