// RapidCheck generators for executor workloads: requests (prompts that share prefixes, greedy and
// stochastic sampling, some running into the context limit) and per-step choices. Every choice
// shrinks toward "nothing special happens" (one chunk, no retraction, no fault).
#pragma once

#include "core/scheduler.h"
#include "proptest/workload.h"

#include <rapidcheck.h>

#include <vector>

namespace ls::proptest {

struct ScriptShape {
  int32_t rows_min = 2;
  int32_t rows_max = 8;
  std::vector<int32_t> widths = {1, 2};
  int32_t requests_min = 1;
  int32_t requests_max = 5;
  int32_t steps_max = 24;
  bool faults = true;       // poison and invalid-op choices
  int32_t invalid_rate = 4; // 1 in this many steps tries a broken op (when faults)
  bool retract = true;
  bool vary_chunks = true;
  bool vary_rows = true;
  bool vary_mixed = true;
  bool greedy_only = false;
};

// A prompt of `length` ids: an optional shared prefix (kind 1: 8 ids, kind 2: 12 ids), then ids
// derived from (id, salt).
std::vector<int32_t> make_prompt(RequestId id, int32_t prefix_kind, int32_t length, int32_t salt);

rc::Gen<RequestScript> gen_request(RequestId id, bool greedy_only);
rc::Gen<StepChoice> gen_choice(const ScriptShape& shape);
rc::Gen<Script> gen_script(const ScriptShape& shape);

// Requests for the production scheduler (ids 1..n).
rc::Gen<std::vector<RequestSpec>> gen_request_specs(int32_t count_max, bool greedy_only);

}  // namespace ls::proptest
