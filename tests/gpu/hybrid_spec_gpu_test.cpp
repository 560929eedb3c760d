// Speculative decoding on a hybrid (Mamba2 + attention) model on the CUDA backend (issue 19): the
// mixer's verify rows leave the state after each verify token in the verify-state slots, the
// commit copies the state after the last accepted token into the working slot, and the
// page-boundary snapshot follows the rule with a drafter — all inside decode graphs. Compared
// with the CPU reference (core/cpu_backend.cpp commit_verified_state, snapshot_verified_row):
//   - step by step, a scripted run with the n-gram drafter on both backends: accepted lengths and
//     tokens equal, working and checkpoint states within fp32 reordering error;
//   - served through the scheduler: greedy tokens with the n-gram drafter at W = 2 and 4 equal the
//     W = 1 tokens on CUDA fp32 (every sequence), and agree with the CPU reference's.
// What is bit-identical and what is not: the mixer runs a verify row's tokens through the same
// single-step updates in the same order as W = 1 decode steps, so on one backend the recurrence
// itself adds no difference; the GEMMs (cuBLAS, its algorithm chosen by the token count) and the
// attention over a verify row may round differently from W single-token steps, so on CUDA the
// claim is equal greedy tokens (as for attention-only models, tests/gpu/drafter_gpu_test.cpp),
// not equal logits bits. The CPU reference's bit-identity is tests/hybrid_spec_test.cpp's.
#include "core/cpu_backend.h"
#include "core/drafter.h"
#include "core/executor.h"
#include "core/scheduler.h"
#include "core/serving_loop.h"
#include "kernels/cuda_backend.h"
#include "kernels/mamba_ops.h"
#include "tests/gpu/backend_test_support.h"
#include "tests/gpu/gpu_test_support.h"
#include "tests/hybrid_checkpoint.h"
#include "tests/test_support.h"

#include <gtest/gtest.h>

#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <functional>

