#include "tests/hybrid_properties.h"

#include "core/check.h"
#include "core/cpu_backend.h"
#include "core/executor.h"
#include "core/model/weights.h"
#include "core/scheduler.h"
#include "proptest/rc_support.h"
#include "sim/checkers.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <map>

namespace ls::hybrid_props {

namespace {

constexpr int32_t kContextLength = 64;
constexpr int64_t kStepsMax = 5000;
constexpr uint64_t kWeightsSeed = 3;

const ModelWeights& weights() {
  static const ModelWeights w = weights_from_seed(model_config_named("tiny-hybrid"), kWeightsSeed);
  return w;
}

int32_t pages_per_request(const HybridWorkload& w) { return kContextLength / w.page_size + 2; }

SchedulerConfig config_of(const HybridWorkload& w, int32_t chunk, int32_t pages_count) {
  ExecutorConfig limits;
  limits.max_batch_rows = w.max_batch_rows;
  limits.context_length = kContextLength;
  limits.page_size = w.page_size;
  limits.pages_count = pages_count;
  limits.prefill_chunk_tokens = chunk;
  limits.mamba_slots_count = w.max_batch_rows;
  SchedulerConfig c = scheduler_config_for_model(limits, weights().config);
  c.overlap = w.overlap;
  return c;
}

std::vector<RequestSpec> requests_of(const HybridWorkload& w) {
  const int32_t vocab = weights().config.vocab_size;
  std::vector<RequestSpec> requests;
  for (size_t i = 0; i < w.prompt_lengths.size(); ++i) {
    RequestSpec r;
    r.id = static_cast<RequestId>(i + 1);
    for (int32_t t = 0; t < w.prompt_lengths[i]; ++t) {
      r.prompt.push_back(static_cast<int32_t>((r.id * 131 + static_cast<uint64_t>(t) * 29 + 7) % vocab));
    }
    r.max_new_tokens = w.new_tokens[i];
    if (!w.greedy[i]) r.sampling = SamplingParams{.temperature = 0.9f, .top_k = 40, .seed = r.id * 17};
    requests.push_back(std::move(r));
  }
  return requests;
}

// The simulator's recurrent-state checkers on one step (sim/checkers.h), "" when they hold.
struct SlotChecker {
  std::vector<int32_t> all_slots;
  std::vector<uint64_t> before;
  sim::MambaSlotOwners owners;

