#include "core/prompts.h"

#include "core/check.h"

#include <nlohmann/json.hpp>

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

template <typename T>
T field_as(const json& object, const char* key, const std::string& where) {
  try {
    return object.at(key).get<T>();
  } catch (const json::exception&) {
    throw Error(fmt::format("{}: field '{}' has the wrong type ({})", where, key,
                            object.at(key).type_name()));
  }
}

std::vector<int32_t> token_list(const json& object, const char* key, const std::string& where,
                                int32_t vocab_size) {
  const json& list = object.at(key);
  LS_REQUIRE(list.is_array(), "{}: field '{}' must be an array of token ids", where, key);
  std::vector<int32_t> ids;
  for (size_t i = 0; i < list.size(); ++i) {
    LS_REQUIRE(list[i].is_number_integer(), "{}: field '{}'[{}] is not an integer", where, key, i);
    const int64_t id = list[i].get<int64_t>();
    LS_REQUIRE(id >= 0 && id < vocab_size, "{}: field '{}'[{}] = {} is outside [0, vocab_size = {})",
               where, key, i, id, vocab_size);
    ids.push_back(static_cast<int32_t>(id));
  }
  return ids;
}

RequestSpec parse_line(const json& object, const std::string& where, int64_t line_number,
                             int32_t vocab_size, int32_t context_length) {
  LS_REQUIRE(object.is_object(), "{}: each line must be a JSON object", where);
  for (const auto& item : object.items()) {
    LS_REQUIRE(known_fields().count(item.key()), "{}: unknown field '{}'", where, item.key());
  }
  LS_REQUIRE(object.contains("prompt"), "{}: field 'prompt' is required", where);
  RequestSpec r;
  r.id = object.contains("id") ? field_as<RequestId>(object, "id", where)
                               : static_cast<RequestId>(line_number);
  r.prompt = token_list(object, "prompt", where, vocab_size);
  LS_REQUIRE(!r.prompt.empty(), "{}: field 'prompt' is empty", where);
  LS_REQUIRE(static_cast<int64_t>(r.prompt.size()) < context_length,
             "{}: prompt of {} tokens leaves no room to generate under context_length L = {}",
             where, r.prompt.size(), context_length);
  if (object.contains("max_new_tokens")) {
    r.max_new_tokens = field_as<int32_t>(object, "max_new_tokens", where);
    LS_REQUIRE(r.max_new_tokens >= 1, "{}: field 'max_new_tokens' must be >= 1, got {}", where,
               r.max_new_tokens);
  }
  if (object.contains("temperature")) r.sampling.temperature = field_as<float>(object, "temperature", where);
  if (object.contains("top_k")) r.sampling.top_k = field_as<int32_t>(object, "top_k", where);
  if (object.contains("top_p")) r.sampling.top_p = field_as<float>(object, "top_p", where);
  if (object.contains("min_p")) r.sampling.min_p = field_as<float>(object, "min_p", where);
  if (object.contains("seed")) r.sampling.seed = field_as<uint64_t>(object, "seed", where);
  if (object.contains("stop")) r.stop_ids = token_list(object, "stop", where, vocab_size);
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
    json object;
    try {
      object = json::parse(text);
    } catch (const json::parse_error& e) {
      throw Error(fmt::format("{}: not valid JSON: {}", where, e.what()));
    }
    RequestSpec r = parse_line(object, where, line_number, vocab_size, context_length);
    LS_REQUIRE(ids.insert(r.id).second, "{}: request id {} was already used", where, r.id);
    requests.push_back(std::move(r));
  }
  LS_REQUIRE(!requests.empty(), "{}: no requests (the file is empty)", source);
  return requests;
}

}  // namespace ls
