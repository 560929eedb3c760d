// Generation requests as JSONL, one object per line:
//   {"id": 7, "prompt": [1, 2, 3], "max_new_tokens": 16, "temperature": 0.8, "top_k": 40,
//    "top_p": 0.95, "min_p": 0.0, "seed": 123, "stop": [2]}
// Only "prompt" is required. Errors name the source, the line and the field.
#pragma once

#include "core/scheduler.h"

#include <cstdint>
#include <istream>
#include <string>
#include <vector>

namespace ls {

// `vocab_size` bounds prompt and stop ids; `context_length` bounds the prompt. Ids default to the
// line number (1-based) when absent; duplicate ids are rejected.
std::vector<RequestSpec> parse_prompts_jsonl(std::istream& in, const std::string& source,
                                                   int32_t vocab_size, int32_t context_length);

}  // namespace ls