  std::string check(int64_t step, const ForwardOp& op, const Executor& executor,
                    const CpuBackend& backend, const Scheduler& scheduler) {
    const InputSnapshot inputs = backend.read_inputs();
    const std::vector<uint64_t> after = backend.read_mamba_digests(all_slots);
    sim::StepObservation o;
    o.step = step;
    o.op = &op;
    o.inputs = &inputs;
    o.plan = &executor.last_plan();
    o.mamba_before = &before;
    o.mamba_after = &after;
    std::vector<sim::CheckFailure> failures;
    sim::check_mamba_step(o, scheduler, owners, failures);
    if (failures.empty()) return "";
    return fmt::format("step {}: {}: {}", step, failures[0].checker, failures[0].detail);
  }
};

struct Served {
  std::map<RequestId, std::vector<int32_t>> tokens;
  int64_t retractions = 0;
  std::string failure;  // a broken slot check, a rejected op, a run that does not end
};

// The serving loop written out (the scheduler's plan, the executor's step, the result applied
// one step later with overlap), so the checker sees each step's state before and after.
Served serve(const HybridWorkload& w, int32_t chunk, int32_t pages_count, bool check_slots) {
  const SchedulerConfig config = config_of(w, chunk, pages_count);
  Scheduler scheduler(config);
  const std::vector<RequestSpec> requests = requests_of(w);
  for (const RequestSpec& r : requests) scheduler.submit(r, weights().config.vocab_size);
  const ExecutorConfig limits = executor_config_for(config);
  CpuBackend backend(weights(), limits);
  Executor executor(limits, weights().config.vocab_size, backend);
  SlotChecker checker;
  for (int32_t s = 0; s < limits.mamba_slots_count; ++s) checker.all_slots.push_back(s);
  Served served;
  std::optional<std::pair<ForwardOp, StepResult>> in_flight;
  for (int64_t step = 0; !scheduler.done(); ++step) {
    if (step >= kStepsMax) {
      served.failure = fmt::format("not done after {} steps", step);
      return served;
    }
    StepPlanOut plan = scheduler.plan();
    for (const SchedulerEvent& e : plan.events) served.retractions += e.kind == SchedulerEvent::Kind::kRetract;
    if (in_flight) scheduler.apply_result(in_flight->first, in_flight->second);
    in_flight.reset();
    if (plan.op.rows.empty()) continue;
    if (check_slots) checker.before = backend.read_mamba_digests(checker.all_slots);
    StepResult result;
    try {
      executor.step(plan.op, result);
    } catch (const Error& e) {
      served.failure = fmt::format("step {}: {}", step, e.what());
      return served;
    }
    if (check_slots) {
      served.failure = checker.check(step, plan.op, executor, backend, scheduler);
      if (!served.failure.empty()) return served;
    }
    if (config.overlap) {
      in_flight.emplace(std::move(plan.op), std::move(result));
    } else {
      scheduler.apply_result(plan.op, result);
    }
  }
  for (const RequestSpec& r : requests) served.tokens[r.id] = scheduler.outcomes().at(r.id).tokens;
  return served;
}

}  // namespace

std::string HybridWorkload::describe() const {
  std::vector<int32_t> greedy_rows(greedy.begin(), greedy.end());
  return fmt::format("B {} P {} chunks {} and {} overlap {} prompts [{}] new [{}] greedy [{}]",
                     max_batch_rows, page_size, chunk_a, chunk_b, overlap ? "on" : "off",
                     fmt::join(prompt_lengths, ", "), fmt::join(new_tokens, ", "),
                     fmt::join(greedy_rows, ", "));
}

void showValue(const HybridWorkload& w, std::ostream& os) { os << w.describe(); }

rc::Gen<HybridWorkload> gen_hybrid_workload() {
  return rc::gen::resize(rc_support::kGenSize, rc::gen::exec([] {
    HybridWorkload w;
    w.max_batch_rows = *rc::gen::inRange(2, 5);
    w.page_size = 1 << *rc::gen::inRange(1, 4);  // 2, 4 or 8: prompts cross several pages
    w.chunk_a = *rc::gen::inRange(1, 41);
    w.chunk_b = *rc::gen::inRange(1, 41);
    w.overlap = *rc::gen::inRange(0, 2) == 1;
    const int32_t requests = *rc::gen::inRange(1, 9);
    for (int32_t i = 0; i < requests; ++i) {
      w.prompt_lengths.push_back(*rc::gen::inRange(1, kContextLength - 16));
      w.new_tokens.push_back(*rc::gen::inRange(1, 9));
      w.greedy.push_back(static_cast<uint8_t>(*rc::gen::inRange(0, 2)));
    }
    return w;
  }));
}

// Chunking a with a pool roomy enough for every row, chunking b with room for about one request:
// b waits and retracts (recompute), a does not; every request's tokens must agree.
std::string tokens_same_across_chunkings_and_retraction(const HybridWorkload& w) {
  const int32_t roomy = w.max_batch_rows * pages_per_request(w) + 1;
  const int32_t tight = pages_per_request(w) + 1;
  const Served a = serve(w, w.chunk_a, roomy, /*check_slots=*/false);
  if (!a.failure.empty()) return fmt::format("{}: chunk {}: {}", w.describe(), w.chunk_a, a.failure);
  const Served b = serve(w, w.chunk_b, tight, /*check_slots=*/false);
  if (!b.failure.empty()) return fmt::format("{}: chunk {}: {}", w.describe(), w.chunk_b, b.failure);
  for (const auto& [id, tokens] : a.tokens) {
    if (tokens == b.tokens.at(id)) continue;
    return fmt::format("{}: request {}: chunk {} with {} pages gives [{}], chunk {} with {} pages "
                       "({} retractions) gives [{}]", w.describe(), id, w.chunk_a, roomy,
                       fmt::join(tokens, ", "), w.chunk_b, tight, b.retractions,
                       fmt::join(b.tokens.at(id), ", "));
  }
  return "";
}

int64_t tight_pool_retractions(const HybridWorkload& w) {
  return serve(w, w.chunk_b, pages_per_request(w) + 1, /*check_slots=*/false).retractions;
}

// Both chunkings, the tight pool (retraction churn hands slots to new requests).
std::string state_slots_kept(const HybridWorkload& w) {
  const int32_t tight = pages_per_request(w) + 1;
  for (const int32_t chunk : {w.chunk_a, w.chunk_b}) {
    const Served s = serve(w, chunk, tight, /*check_slots=*/true);
    if (!s.failure.empty()) return fmt::format("{}: chunk {}: {}", w.describe(), chunk, s.failure);
  }
  return "";
}

std::optional<std::string> counterexample(Property property, int cases) {
  const bool tokens = property == Property::kTokens;
  return rc_support::run_property(tokens ? "hybrid/tokens" : "hybrid/slots", cases, [&] {
    const HybridWorkload w = *gen_hybrid_workload();
    return tokens ? tokens_same_across_chunkings_and_retraction(w) : state_slots_kept(w);
  });
}

}  // namespace ls::hybrid_props
