// The simulator's random source: a counter-based stream over Philox4x32-10 with our own integer
// and real distributions, so a seed gives the same world on every platform and standard library.
#pragma once

#include "core/sampling.h"

#include <cstdint>

namespace ls::sim {

class SimRandom {
 public:
  // `stream` separates independent uses of one seed (workload, faults, ...).
  SimRandom(uint64_t seed, uint32_t stream) : seed_(seed), stream_(stream) {}

  uint64_t next_u64() {
    const auto words = philox4x32_10(seed_, counter_++, stream_);
    return (uint64_t{words[0]} << 32) | words[1];
  }
  // Uniform in [0, 1) with 53 bits.
  double uniform() { return static_cast<double>(next_u64() >> 11) * 0x1.0p-53; }
  // Uniform integer in [lo, hi] (inclusive); the tiny modulo bias is irrelevant to a test world.
  int64_t range(int64_t lo, int64_t hi) {
    return lo + static_cast<int64_t>(next_u64() % static_cast<uint64_t>(hi - lo + 1));
  }
  bool chance(double probability) { return uniform() < probability; }

 private:
  uint64_t seed_;
  uint32_t stream_;
  uint64_t counter_ = 0;
};

}  // namespace ls::sim
