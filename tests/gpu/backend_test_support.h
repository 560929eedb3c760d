// Driving a backend through the production path (Scheduler + Executor + serving loop) and
// comparing backends, for the GPU tests.
#pragma once

#include "core/executor.h"
#include "core/model/weights.h"
#include "core/scheduler.h"
#include "core/serving_loop.h"
#include "core/step_observer.h"

#include <cstdint>
#include <map>
#include <vector>

namespace ls::gpu_test {

using Outcomes = std::map<RequestId, std::vector<int32_t>>;

// The requests served to the end: each request's tokens, the steps and the tokens generated.
struct Served {
  Outcomes tokens;
  int64_t steps = 0;
  int64_t generated = 0;
};

inline Served serve(Backend& backend, const SchedulerConfig& config, int32_t vocab,
                    const std::vector<RequestSpec>& requests) {
  Scheduler scheduler(config);
  for (const RequestSpec& r : requests) scheduler.submit(r, vocab);
  Executor executor(executor_config_for(config), vocab, backend);
  const ServingProgress done = run_serving_loop(scheduler, executor);
  Served run{.steps = done.steps_count, .generated = done.tokens_generated};
  for (const auto& [id, outcome] : scheduler.outcomes()) run.tokens[id] = outcome.tokens;
  return run;
}

// The scheduler the backend-level tests serve `tiny` with: batch 16, chunks of 96 tokens, 400
// pages of 16, context 256.
inline SchedulerConfig tiny_scheduler() {
  SchedulerConfig c;
  c.max_batch_rows = 16;
  c.prefill_chunk_tokens = 96;
  c.page_size = 16;
  c.pages_count = 400;
  c.context_length = 256;
  return c;
}

inline Outcomes generate(Backend& backend, const SchedulerConfig& config, int32_t vocab,
                         const std::vector<RequestSpec>& requests) {
  return serve(backend, config, vocab, requests).tokens;
}

// `count` greedy requests with prompts of varied length (1 .. length_max) spread over the vocab.
inline std::vector<RequestSpec> greedy_requests(int32_t count, int32_t length_max,
                                                int32_t new_tokens, int32_t vocab,
                                                uint64_t salt = 0) {
  std::vector<RequestSpec> requests;
  for (int32_t i = 0; i < count; ++i) {
    RequestSpec r;
    r.id = static_cast<RequestId>(i + 1);
    const int32_t length = 1 + (i * 13 + 5) % length_max;
    for (int32_t t = 0; t < length; ++t) {
      r.prompt.push_back(static_cast<int32_t>(((salt + r.id) * 97 + static_cast<uint64_t>(t) * 31 + 5) %
                                              static_cast<uint64_t>(vocab)));
    }
    r.max_new_tokens = new_tokens;
    requests.push_back(std::move(r));
  }
  return requests;
}

// Requests whose token lists are equal in both, and the first that is not (0 when all agree).
struct Agreement {
  int32_t equal_count = 0;
  int32_t total_count = 0;
  int64_t tokens_equal = 0;
  int64_t tokens_total = 0;
  RequestId first_mismatch = 0;
  size_t first_mismatch_index = 0;
};

// Keeps each request's logits from the step that finished its prompt (logits row = op row for
// prefill rows, which come first). The executor must capture logits.
class FirstLogits : public StepObserver {
 public:
  explicit FirstLogits(int32_t vocab) : vocab_(vocab) {}
  void on_step_input(int64_t, const ForwardOp&, const std::vector<CacheOp>&,
                     const StepFaults&) override {}
  void on_step_output(int64_t, const ForwardOp& op, const StepResult& result,
                      const StateSnapshot&) override {
    for (int32_t i = 0; i < op.prefill_rows_count(); ++i) {
      const OpRow& row = op.rows[i];
      if (row.prefix_length + row.input_length != row.prompt_length) continue;
      const auto begin = result.logits.begin() + static_cast<ptrdiff_t>(i) * vocab_;
      logits[row.request_id].assign(begin, begin + vocab_);
    }
  }
  void on_scheduler_events(int64_t, const std::vector<SchedulerEvent>&) override {}

  std::map<RequestId, std::vector<float>> logits;

 private:
  int32_t vocab_;
};

inline Agreement compare(const Outcomes& a, const Outcomes& b) {
  Agreement g;
  for (const auto& [id, tokens] : a) {
    ++g.total_count;
    const auto it = b.find(id);
    const std::vector<int32_t> empty;
    const std::vector<int32_t>& other = it == b.end() ? empty : it->second;
    size_t prefix = 0;
    while (prefix < tokens.size() && prefix < other.size() && tokens[prefix] == other[prefix]) ++prefix;
    for (size_t i = 0; i < std::min(tokens.size(), other.size()); ++i) g.tokens_equal += tokens[i] == other[i];
    g.tokens_total += static_cast<int64_t>(std::max(tokens.size(), other.size()));
    if (tokens == other) {
      ++g.equal_count;
    } else if (g.first_mismatch == 0) {
      g.first_mismatch = id;
      g.first_mismatch_index = prefix;
    }
  }
  return g;
}

}  // namespace ls::gpu_test
