// When and how one step ran, and the serving state around it: what a trace's stepStats record
// holds (trace/trace.capnp). Measured by the serving loop or the simulator outside the
// executor's rules, off the step's critical path (a few clock reads and counters per step).
#pragma once

#include <cstdint>

namespace ls {

// What a backend measured on its device for the last collected step (CUDA events on CUDA);
// -1 where it measures nothing (the CPU reference: the loop's clock stands in).
struct DeviceStepTime {
  int64_t busy_ns = -1;         // the step's first to last device operation
  int64_t idle_before_ns = -1;  // device idle between the previous step's end and this start
  int64_t wait_ns = -1;         // host time blocked waiting for the step's results
};

struct StepStats {
  int64_t step = 0;
  // The loop's clock (header.stepClock): the op handed to the executor, its result in hand.
  int64_t submit_ns = 0;
  int64_t done_ns = 0;
  int64_t wait_ns = 0;             // host blocked on the step (the whole step on the CPU)
  int64_t device_busy_ns = 0;      // header.deviceTimer: CUDA events, or the clock on the CPU
  int64_t device_idle_before_ns = -1;  // CUDA events only; -1 unknown
  // The scheduler after planning this step.
  int32_t pages_used = 0;          // device pages held by requests or the prefix cache
  int32_t pages_free = 0;
  int32_t prefix_hit_tokens = 0;   // prompt tokens this step's plan found in the prefix cache
  int32_t queue_length = 0;        // live requests without a pool row (waiting or retracted)
  int32_t running_count = 0;       // requests holding a pool row

  bool operator==(const StepStats&) const = default;
};

}  // namespace ls
