// A simple built-in batching loop for `lockstep generate`, until the scheduler lands: requests
// are admitted in id order when a pool row and pages for prompt + max_new_tokens are free;
// prefill is chunked under the step's token budget; decode rows join the same (MIXED) ops.
// No overlap, no prefix cache, no retraction.
#pragma once

#include "core/executor.h"
#include "core/finish_reason.h"
#include "core/prompts.h"

#include <functional>
#include <string>
#include <vector>

namespace ls {


struct GenerationOutput {
  RequestId id = 0;
  int32_t prompt_tokens = 0;
  std::vector<int32_t> tokens;
  FinishReason finish_reason = FinishReason::kLength;
};

struct BatcherProgress {
  int64_t steps_count = 0;
  int64_t finished_count = 0;
  int64_t requests_count = 0;
  int64_t tokens_generated = 0;
};

// Runs every request to completion; outputs are in input order. `on_step` (may be empty) is called
// after every step, e.g. for a progress line.
std::vector<GenerationOutput> run_simple_batcher(
    Executor& executor, const std::vector<GenerationRequest>& requests,
    const std::function<void(const BatcherProgress&)>& on_step = {});

}  // namespace ls
