#include "core/prompts.h"

#include "core/check.h"
#include "core/model/strict_json.h"

#include <nlohmann/json.hpp>

#include <cmath>
#include <limits>
#include <set>

namespace ls {

namespace {

using nlohmann::json;

const std::set<std::string>& known_fields() {
  static const std::set<std::string> fields = {"id",    "prompt", "max_new_tokens", "temperature",
                                               "top_k", "top_p",  "min_p",          "seed",
                                               "stop"};
  return fields;
}

std::string pointer_to(std::string_view key) { return fmt::format("/{}", key); }

// A float field: a number whose value fits a float (checked as a double, before narrowing).
float float_field(const JsonDocument& line, const char* key, const std::string& where) {
  const json& value = line.value.at(key);
  LS_REQUIRE(value.is_number(), "{}: field '{}' must be a number, got {}", where, key,
             value.type_name());
  const double number = value.get<double>();
  LS_REQUIRE(std::isfinite(number) && std::abs(number) <= std::numeric_limits<float>::max(),
             "{}: field '{}' = {} is outside the range of a float", where, key,
             line.as_written(pointer_to(key)));
  return static_cast<float>(number);
}

// An int32 field in [min, max], checked in 64 bits before it is narrowed.
int32_t int32_field(const JsonDocument& line, const char* key, int32_t min, int32_t max,
                    const std::string& where) {
  return static_cast<int32_t>(json_integer_in(line, pointer_to(key), min, max, where, key));
}

std::vector<int32_t> token_list(const JsonDocument& line, const char* key, const std::string& where,
                                int32_t vocab_size) {
  const json& list = line.value.at(key);
  LS_REQUIRE(list.is_array(), "{}: field '{}' must be an array of token ids", where, key);
  std::vector<int32_t> ids;
  for (size_t i = 0; i < list.size(); ++i) {
    ids.push_back(static_cast<int32_t>(json_integer_in(line, fmt::format("/{}/{}", key, i), 0,
                                                       vocab_size - 1, where,
                                                       fmt::format("{}[{}]", key, i))));
  }
  return ids;
}

RequestSpec parse_line(const JsonDocument& line, const std::string& where, int64_t line_number,
                       int32_t vocab_size, int32_t context_length) {
  const json& object = line.value;
  LS_REQUIRE(object.is_object(), "{}: each line must be a JSON object", where);
  for (const auto& item : object.items()) {
    LS_REQUIRE(known_fields().count(item.key()), "{}: unknown field '{}'", where, item.key());
  }
  LS_REQUIRE(object.contains("prompt"), "{}: field 'prompt' is required", where);
  RequestSpec r;
  r.id = object.contains("id") ? json_uint64(line, "/id", where, "id")
                               : static_cast<RequestId>(line_number);
  r.prompt = token_list(line, "prompt", where, vocab_size);
  LS_REQUIRE(!r.prompt.empty(), "{}: field 'prompt' is empty", where);
  LS_REQUIRE(static_cast<int64_t>(r.prompt.size()) < context_length,
             "{}: prompt of {} tokens leaves no room to generate under context_length L = {}",
             where, r.prompt.size(), context_length);
  constexpr int32_t kInt32Max = std::numeric_limits<int32_t>::max();
  if (object.contains("max_new_tokens")) {
    r.max_new_tokens = int32_field(line, "max_new_tokens", 1, kInt32Max, where);
  }
  if (object.contains("temperature")) r.sampling.temperature = float_field(line, "temperature", where);
  // top_k's own range (-1 = off, or [1, kTopKMax]) is SamplingParams::validate()'s; here the
  // int32 range, before narrowing.
  if (object.contains("top_k")) {
    r.sampling.top_k = int32_field(line, "top_k", std::numeric_limits<int32_t>::min(), kInt32Max, where);
  }
  if (object.contains("top_p")) r.sampling.top_p = float_field(line, "top_p", where);
  if (object.contains("min_p")) r.sampling.min_p = float_field(line, "min_p", where);
  if (object.contains("seed")) r.sampling.seed = json_uint64(line, "/seed", where, "seed");
  if (object.contains("stop")) r.stop_ids = token_list(line, "stop", where, vocab_size);
  r.sampling.validate(where);
  return r;
}

}  // namespace

std::vector<RequestSpec> parse_prompts_jsonl(std::istream& in, const std::string& source,
                                                   int32_t vocab_size, int32_t context_length) {
  std::vector<RequestSpec> requests;
  std::set<RequestId> ids;
  std::string text;
  for (int64_t line_number = 1; std::getline(in, text); ++line_number) {
    if (text.find_first_not_of(" \t\r") == std::string::npos) continue;
    const std::string where = fmt::format("{}:{}", source, line_number);
    // Duplicate keys are refused and numbers keep their text for the errors (strict_json.h).
    const JsonDocument line = parse_json_document(text, where);
    RequestSpec r = parse_line(line, where, line_number, vocab_size, context_length);
    LS_REQUIRE(ids.insert(r.id).second, "{}: request id {} was already used", where, r.id);
    requests.push_back(std::move(r));
  }
  LS_REQUIRE(!requests.empty(), "{}: no requests (the file is empty)", source);
  return requests;
}

}  // namespace ls
