#include "core/model/strict_json.h"

#include "core/check.h"

#include <optional>
#include <set>
#include <vector>

namespace ls {

nlohmann::json parse_json_object(std::string_view text, const std::string& what) {
  using Json = nlohmann::json;
  std::vector<std::set<std::string>> open_objects;  // the keys seen so far, innermost last
  std::optional<std::string> duplicate;
  const Json::parser_callback_t track = [&](int, Json::parse_event_t event, Json& parsed) {
    switch (event) {
      case Json::parse_event_t::object_start: open_objects.emplace_back(); break;
      case Json::parse_event_t::object_end:
        if (!open_objects.empty()) open_objects.pop_back();
        break;
      case Json::parse_event_t::key:
        if (!open_objects.empty() && parsed.is_string() &&
            !open_objects.back().insert(parsed.get<std::string>()).second && !duplicate) {
          duplicate = parsed.get<std::string>();
        }
        break;
      default: break;
    }
    return true;
  };
  Json json = Json::parse(text.begin(), text.end(), track, /*allow_exceptions=*/false);
  LS_REQUIRE(!json.is_discarded(), "{}: not valid JSON", what);
  LS_REQUIRE(!duplicate.has_value(), "{}: key '{}' appears twice in one object", what,
             duplicate.value_or(""));
  LS_REQUIRE(json.is_object(), "{}: must be a JSON object, got {}", what, json.type_name());
  return json;
}

}  // namespace ls
