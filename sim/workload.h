// The requests of a simulated world: arrival steps, prompts (some sharing prefixes), lengths,
// sampling mixes and client aborts, all drawn from the seed.
#pragma once

#include "core/scheduler.h"
#include "sim/params.h"

#include <cstdint>
#include <vector>

namespace ls::sim {

struct SimRequest {
  RequestSpec spec;
  int64_t arrival_step = 0;
  int64_t abort_step = -1;  // a client abort at this step, or -1
};

// Requests sorted by arrival step (ties by id). `vocab_size` bounds the ids.
std::vector<SimRequest> generate_workload(const SimParams& params, int32_t vocab_size);

}  // namespace ls::sim
