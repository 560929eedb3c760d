// Per-request sampling parameters. Unlike the seed, which silently ignores what a backend does not
// support, lockstep rejects any parameter outside its range with an error naming it.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

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
  // Throws ls::Error naming the parameter, its value and its range; `where` prefixes the message.
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
