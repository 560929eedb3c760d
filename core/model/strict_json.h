// JSON from untrusted files (config.json, safetensors headers, the shard index, prompt files),
// parsed with checks nlohmann does not make: a key that appears twice in one object is an error,
// not a silent "last one wins" (two readers could disagree about which value a file holds), and
// every non-integer number keeps the text it was written as, so that an error quotes "1e12" or
// "4.5" rather than a reformatted double or a value wrapped by narrowing.
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <map>
#include <string>
#include <string_view>

namespace ls {

struct JsonDocument {
  nlohmann::json value;
  // The text of every floating-point number (in JSON: a fraction, an exponent, or an integer too
  // large for 64 bits), by JSON pointer ("/max_new_tokens", "/prompt/3").
  std::map<std::string, std::string> float_texts;

  // The value at `pointer` as the input wrote it: numbers exactly, anything else dumped.
  std::string as_written(const std::string& pointer) const;
};

// Throws ls::Error "<what>: not valid JSON: <detail>" or "<what>: key 'k' appears twice in one
// object".
JsonDocument parse_json_document(std::string_view text, const std::string& what);

// As parse_json_document, and also "<what>: must be a JSON object, got <type>".
nlohmann::json parse_json_object(std::string_view text, const std::string& what);

// The integer at `pointer`, range-checked in 64 bits before the caller narrows it. Anything else
// (a fraction, an exponent, a value outside [min, max] or outside 64 bits, a string) throws
// ls::Error "<where>: field '<name>' must be an integer in [min, max], got <as written>".
int64_t json_integer_in(const JsonDocument& document, const std::string& pointer, int64_t min,
                        int64_t max, const std::string& where, const std::string& name);
// The same for a 64-bit unsigned value (a seed, a request id): [0, 2^64 − 1].
uint64_t json_uint64(const JsonDocument& document, const std::string& pointer,
                     const std::string& where, const std::string& name);

}  // namespace ls
