#include "core/sampling_params.h"

#include "core/check.h"

#include <xxhash.h>

#include <array>
#include <cmath>

namespace ls {

namespace {

// Above this the distribution is uniform to within fp32 rounding for any realistic logits, so a
// larger value is almost certainly a unit mistake rather than a wish.
constexpr float kTemperatureMax = 100.0f;

}  // namespace

std::optional<std::pair<std::string_view, std::string>> SamplingParams::refusal() const {
  // Every check is written so that NaN fails it: NaN compares false with everything.
  if (!std::isfinite(temperature)) {
    return std::pair{"temperature", fmt::format("temperature must be finite, got {}", temperature)};
  }
  if (!(temperature >= 0.0f && temperature <= kTemperatureMax)) {
    return std::pair{"temperature", fmt::format("temperature must be in [0, {}], got {}",
                                                kTemperatureMax, temperature)};
  }
  if (!(top_k == -1 || (top_k >= 1 && top_k <= kTopKMax))) {
    return std::pair{"top_k", fmt::format("top_k must be -1 (disabled) or in [1, {}], got {}",
                                          kTopKMax, top_k)};
  }
  if (!(top_p > 0.0f && top_p <= 1.0f)) {
    return std::pair{"top_p", fmt::format("top_p must be in (0, 1], got {}", top_p)};
  }
  if (!(min_p >= 0.0f && min_p <= 1.0f)) {
    return std::pair{"min_p", fmt::format("min_p must be in [0, 1], got {}", min_p)};
  }
  return std::nullopt;
}

void SamplingParams::validate(const std::string& where) const {
  if (const auto refused = refusal()) throw Error(fmt::format("{}: {}", where, refused->second));
}

uint64_t default_request_seed(RequestId id) {
  // Bytes spelled out rather than the in-memory representation, so the seed is the same on any
  // host byte order.
  std::array<unsigned char, 8> bytes{};
  for (size_t i = 0; i < bytes.size(); ++i) {
    bytes[i] = static_cast<unsigned char>(id >> (8 * i));
  }
  return XXH64(bytes.data(), bytes.size(), 0);
}

ResolvedSampling resolve_sampling(const SamplingParams& params, RequestId id) {
  ResolvedSampling resolved;
  resolved.seed = params.seed.value_or(default_request_seed(id));
  if (params.is_greedy()) {
    // Greedy rows ignore temperature, top-p and min-p; one canonical form makes two greedy
    // requests compare equal and keeps stray values out of the trace.
    resolved.temperature = 1.0f;
    resolved.top_k = 1;
    return resolved;
  }
  resolved.temperature = params.temperature;
  resolved.top_k = params.top_k == -1 ? SamplingParams::kTopKMax : params.top_k;
  resolved.top_p = params.top_p;
  resolved.min_p = params.min_p;
  return resolved;
}

}  // namespace ls
