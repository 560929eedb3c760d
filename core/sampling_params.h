// Per-request sampling parameters. Unlike the seed, which silently ignores what a backend does not
// support, lockstep rejects any parameter outside its range with an error naming it.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>

namespace ls {

using RequestId = uint64_t;

struct SamplingParams {
  float temperature = 0.0f;  // < kGreedyTemperature means greedy (argmax, lowest id on ties)
  int32_t top_k = -1;        // -1 disables; otherwise >= 1
  float top_p = 1.0f;        // (0, 1]
  float min_p = 0.0f;        // [0, 1]
  std::optional<uint64_t> seed;  // unset: a stable hash of the request id

  static constexpr float kGreedyTemperature = 1e-6f;
  static constexpr int32_t kTopKMax = 1 << 20;

  bool operator==(const SamplingParams&) const = default;
  bool is_greedy() const { return temperature < kGreedyTemperature || top_k == 1; }
  // The first parameter outside its range ("temperature", "top_k", "top_p" or "min_p") and a
  // message naming its value and range; std::nullopt when every parameter is in range.
  std::optional<std::pair<std::string_view, std::string>> refusal() const;
  // Throws ls::Error with refusal()'s message; `where` prefixes it.
  void validate(const std::string& where) const;
};

// The seed a request uses when none is given: XXH64 of the id's 8 little-endian bytes, seed 0.
uint64_t default_request_seed(RequestId id);

// Parameters as the sampler uses them, resolved once when a request arrives on its pool row.
struct ResolvedSampling {
  uint64_t seed = 0;
  float temperature = 1.0f;
  int32_t top_k = 1;  // 1 = greedy
  float top_p = 1.0f;
  float min_p = 0.0f;

  bool operator==(const ResolvedSampling&) const = default;
};

ResolvedSampling resolve_sampling(const SamplingParams& params, RequestId id);

}  // namespace ls
