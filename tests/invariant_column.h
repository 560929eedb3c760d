// The workload driver of the CUDA column of the determinism table (issue 15): serves requests
// through the production path (Scheduler + Executor + serving loop) on any backend, keeps every
// logits row the backend computed for each request — the token sampled from it, its logprob's
// bits, the logits digest and the top-8 (ids and logit bits) that a recording step returns — by
// the sequence length it ends, and compares two runs bit for bit. The GPU tests
// (tests/gpu/invariant_column_gpu_test.cpp) serve in batch-invariant mode; the CPU tests
// (tests/invariant_column_test.cpp) run the same driver and workloads on the CPU reference, and
// show that the comparison flags one altered bit.
//
// Why rows are keyed by sequence length: a request's rows are computed at different steps, in
// different chunks and pool rows depending on the batch, and some twice (a re-prefill after
// retraction by recompute; the result of a step in flight when its row was retracted, which the
// scheduler ignores) — but the logits after the first n tokens of a request are a function of those
// n tokens alone when the backend is batch invariant, and so is the sampled token (a draw depends
// on (seed, position) only, core/sampling.h). The key is the row's KV length after the step
// (StepResult::state): prefix + chunk for a prefill row, the decoded token's position + 1 for a
// decode row.
#pragma once

#include "core/check.h"
#include "core/executor.h"
#include "core/logits_digest.h"
#include "core/scheduler.h"
#include "core/serving_loop.h"
#include "core/step_observer.h"

#include <fmt/format.h>

#include <cstdint>
#include <cstring>
#include <map>
#include <set>
#include <string>
#include <vector>

namespace ls::column {

constexpr int32_t kTopLogitsCount = 8;

// One logits row of one request, as bits.
struct RowBits {
  int32_t token = 0;
  uint32_t logprob_bits = 0;
  uint64_t digest = 0;
  std::vector<uint64_t> top;  // [kTopLogitsCount] id << 32 | the logit's bits

  bool operator==(const RowBits&) const = default;
};

inline uint32_t bits_of(float x) {
  uint32_t u = 0;
  std::memcpy(&u, &x, sizeof u);
  return u;
}

// Every row computed for one request: sequence length → its rows in step order.
using RequestRows = std::map<int32_t, std::vector<RowBits>>;

struct Served {
  std::map<RequestId, std::vector<int32_t>> tokens;  // emitted, from the scheduler's outcomes
  std::map<RequestId, RequestRows> rows;
  int64_t steps_count = 0;
  int32_t rows_in_step_max = 0;        // the largest batch a step carried
  int32_t sequence_length_max = 0;     // the longest row key: how far into the context a row reached
  int64_t swap_retractions = 0;
  int64_t recompute_retractions = 0;
  int64_t steps_submitted_ahead = 0;   // steps whose input came before the previous step's output
};

// What the loop shows the observer, kept as RowBits (W = 1: op row i is result row i).
class RowsObserver final : public StepObserver {
 public:
  explicit RowsObserver(Served& served) : served_(served) {}

  void on_step_input(int64_t, const ForwardOp& op, const std::vector<CacheOp>&,
                     const StepFaults&) override {
    if (inputs_count_ > outputs_count_) ++served_.steps_submitted_ahead;
    ++inputs_count_;
    served_.rows_in_step_max = std::max(served_.rows_in_step_max, op.rows_count());
  }

  void on_step_output(int64_t step, const ForwardOp& op, const StepResult& result,
                      const StateSnapshot& state) override {
    ++outputs_count_;
    const size_t rows = op.rows.size();
    if (result.verify_width != 1 || result.tokens.size() != rows || result.logprobs.size() != rows ||
        result.logits_digests.size() != rows || state.valid_cache_length.size() != rows ||
        result.top_logits.size() != rows * kTopLogitsCount) {
      shape_error_ = fmt::format("step {}: {} rows but {} tokens, {} logprobs, {} digests, {} "
                                 "lengths, {} top logits (W {})", step, rows, result.tokens.size(),
                                 result.logprobs.size(), result.logits_digests.size(),
                                 state.valid_cache_length.size(), result.top_logits.size(),
                                 result.verify_width);
      return;
    }
    for (size_t i = 0; i < rows; ++i) {
      RowBits bits{.token = result.tokens[i], .logprob_bits = bits_of(result.logprobs[i]),
                   .digest = result.logits_digests[i]};
      for (int32_t k = 0; k < kTopLogitsCount; ++k) {
        const TopLogit& t = result.top_logits[i * kTopLogitsCount + static_cast<size_t>(k)];
        bits.top.push_back(uint64_t{static_cast<uint32_t>(t.id)} << 32 | bits_of(t.logit));
      }
      const int32_t length = state.valid_cache_length[i];
      served_.rows[op.rows[i].request_id][length].push_back(std::move(bits));
      served_.sequence_length_max = std::max(served_.sequence_length_max, length);
    }
  }

