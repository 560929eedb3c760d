// Simulator throughput: simulated steps per second with the `tiny` model and with the model
// stubbed out (the control plane alone: scheduler, executor rules, checkers), and seeds per minute
// for a 50-request seed with its twin run. Run: build/bench/lockstep_bench_sim
#include "core/model/weights.h"
#include "sim/sweep.h"

#include <benchmark/benchmark.h>

namespace {

constexpr int32_t kRequests = 50;

const ls::ModelWeights& weights() {
  static const ls::ModelWeights w = ls::weights_from_seed(ls::model_config_named("tiny"), 0);
  return w;
}

ls::sim::SimParams params(uint64_t seed) {
  ls::sim::SimOverrides o;
  o.requests_count = kRequests;
  return ls::sim::derive_params(seed, o);
}

void run_steps(benchmark::State& state, bool stub) {
  int64_t steps = 0;
  uint64_t seed = 1;
  for (auto _ : state) {
    const ls::sim::SimSummary s = ls::sim::run_world(params(seed++ % 16 + 1), weights(), {.stub_model = stub});
    if (!s.passed()) state.SkipWithError("a checker failed");
    steps += s.steps_count;
  }
  state.counters["steps_per_second"] = benchmark::Counter(static_cast<double>(steps), benchmark::Counter::kIsRate);
}

void BM_SimStepsTiny(benchmark::State& state) { run_steps(state, false); }
void BM_SimStepsStubbedModel(benchmark::State& state) { run_steps(state, true); }

void BM_SeedsPerMinuteWithTwin(benchmark::State& state) {
  uint64_t seed = 1;
  int64_t seeds = 0;
  for (auto _ : state) {
    const ls::sim::SeedVerdict v = ls::sim::run_seed(params(seed++ % 16 + 1), weights(), {}, true);
    if (!v.passed()) state.SkipWithError("a seed failed");
    ++seeds;
  }
  state.counters["seeds_per_minute"] =
      benchmark::Counter(static_cast<double>(seeds) * 60.0, benchmark::Counter::kIsRate);
}

}  // namespace

BENCHMARK(BM_SimStepsTiny)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_SimStepsStubbedModel)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_SeedsPerMinuteWithTwin)->Unit(benchmark::kMillisecond);
BENCHMARK_MAIN();
