#include "core/model/strict_json.h"

#include "core/check.h"

#include <limits>
#include <optional>
#include <set>
#include <vector>

namespace ls {

namespace {

using Json = nlohmann::json;

// A SAX pass beside the DOM parse: it sees each key and each number's text, which the DOM loses.
class Scanner : public nlohmann::json_sax<Json> {
 public:
  std::optional<std::string> duplicate;              // the first key seen twice in one object
  std::map<std::string, std::string> float_texts;
  std::string error;

  bool null() override { return value(); }
  bool boolean(bool) override { return value(); }
  bool number_integer(number_integer_t) override { return value(); }
  bool number_unsigned(number_unsigned_t) override { return value(); }
  bool number_float(number_float_t, const string_t& text) override {
    float_texts[pointer_of_next()] = text;
    return value();
  }
  bool string(string_t&) override { return value(); }
  bool binary(binary_t&) override { return value(); }
  bool start_object(std::size_t) override {
    open_.push_back({false, 0, {}, {}});
    return true;
  }
  bool key(string_t& key) override {
    Frame& frame = open_.back();
    if (!frame.keys.insert(key).second && !duplicate) duplicate = key;
    frame.key = key;
    return true;
  }
  bool end_object() override { return close(); }
  bool start_array(std::size_t) override {
    open_.push_back({true, 0, {}, {}});
    return true;
  }
  bool end_array() override { return close(); }
  bool parse_error(std::size_t, const std::string&, const nlohmann::detail::exception& e) override {
    error = e.what();
    return false;
  }

 private:
  struct Frame {
    bool is_array;
    size_t index;  // of the next element (arrays)
    std::string key;  // the current key (objects)
    std::set<std::string> keys;
  };

  // Each value fills the next element of its array; the pointer names it before that.
  std::string pointer_of_next() const {
    std::string pointer;
    for (const Frame& frame : open_) {
      pointer += '/';
      pointer += frame.is_array ? std::to_string(frame.index) : escaped(frame.key);
    }
    return pointer;
  }
  static std::string escaped(const std::string& key) {
    std::string out;
    for (char c : key) out += c == '~' ? "~0" : c == '/' ? "~1" : std::string(1, c);
    return out;
  }
  bool value() {
    if (!open_.empty() && open_.back().is_array) ++open_.back().index;
    return true;
  }
  bool close() {
    open_.pop_back();
    return value();  // the closed container was one value of its parent
  }

  std::vector<Frame> open_;
};

std::string range_error(const JsonDocument& document, const std::string& pointer,
                        const std::string& where, const std::string& name, const std::string& min,
                        const std::string& max) {
  return fmt::format("{}: field '{}' must be an integer in [{}, {}], got {}", where, name, min, max,
                     document.as_written(pointer));
}

}  // namespace

std::string JsonDocument::as_written(const std::string& pointer) const {
  const auto text = float_texts.find(pointer);
  if (text != float_texts.end()) return text->second;
  return value.at(Json::json_pointer(pointer)).dump();
}

JsonDocument parse_json_document(std::string_view text, const std::string& what) {
  Scanner scanner;
  const bool parsed = Json::sax_parse(text.begin(), text.end(), &scanner);
  LS_REQUIRE(parsed, "{}: not valid JSON: {}", what, scanner.error);
  LS_REQUIRE(!scanner.duplicate.has_value(), "{}: key '{}' appears twice in one object", what,
             scanner.duplicate.value_or(""));
  return {Json::parse(text.begin(), text.end()), std::move(scanner.float_texts)};
}

nlohmann::json parse_json_object(std::string_view text, const std::string& what) {
  JsonDocument document = parse_json_document(text, what);
  LS_REQUIRE(document.value.is_object(), "{}: must be a JSON object, got {}", what,
             document.value.type_name());
  return std::move(document.value);
}

int64_t json_integer_in(const JsonDocument& document, const std::string& pointer, int64_t min,
                        int64_t max, const std::string& where, const std::string& name) {
  const Json& value = document.value.at(Json::json_pointer(pointer));
  std::optional<int64_t> integer;
  if (value.is_number_unsigned()) {
    if (value.get<uint64_t>() <= uint64_t{std::numeric_limits<int64_t>::max()}) {
      integer = static_cast<int64_t>(value.get<uint64_t>());
    }
  } else if (value.is_number_integer()) {
    integer = value.get<int64_t>();
  }
  LS_REQUIRE(integer && *integer >= min && *integer <= max, "{}",
             range_error(document, pointer, where, name, std::to_string(min), std::to_string(max)));
  return *integer;
}

uint64_t json_uint64(const JsonDocument& document, const std::string& pointer,
                     const std::string& where, const std::string& name) {
  const Json& value = document.value.at(Json::json_pointer(pointer));
  const bool fits = value.is_number_unsigned() ||
                    (value.is_number_integer() && value.get<int64_t>() >= 0);
  LS_REQUIRE(fits, "{}",
             range_error(document, pointer, where, name, "0",
                         std::to_string(std::numeric_limits<uint64_t>::max())));
  return value.get<uint64_t>();
}

}  // namespace ls