  void on_scheduler_events(int64_t, const std::vector<SchedulerEvent>& events) override {
    for (const SchedulerEvent& e : events) {
      if (e.kind != SchedulerEvent::Kind::kRetract) continue;
      ++(e.retract_path == RetractPath::kSwap ? served_.swap_retractions
                                              : served_.recompute_retractions);
    }
  }

  // Non-empty when a step's result did not have the shape the driver reads.
  const std::string& shape_error() const { return shape_error_; }

 private:
  Served& served_;
  int64_t inputs_count_ = 0;
  int64_t outputs_count_ = 0;
  std::string shape_error_;
};

// What a recording step returns: logprobs, digests, top-8 and each row's state.
inline ExecutorOptions row_bits_options() {
  return ExecutorOptions{.want_logprobs = true, .record = true, .top_logits_count = kTopLogitsCount};
}

// Serves `requests` together to the end on `backend` (built for executor_config_for(config)).
// Throws ls::Error when a step's result lacks what the driver reads.
inline Served serve(Backend& backend, const SchedulerConfig& config, int32_t vocab,
                    const std::vector<RequestSpec>& requests, bool run_ahead = true) {
  Served served;
  Scheduler scheduler(config);
  for (const RequestSpec& r : requests) scheduler.submit(r, vocab);
  Executor executor(executor_config_for(config), vocab, backend, row_bits_options());
  RowsObserver observer(served);
  const ServingProgress done = run_serving_loop(
      scheduler, executor, ServingLoopOptions{.observer = &observer, .run_ahead = run_ahead});
  LS_REQUIRE(observer.shape_error().empty(), "invariant column driver: {}", observer.shape_error());
  served.steps_count = done.steps_count;
  for (const auto& [id, outcome] : scheduler.outcomes()) served.tokens[id] = outcome.tokens;
  return served;
}

// Each request served alone, one after the other on the same backend: the solo runs.
inline Served serve_each_alone(Backend& backend, const SchedulerConfig& config, int32_t vocab,
                               const std::vector<RequestSpec>& requests) {
  Served all;
  for (const RequestSpec& r : requests) {
    Served one = serve(backend, config, vocab, {r});
    all.tokens.merge(one.tokens);
    all.rows.merge(one.rows);
    all.steps_count += one.steps_count;
    all.rows_in_step_max = std::max(all.rows_in_step_max, one.rows_in_step_max);
    all.sequence_length_max = std::max(all.sequence_length_max, one.sequence_length_max);
  }
  return all;
}

// How two runs are held to each other.
enum class Match : uint8_t {
  // The same schedule (graphs on/off, run ahead on/off): every request's rows at the same
  // sequence lengths, as many at each, all equal.
  kSameSchedule,
  // `run` against its requests' solo runs (the reference): at every sequence length both computed,
  // each of the run's rows equals the solo row; chunk ends the other run has not are skipped.
  kSolo,
};

struct Comparison {
  std::string difference;      // the first, naming request, sequence length and field; empty: none
  int64_t rows_compared = 0;   // rows of `run` held to a reference row
  int64_t tokens_compared = 0;
  std::set<int32_t> distinct_tokens;    // emitted by the reference: the oracle is not degenerate
  std::set<uint64_t> distinct_digests;  // of the reference's rows
};

inline std::string describe_row_difference(const RowBits& want, const RowBits& got) {
  if (want.token != got.token) return fmt::format("token {} vs {}", want.token, got.token);
  if (want.logprob_bits != got.logprob_bits) {
    return fmt::format("logprob bits {:08x} vs {:08x}", want.logprob_bits, got.logprob_bits);
  }
  if (want.digest != got.digest) return fmt::format("logits digest {:016x} vs {:016x}", want.digest, got.digest);
  for (size_t k = 0; k < want.top.size() && k < got.top.size(); ++k) {
    if (want.top[k] != got.top[k]) {
      return fmt::format("top logit {}: id {} bits {:08x} vs id {} bits {:08x}", k, want.top[k] >> 32,
                         want.top[k] & 0xffffffffu, got.top[k] >> 32, got.top[k] & 0xffffffffu);
    }
  }
  return fmt::format("top logits count {} vs {}", want.top.size(), got.top.size());
}

// The emitted tokens and, for every token, that both runs computed the row it was sampled from and
// that the reference's row holds it (the driver's own bookkeeping).
inline std::string emitted_difference(const RequestSpec& r, const Served& reference, const Served& run) {
  if (!reference.rows.contains(r.id) || !run.rows.contains(r.id)) {
    return fmt::format("request {}: no rows in {}", r.id,
                       reference.rows.contains(r.id) ? "the run" : "the reference");
  }
  const auto want = reference.tokens.find(r.id);
  const auto got = run.tokens.find(r.id);
  if (want == reference.tokens.end()) return fmt::format("request {}: no reference outcome", r.id);
  if (got == run.tokens.end()) return fmt::format("request {}: no outcome", r.id);
  if (want->second != got->second) {
    size_t k = 0;
    while (k < want->second.size() && k < got->second.size() && want->second[k] == got->second[k]) ++k;
    return fmt::format("request {}: emitted tokens differ from token {} ({} vs {} tokens)", r.id, k,
                       want->second.size(), got->second.size());
  }
  const RequestRows empty;
  const auto rows_of = [&](const Served& s) -> const RequestRows& {
    const auto it = s.rows.find(r.id);
    return it == s.rows.end() ? empty : it->second;
  };
  for (size_t k = 0; k < want->second.size(); ++k) {
    const int32_t length = static_cast<int32_t>(r.prompt.size() + k);
    const auto at = rows_of(reference).find(length);
    if (at == rows_of(reference).end() || !rows_of(run).contains(length)) {
      return fmt::format("request {} token {}: no row at sequence length {} in {}", r.id, k, length,
                         at == rows_of(reference).end() ? "the reference" : "the run");
    }
    if (at->second.front().token != want->second[k]) {
      return fmt::format("request {} token {}: emitted {} but its row sampled {}", r.id, k,
                         want->second[k], at->second.front().token);
    }
  }
  return "";
}

// Holds `run` to `reference` request by request; see Match.
inline Comparison compare(const Served& reference, const Served& run,
                          const std::vector<RequestSpec>& requests, Match match) {
  Comparison c;
  for (const RequestSpec& r : requests) {
    if (c.difference = emitted_difference(r, reference, run); !c.difference.empty()) return c;
    const std::vector<int32_t>& tokens = reference.tokens.at(r.id);
    c.tokens_compared += static_cast<int64_t>(tokens.size());
    c.distinct_tokens.insert(tokens.begin(), tokens.end());
    const RequestRows& want = reference.rows.find(r.id)->second;  // emitted_difference found both
    const RequestRows& got = run.rows.find(r.id)->second;
    for (const auto& [length, rows] : want) {
      for (const RowBits& row : rows) c.distinct_digests.insert(row.digest);
      const auto it = got.find(length);
      const bool same_count = it != got.end() && it->second.size() == rows.size();
      if (match == Match::kSameSchedule && !same_count) {
        c.difference = fmt::format("request {}: {} rows at sequence length {} in the reference, {} "
                                   "in the run", r.id, rows.size(), length,
                                   it == got.end() ? 0 : it->second.size());
        return c;
      }
      if (it == got.end()) continue;
      for (size_t k = 0; k < it->second.size(); ++k) {
        const RowBits& want_row = match == Match::kSameSchedule ? rows[k] : rows.front();
        if (it->second[k] == want_row) {
          ++c.rows_compared;
          continue;
        }
        c.difference = fmt::format("request {}, sequence length {} (row {} of {}): {}", r.id, length,
                                   k + 1, it->second.size(),
                                   describe_row_difference(want_row, it->second[k]));
        return c;
      }
    }
    if (match == Match::kSameSchedule && got.size() != want.size()) {
      c.difference = fmt::format("request {}: rows at {} sequence lengths in the reference, {} in "
                                 "the run", r.id, want.size(), got.size());
      return c;
    }
  }
  return c;
}

// Greedy and seeded-sampled requests (every third greedy), prompts of prompt_min..prompt_max
// tokens asking new_min..new_max new ones, ids first_id, first_id + 1, ...; lengths and tokens from
// a fixed-algorithm generator (SplitMix64) so every platform serves the same workload.
struct WorkloadShape {
  int32_t count = 0;
  int32_t prompt_min = 1, prompt_max = 1;
  int32_t new_min = 1, new_max = 1;
  RequestId first_id = 1;
  uint64_t seed = 0;
};

inline uint64_t splitmix64(uint64_t& state) {
  uint64_t z = (state += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

inline int32_t uniform_in(uint64_t& state, int32_t lo, int32_t hi) {
  return lo + static_cast<int32_t>(splitmix64(state) % static_cast<uint64_t>(hi - lo + 1));
}

inline std::vector<RequestSpec> workload(const WorkloadShape& shape, int32_t vocab) {
  std::vector<RequestSpec> requests;
  uint64_t state = shape.seed;
  for (int32_t i = 0; i < shape.count; ++i) {
    RequestSpec r;
    r.id = shape.first_id + static_cast<RequestId>(i);
    const int32_t length = uniform_in(state, shape.prompt_min, shape.prompt_max);
    for (int32_t t = 0; t < length; ++t) r.prompt.push_back(uniform_in(state, 0, vocab - 1));
    r.max_new_tokens = uniform_in(state, shape.new_min, shape.new_max);
    if (r.id % 3 == 1) {
      r.sampling = {.temperature = 0.8f, .top_k = 40, .seed = r.id * 7};
    } else if (r.id % 3 == 2) {
      r.sampling = {.temperature = 1.1f, .top_p = 0.9f, .seed = 1000 + r.id};
    }
    requests.push_back(std::move(r));
  }
  return requests;
}

// The workloads of the column's tests, shared by the GPU tests and the CPU dry runs (the
// scheduler's decisions depend on lengths only, so a run on the CPU reference retracts, batches and
// chunks exactly as the GPU run will).

// Retraction under page pressure at batch up to 64: 160 requests of 1..48 prompt tokens asking
// 48..200 new ones; a step's budget is 192 tokens (prefill plus one per decode row); 170 pages of
// 16 hold 64 rows' prompts but not their growth (28 swaps, 31 recomputes on the CPU reference), so the scheduler retracts — by swap to 1,024
// host pages (a request still prefilling is always recomputed) or, with no host pages, by
// recompute alone.
inline constexpr WorkloadShape kPressureWorkload{
    .count = 160, .prompt_min = 1, .prompt_max = 48, .new_min = 48, .new_max = 200, .seed = 15};

inline SchedulerConfig pressure_config(bool swap) {
  SchedulerConfig c;
  c.max_batch_rows = 64;
  c.context_length = 256;
  c.page_size = 16;
  c.prefill_chunk_tokens = 192;
  c.pages_count = 170;
  c.host_pages_count = swap ? 1024 : 0;
  return c;
}

// A request alone under `batched`'s limits: pages for the whole context, no host pages, and a
// different chunk budget, so that its prompt is cut elsewhere too.
inline SchedulerConfig solo_config(const SchedulerConfig& batched, int32_t chunk_tokens) {
  SchedulerConfig c = batched;
  c.prefill_chunk_tokens = chunk_tokens;
  c.pages_count = c.table_width() + 2;
  c.host_pages_count = 0;
  return c;
}

// Context 4096: 56 requests of 1..300 prompt tokens decoding 320..480 new ones, then 8 of
// 3600..3800 prompt tokens asking 296..496 (capped at the context: they reach 3,965..4,096 tokens,
// five of them 4,096) whose prompts are prefilled in chunks beside the decoding rows: 64 rows in a
// step (on the CPU reference at 240- and 1,000-token budgets).
inline constexpr int32_t kLongContext = 4096;
inline constexpr WorkloadShape kShortBesideLong{
    .count = 56, .prompt_min = 1, .prompt_max = 300, .new_min = 320, .new_max = 480, .seed = 41};
inline constexpr WorkloadShape kLong{.count = 8, .prompt_min = 3600, .prompt_max = 3800,
                                     .new_min = 296, .new_max = 496, .first_id = 57, .seed = 42};

inline std::vector<RequestSpec> long_context_workload(int32_t vocab) {
  std::vector<RequestSpec> requests = workload(kShortBesideLong, vocab);
  for (RequestSpec& r : workload(kLong, vocab)) requests.push_back(std::move(r));
  return requests;
}

inline SchedulerConfig long_context_config(int32_t chunk_tokens) {
  SchedulerConfig c;
  c.max_batch_rows = 64;
  c.context_length = kLongContext;
  c.page_size = 16;
  c.prefill_chunk_tokens = chunk_tokens;
  c.pages_count = 6000;
  return c;
}

}  // namespace ls::column
