// JSON from untrusted model files (config.json, safetensors headers, the shard index), parsed
// with a check nlohmann does not make: a key that appears twice in one object is an error, not a
// silent "last one wins" (two readers could disagree about which value a file holds).
#pragma once

#include <nlohmann/json.hpp>

#include <string>
#include <string_view>

namespace ls {

// Throws ls::Error "<what>: not valid JSON", "<what>: key 'k' appears twice in one object", or
// "<what>: must be a JSON object, got <type>".
nlohmann::json parse_json_object(std::string_view text, const std::string& what);

}  // namespace ls
