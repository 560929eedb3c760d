// Why a request stopped generating.
#pragma once

#include <cstdint>
#include <string_view>

namespace ls {

enum class FinishReason : uint8_t {
  kLength = 0,          // max_new_tokens reached
  kStop = 1,            // a stop id was sampled
  kContext = 2,         // the context length L was reached before max_new_tokens
  kAbort = 3,           // the client aborted
  kNumericalError = 4,  // the NaN guard flagged the row: abort, keep one token
};

inline std::string_view to_string(FinishReason reason) {
  switch (reason) {
    case FinishReason::kLength: return "length";
    case FinishReason::kStop: return "stop";
    case FinishReason::kContext: return "context";
    case FinishReason::kAbort: return "abort";
    case FinishReason::kNumericalError: return "numerical_error";
  }
  return "?";
}

}  // namespace ls
