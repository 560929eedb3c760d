// Numeric flags checked as written, before CLI11 narrows them into the option's type: a flag's
// text is parsed as a whole integer in 64 bits (or as an unsigned 64-bit value) and range-checked
// there, so "-1" for a seed or "5000000000" for an int32 count is refused with that text instead
// of wrapping, and "4.5" is refused instead of truncating.
#pragma once

#include "core/limits.h"

#include <CLI/CLI.hpp>

#include <cstdint>
#include <optional>
#include <string_view>

namespace ls::cli {

// A whole decimal number: digits with an optional leading '-', nothing else, within int64
// (parse_int64) or within [0, 2^64 − 1] (parse_uint64); nullopt otherwise.
std::optional<int64_t> parse_int64(std::string_view text);
std::optional<uint64_t> parse_uint64(std::string_view text);

// "must be an integer in [min, max], got <text>" for anything else (`what` names the field).
CLI::Validator integer_in(int64_t min, int64_t max, std::string_view what = "");
// A 64-bit unsigned value (a seed, a request id): negative or >= 2^64 is refused as written.
CLI::Validator unsigned_64(std::string_view what = "");

// The option for one limit of core/limits.h, its range and help taken from kLimitFields.
CLI::Option* add_limit_option(CLI::App& app, int32_t& target, int32_t Limits::*member);

}  // namespace ls::cli
