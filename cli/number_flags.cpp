#include "cli/number_flags.h"

#include <fmt/format.h>

#include <charconv>
#include <limits>
#include <string>

namespace ls::cli {

namespace {

template <typename T>
std::optional<T> parse_whole(std::string_view text) {
  T value{};
  const char* end = text.data() + text.size();
  const auto [ptr, error] = std::from_chars(text.data(), end, value);
  if (text.empty() || error != std::errc() || ptr != end) return std::nullopt;
  return value;
}

std::string field_prefix(std::string_view what) {
  return what.empty() ? std::string() : fmt::format("{} ", what);
}

}  // namespace

std::optional<int64_t> parse_int64(std::string_view text) { return parse_whole<int64_t>(text); }

std::optional<uint64_t> parse_uint64(std::string_view text) {
  // from_chars accepts no sign for unsigned types, so "-1" and "+1" fail here, not wrap.
  return parse_whole<uint64_t>(text);
}

CLI::Validator integer_in(int64_t min, int64_t max, std::string_view what) {
  const std::string prefix = field_prefix(what);
  return CLI::Validator(
      [=](std::string& text) {
        const std::optional<int64_t> value = parse_int64(text);
        if (value && *value >= min && *value <= max) return std::string();
        return fmt::format("{}must be an integer in [{}, {}], got {}", prefix, min, max, text);
      },
      fmt::format("INT in [{} - {}]", min, max));
}

CLI::Validator unsigned_64(std::string_view what) {
  const std::string prefix = field_prefix(what);
  return CLI::Validator(
      [=](std::string& text) {
        if (parse_uint64(text)) return std::string();
        return fmt::format("{}must be an integer in [0, {}], got {}", prefix,
                           std::numeric_limits<uint64_t>::max(), text);
      },
      "UINT64");
}

CLI::Option* add_limit_option(CLI::App& app, int32_t& target, int32_t Limits::*member) {
  const LimitField& field = limit_field(member);
  return app.add_option(std::string(field.flag), target, std::string(field.description))
      ->check(integer_in(field.min, field.max, field.name))
      ->capture_default_str();
}

}  // namespace ls::cli