namespace ls {
namespace {

namespace fs = std::filesystem;
using testing::decode_row;
using testing::pages_from;
using testing::prefill_row;

constexpr int32_t kVocab = 512;

const ModelWeights& hybrid() { return testing::hybrid_checkpoint_weights(); }

// A prompt that repeats a short phrase, so the n-gram drafter proposes (and some drafts land).
std::vector<int32_t> phrase_prompt(RequestId id, int32_t length, int32_t phrase) {
  std::vector<int32_t> prompt;
  for (int32_t t = 0; t < length; ++t) {
    prompt.push_back(static_cast<int32_t>((id * 53 + static_cast<uint64_t>(t % phrase) * 29 + 7) % kVocab));
  }
  return prompt;
}

// ---- The pool-op kernels, by hand ----------------------------------------------------------

// The commit's pairs (CpuBackend::commit_verified_state): a verified row with a' = vcl − vcl_before
// ≥ 1 copies verify-state slot base + a' − 1 into its working slot; a' = 0 (the context clamp), an
// unverified row (base −1) and a padded row (slot −1) copy nothing.
TEST(HybridSpecKernels, CommitPairsTakeTheStateAfterTheLastAcceptedToken) {
  LS_SKIP_WITHOUT_DEVICE();
  const std::vector<int32_t> slots = {0, 3, 5, 2, -1};
  const std::vector<int32_t> verify_base = {20, 24, -1, 32, 36};
  const std::vector<int32_t> pool_rows = {1, 2, 3, 4, 3};
  const std::vector<int32_t> vcl = {0, 13, 7, 9, 40};  // by pool row
  const std::vector<int32_t> vcl_before = {10, 7, 8, 38, 8};
  // a' = 3, 0, (unverified), 2, 1 (padded row): (22 → 0), none, none, (33 → 2), none.
  const std::vector<int32_t> expected = {22, 0, -1, -1, -1, -1, 33, 2, -1, -1};
  gpu_test::DeviceBuffer<int32_t> d_slots(slots), d_base(verify_base), d_rows(pool_rows),
      d_vcl(vcl), d_before(vcl_before), d_pairs(10);
  ASSERT_EQ(kernels::launch_mamba_verify_commit_pairs(d_slots.ptr, d_base.ptr, 5, d_rows.ptr,
                                                      d_vcl.ptr, d_before.ptr, d_pairs.ptr, nullptr),
            cudaSuccess);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  EXPECT_EQ(d_pairs.download(), expected);
}

// The snapshot rule with a drafter on the device (CpuBackend::snapshot_verified_row): P = 4; a
// verified row with old 6 → new 9 crossed 8 after 2 of its tokens (src base + 1); 6 → 7 crossed
// nothing; 7 → 8 crossed 8 after its first token (src base + 0); an unverified row keeps the rule
// without a drafter (vcl 12 ends a page: src = its working slot).
TEST(HybridSpecKernels, SnapshotPairsFollowTheRuleWithADrafter) {
  LS_SKIP_WITHOUT_DEVICE();
  const std::vector<int32_t> pool_rows = {1, 2, 3, 4};
  const std::vector<int32_t> vcl = {0, 9, 7, 8, 12};  // by pool row
  const std::vector<int32_t> vcl_before = {6, 6, 7, 11};
  const std::vector<int32_t> verify_base = {40, 44, 48, -1};
  const std::vector<int32_t> snapshots = {0, 0, 10, 1, 1, 11, 2, 2, 12, 3, 3, 13};
  const std::vector<int32_t> expected = {41, 10, -1, -1, 48, 12, 3, 13};
  gpu_test::DeviceBuffer<int32_t> d_snapshots(snapshots), d_rows(pool_rows), d_vcl(vcl),
      d_before(vcl_before), d_base(verify_base), d_pairs(8);
  ASSERT_EQ(kernels::launch_mamba_snapshot_pairs(d_snapshots.ptr, 4, d_rows.ptr, d_vcl.ptr, 4,
                                                 d_pairs.ptr, nullptr, d_base.ptr, d_before.ptr),
            cudaSuccess);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  EXPECT_EQ(d_pairs.download(), expected);
  // Only one of verify_base and vcl_before: refused.
  EXPECT_EQ(kernels::launch_mamba_snapshot_pairs(d_snapshots.ptr, 4, d_rows.ptr, d_vcl.ptr, 4,
                                                 d_pairs.ptr, nullptr, d_base.ptr, nullptr),
            cudaErrorInvalidValue);
}

// ---- Step by step against the CPU ---------------------------------------------------------

constexpr int32_t kWidth = 4;
constexpr int32_t kScriptDecodeSteps = 12;
constexpr int32_t kWatched[] = {0, 1, 6, 7};  // the two working slots, their checkpoint slots

ExecutorConfig script_config() {
  ExecutorConfig c = testing::small_config();  // B 8, L 64, P 4
  c.verify_width = kWidth;
  c.mamba_slots_count = 8;
  c.prefill_chunk_tokens = 96;
  return c;
}

// Two requests prefilled side by side (a repeated phrase and a plain prompt), then decode steps
// of both with W = 4 and a checkpoint candidate each (slots 6 and 7).
std::vector<ForwardOp> script() {
  std::vector<ForwardOp> ops;
  ForwardOp prefill;
  prefill.rows = {prefill_row(1, 1, 0, 21, 21), prefill_row(2, 2, 0, 13, 13)};
  prefill.rows[0].mamba_working = 0, prefill.rows[0].refresh = {0, pages_from(10, 20)};
  prefill.rows[1].mamba_working = 1, prefill.rows[1].refresh = {0, pages_from(40, 20)};
  prefill.rows[0].sampling = prefill.rows[1].sampling = SamplingParams{};
  prefill.prefill_token_ids = phrase_prompt(1, 21, 5);
  const std::vector<int32_t> other = testing::prompt_for(2, 13);
  prefill.prefill_token_ids.insert(prefill.prefill_token_ids.end(), other.begin(), other.end());
  ops.push_back(prefill);
  ForwardOp decode;
  decode.rows = {decode_row(1, 1, kWidth), decode_row(2, 2, kWidth)};
  decode.rows[0].mamba_working = 0, decode.rows[0].mamba_checkpoint_dst = 6;
  decode.rows[1].mamba_working = 1, decode.rows[1].mamba_checkpoint_dst = 7;
  for (int32_t s = 0; s < kScriptDecodeSteps; ++s) ops.push_back(decode);
  return ops;
}

struct ScriptStep {
  std::vector<int32_t> tokens;
  std::vector<int32_t> accepted;
  std::vector<std::vector<float>> states;  // by kWatched
};

std::vector<ScriptStep> run_script(Backend& backend,
                                   const std::function<std::vector<float>(int32_t)>& read_state) {
  const ExecutorConfig c = script_config();
  Executor executor(c, kVocab, backend);
  std::vector<ScriptStep> out;
  for (const ForwardOp& op : script()) {
    const StepResult r = executor.step(op);
    ScriptStep s{r.tokens, r.accepted_lengths, {}};
    for (const int32_t slot : kWatched) s.states.push_back(read_state(slot));
    out.push_back(std::move(s));
  }
  return out;
}

// The CPU reference with its n-gram drafter against CUDA fp32 with its device n-gram drafter,
// eagerly and in decode graphs: each step's tokens and accepted lengths equal (the drafts come
// from the same history), the working slots (the state after the last accepted token) and the
// checkpoint slots (the state at the page boundary crossed) within fp32 reordering error; and
// some step accepted fewer than W tokens but more than one (a partial acceptance was committed).
TEST(HybridSpecGpu, VerifiedRowsCommitAndCheckpointAsTheCpuDoes) {
  LS_SKIP_WITHOUT_DEVICE();
  CpuBackend cpu(hybrid(), script_config(), nullptr, false, std::make_unique<NgramDrafter>());
  const std::vector<ScriptStep> expected =
      run_script(cpu, [&cpu](int32_t s) { return cpu.read_mamba_state(s); });
  int32_t partial = 0;
  for (const ScriptStep& s : expected) {
    for (const int32_t a : s.accepted) partial += a > 1 && a < kWidth ? 1 : 0;
  }
  std::printf("hybrid spec script: %d verified rows accepted 2..%d tokens on the CPU\n", partial,
              kWidth - 1);
  for (const bool graphs : {false, true}) {
    SCOPED_TRACE(graphs ? "graphs" : "eager");
    CudaBackendOptions options{.precision = CudaPrecision::kFp32, .graphs = graphs};
    options.drafter = "ngram";
    CudaBackend cuda(hybrid(), script_config(), options);
    const std::vector<ScriptStep> got =
        run_script(cuda, [&cuda](int32_t s) { return cuda.read_mamba_state(s); });
    ASSERT_EQ(got.size(), expected.size());
    for (size_t s = 0; s < got.size(); ++s) {
      EXPECT_EQ(got[s].tokens, expected[s].tokens) << "step " << s;
      EXPECT_EQ(got[s].accepted, expected[s].accepted) << "step " << s;
      for (size_t w = 0; w < std::size(kWatched); ++w) {
        EXPECT_LT(gpu_test::relative_error(got[s].states[w], expected[s].states[w]), 1e-4)
            << "step " << s << " slot " << kWatched[w];
      }
    }
    if (graphs) {
      EXPECT_GT(cuda.graph_replays_count(), 0);
    }
  }
}

// ---- Served through the scheduler ---------------------------------------------------------

SchedulerConfig served_config(int32_t width, bool prefix_cache) {
  Limits limits;
  limits.max_batch_rows = 8;
  limits.context_length = 256;
  limits.page_size = 16;
  limits.pages_count = 300;
  limits.prefill_chunk_tokens = 64;
  limits.verify_width = width;
  limits.mamba_slots_count = prefix_cache ? 24 : 8;
  SchedulerConfig c = scheduler_config_for_model(limits, hybrid().config);
  c.prefix_cache = prefix_cache;
  return c;
}

std::vector<RequestSpec> served_requests() {
  std::vector<RequestSpec> requests;
  for (int32_t i = 0; i < 16; ++i) {
    const RequestId id = static_cast<RequestId>(i + 1);
    const int32_t length = 40 + (i * 23) % 90;
    requests.push_back(RequestSpec{
        .id = id,
        .prompt = i % 2 == 0 ? phrase_prompt(id, length, 3 + i % 5) : testing::prompt_for(id, length),
        .max_new_tokens = 32});
  }
  return requests;
}

gpu_test::Served serve(Backend& backend, const SchedulerConfig& sc) {
  return gpu_test::serve(backend, sc, kVocab, served_requests());
}

class HybridSpecServed : public ::testing::TestWithParam<bool> {};

// CUDA fp32, graphs off and on, with and without the prefix cache: greedy tokens with the device
// n-gram drafter at W = 2 and 4 equal the W = 1 tokens for every sequence, and agree with the CPU
// reference's (the CPU at W = 4 with its n-gram drafter) on ≥ 95% of tokens.
TEST_P(HybridSpecServed, GreedyTokensWithTheNgramDrafterEqualWidthOne) {
  LS_SKIP_WITHOUT_DEVICE();
  const bool graphs = GetParam();
  const CudaBackendOptions plain{.precision = CudaPrecision::kFp32, .graphs = graphs};
  for (const bool prefix_cache : {false, true}) {
    SCOPED_TRACE(prefix_cache ? "prefix cache" : "no prefix cache");
    const SchedulerConfig sc1 = served_config(1, prefix_cache);
    CudaBackend reference_backend(hybrid(), executor_config_for(sc1), plain);
    const gpu_test::Served reference = serve(reference_backend, sc1);
    ASSERT_EQ(reference.tokens.size(), 16u);
    for (const int32_t w : {2, 4}) {
      CudaBackendOptions options = plain;
      options.drafter = "ngram";
      const SchedulerConfig sc = served_config(w, prefix_cache);
      CudaBackend backend(hybrid(), executor_config_for(sc), options);
      const gpu_test::Served run = serve(backend, sc);
      const gpu_test::Agreement a = gpu_test::compare(reference.tokens, run.tokens);
      std::printf("hybrid spec (fp32, graphs %d, prefix cache %d), W %d + ngram: %d of %d "
                  "sequences equal W = 1; %ld steps against %ld\n", graphs ? 1 : 0,
                  prefix_cache ? 1 : 0, w, a.equal_count, a.total_count,
                  static_cast<long>(run.steps), static_cast<long>(reference.steps));
      EXPECT_EQ(a.equal_count, 16) << "W " << w << ": first mismatch: request " << a.first_mismatch
                                   << " at token " << a.first_mismatch_index;
      if (graphs) {
        EXPECT_GT(backend.graph_replays_count(), 0);
      }
      if (w != 4) continue;
      CpuBackend cpu(hybrid(), executor_config_for(sc), nullptr, false,
                     std::make_unique<NgramDrafter>());
      const gpu_test::Served cpu_run = serve(cpu, sc);
      const gpu_test::Agreement c = gpu_test::compare(cpu_run.tokens, run.tokens);
      std::printf("hybrid spec W 4, CUDA fp32 vs CPU: %ld of %ld tokens equal\n",
                  static_cast<long>(c.tokens_equal), static_cast<long>(c.tokens_total));
      EXPECT_GE(c.tokens_equal * 100, c.tokens_total * 95);
    }
  }
}

INSTANTIATE_TEST_SUITE_P(GraphsOffOn, HybridSpecServed, ::testing::Values(false, true));

}  // namespace
}  // namespace ls
