// The CUDA column of the determinism table in batch-invariant mode (issue 15), bf16, bit for bit:
// every test serves a workload through the production path (tests/invariant_column.h) and compares
// what the executor returns for each request — every emitted token, and at every sequence length
// both runs computed, the sampled token, the logprob's bits, the logits digest and the top-8 ids
// and logit bits — not only the final text.
//   - Retraction by swap and by recompute under page pressure at batch 64: each of 160 requests
//     equals its solo run (the re-prefill's and the ignored in-flight rows included).
//   - CUDA graphs on and off; the serving loop running ahead and one step at a time: the same rows.
//   - Context 4096: 8 requests whose prompts and outputs reach 3,965..4,096 tokens, prefilled in
//     240- and 1,000-token step budgets beside 56 decoding requests (64 rows), each of the 64 equal
//     to its solo run prefilled in 2,048-token chunks.
// The CPU reference runs the same driver and workloads (tests/invariant_column_test.cpp), which
// also shows that the comparison flags one altered bit.
#include "kernels/cuda_backend.h"
#include "tests/gpu/gpu_test_support.h"
#include "tests/invariant_column.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <string>

namespace ls {
namespace {

// llama-1b's family and attention geometry — head_dim 64 with four query heads per KV head (the
// tensor-core attention kernel), tied embeddings, RoPE base 500000 — at a width whose weights
// (15 MB of layers, an 8 MB LM head) stay in the H200's L2: batch-invariant mode streams the
// weights once per 64 tokens of prefill, which at llama-1b's own width would take minutes here. No
// max_positions bound (a named random shape), so context 4096 needs no override.
ModelConfig column_model() {
  ModelConfig c = model_config_named("llama-1b");
  c.name = "llama-1b-narrow";
  c.hidden_size = 512;
  c.layers_count = 2;
  c.query_heads_count = 8;
  c.kv_heads_count = 2;
  c.ffn_size = 2048;
  c.vocab_size = 8192;
  return c;
}

constexpr uint64_t kWeightsSeed = 15;

int32_t vocab() { return column_model().vocab_size; }

struct CudaRun {
  column::Served served;
  int64_t graph_replays = 0;
};

CudaRun serve_on_cuda(const SchedulerConfig& config, const std::vector<RequestSpec>& requests,
                      bool graphs = true, bool run_ahead = true) {
  CudaBackend backend(DeviceSeededWeights{column_model(), kWeightsSeed}, executor_config_for(config),
                      batch_invariant_options({.graphs = graphs}));
  CudaRun run{.served = column::serve(backend, config, vocab(), requests, run_ahead)};
  run.graph_replays = backend.graph_replays_count();
  return run;
}

column::Served solo_on_cuda(const SchedulerConfig& config, const std::vector<RequestSpec>& requests) {
  CudaBackend backend(DeviceSeededWeights{column_model(), kWeightsSeed}, executor_config_for(config),
                      batch_invariant_options({.graphs = true}));
  column::Served solo = column::serve_each_alone(backend, config, vocab(), requests);
  EXPECT_EQ(solo.rows_in_step_max, 1);
  EXPECT_EQ(solo.swap_retractions + solo.recompute_retractions, 0);
  return solo;
}

// `run` held to `reference`; the oracle must not be degenerate (random weights of this size
// repeat tokens, so distinct digests are the stronger measure).
void expect_same_bits(const column::Served& reference, const column::Served& run,
                      const std::vector<RequestSpec>& requests, column::Match match, const char* what) {
  const column::Comparison c = column::compare(reference, run, requests, match);
  EXPECT_EQ(c.difference, "") << what;
  EXPECT_GT(c.distinct_digests.size(), requests.size() * 8) << what << ": the digests are degenerate";
  EXPECT_GT(c.distinct_tokens.size(), 32u) << what << ": the tokens are degenerate";
  std::printf("%s: %ld steps, %d rows at most, rows up to sequence length %d, %ld swaps, %ld "
              "recomputes; %ld tokens and %ld rows compared (%zu distinct digests): %s\n",
              what, static_cast<long>(run.steps_count), run.rows_in_step_max, run.sequence_length_max,
              static_cast<long>(run.swap_retractions), static_cast<long>(run.recompute_retractions),
              static_cast<long>(c.tokens_compared), static_cast<long>(c.rows_compared),
              c.distinct_digests.size(), c.difference.empty() ? "identical" : c.difference.c_str());
}

void expect_solo_bits_under_retraction(bool swap) {
  const std::vector<RequestSpec> requests = column::workload(column::kPressureWorkload, vocab());
  const SchedulerConfig batched = column::pressure_config(swap);
  const column::Served run = serve_on_cuda(batched, requests).served;
  EXPECT_EQ(run.rows_in_step_max, 64);
  if (swap) {
    EXPECT_GT(run.swap_retractions, 0);
  } else {
    EXPECT_EQ(run.swap_retractions, 0);
    EXPECT_GT(run.recompute_retractions, 0);
  }
  const column::Served solo = solo_on_cuda(column::solo_config(batched, 13), requests);
  expect_same_bits(solo, run, requests, column::Match::kSolo,
                   swap ? "retraction by swap vs solo" : "retraction by recompute vs solo");
}

TEST(CudaInvariantColumn, RetractionBySwapGivesEverySoloRunsBits) {
  LS_SKIP_WITHOUT_DEVICE();
  expect_solo_bits_under_retraction(true);
}

TEST(CudaInvariantColumn, RetractionByRecomputeGivesEverySoloRunsBits) {
  LS_SKIP_WITHOUT_DEVICE();
  expect_solo_bits_under_retraction(false);
}

TEST(CudaInvariantColumn, GraphsOnAndOffGiveTheSameBits) {
  LS_SKIP_WITHOUT_DEVICE();
  const std::vector<RequestSpec> requests = column::workload(column::kPressureWorkload, vocab());
  const SchedulerConfig config = column::pressure_config(/*swap=*/true);
  const CudaRun graphs = serve_on_cuda(config, requests, /*graphs=*/true);
  const CudaRun eager = serve_on_cuda(config, requests, /*graphs=*/false);
  EXPECT_GT(graphs.graph_replays, 0);
  EXPECT_EQ(eager.graph_replays, 0);
  EXPECT_EQ(graphs.served.steps_count, eager.served.steps_count);
  expect_same_bits(eager.served, graphs.served, requests, column::Match::kSameSchedule,
                   "graphs vs eager");
}

TEST(CudaInvariantColumn, RunAheadAndOneStepAtATimeGiveTheSameBits) {
  LS_SKIP_WITHOUT_DEVICE();
  const std::vector<RequestSpec> requests = column::workload(column::kPressureWorkload, vocab());
  const SchedulerConfig config = column::pressure_config(/*swap=*/true);
  const column::Served ahead = serve_on_cuda(config, requests, true, /*run_ahead=*/true).served;
  const column::Served one = serve_on_cuda(config, requests, true, /*run_ahead=*/false).served;
  EXPECT_GT(ahead.steps_submitted_ahead, ahead.steps_count / 2) << "the loop did not run ahead";
  EXPECT_EQ(one.steps_submitted_ahead, 0);
  EXPECT_EQ(ahead.steps_count, one.steps_count);
  expect_same_bits(one, ahead, requests, column::Match::kSameSchedule,
                   "run ahead vs one step at a time");
}

TEST(CudaInvariantColumn, Context4096BesideSixtyThreeOthersGivesEverySoloRunsBits) {
  LS_SKIP_WITHOUT_DEVICE();
  const std::vector<RequestSpec> requests = column::long_context_workload(vocab());
  const column::Served solo = solo_on_cuda(column::long_context_config(2048), requests);
  for (const int32_t chunk_tokens : {240, 1000}) {
    const column::Served run = serve_on_cuda(column::long_context_config(chunk_tokens), requests).served;
    EXPECT_EQ(run.rows_in_step_max, 64) << chunk_tokens << "-token steps";
    EXPECT_GE(run.sequence_length_max, column::kLongContext - 16) << chunk_tokens << "-token steps";
    const std::string what = "context 4096, " + std::to_string(chunk_tokens) + "-token steps vs solo";
    expect_same_bits(solo, run, requests, column::Match::kSolo, what.c_str());
  }
}

}  // namespace
}  // namespace ls
