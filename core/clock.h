// The clock a serving loop reads for step timing (STYLE.md §13: injected, never read inside the
// executor's rules). Production passes SteadyClock; the simulator passes a ManualClock it
// advances itself, so a simulated run's times are a function of its seed.
#pragma once

#include <chrono>
#include <cstdint>

namespace ls {

class Clock {
 public:
  virtual ~Clock() = default;
  // Nanoseconds on a monotonic scale; only differences mean anything.
  virtual int64_t now_ns() const = 0;
};

class SteadyClock final : public Clock {
 public:
  int64_t now_ns() const override {
    return std::chrono::duration_cast<std::chrono::nanoseconds>(
               std::chrono::steady_clock::now().time_since_epoch())
        .count();
  }
};

class ManualClock final : public Clock {
 public:
  int64_t now_ns() const override { return now_ns_; }
  void advance_ns(int64_t ns) { now_ns_ += ns; }

 private:
  int64_t now_ns_ = 0;
};

}  // namespace ls
