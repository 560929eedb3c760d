// The benchmark's profile option CudaBackendOptions::leave_out (`lockstep_gpu_bench --leave-out`):
// every kernel or part it names is really left out of the step (the tokens a served run generates
// change), and what it cannot cover is refused by name.
#include "core/check.h"
#include "kernels/cuda_backend.h"
#include "tests/gpu/backend_test_support.h"
#include "tests/gpu/gpu_test_support.h"
#include "tests/hybrid_checkpoint.h"
#include "tests/test_support.h"

#include <fmt/format.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>

namespace ls {
namespace {

using ::testing::HasSubstr;
using ::testing::ThrowsMessage;

// testing::tiled_weights' shape with llama's attention: 4 query heads a KV head at head_dim 64,
// where the split kernel's parts (LeaveOut::kAttentionBody, kAttentionKvReads,
// kAttentionArithmetic) exist, so every kind can be left out.
const ModelWeights& group4_weights() {
  static const ModelWeights weights = [] {
    ModelConfig c = testing::tiled_weights().config;
    c.name = "tiny-wide-group4";
    c.kv_heads_count = 2;
    return weights_from_seed(c, 7);
  }();
  return weights;
}

// Prompts past one attention split (128 keys) so that the combine runs, and short ones; served
// at batch 16 with graphs, as the bench decodes.
gpu_test::Outcomes served(uint32_t leave_out) {
  const SchedulerConfig config = gpu_test::tiny_scheduler();
  const int32_t vocab = group4_weights().config.vocab_size;
  CudaBackend backend(group4_weights(), executor_config_for(config),
                      CudaBackendOptions{.graphs = true, .leave_out = leave_out});
  return gpu_test::generate(backend, config, vocab,
                            gpu_test::greedy_requests(12, 200, 6, vocab));
}

TEST(CudaLeaveOut, EveryKernelItNamesIsLeftOutOfTheStep) {
  LS_SKIP_WITHOUT_DEVICE();
  const gpu_test::Outcomes whole = served(0);
  const gpu_test::Agreement again = gpu_test::compare(whole, served(0));
  ASSERT_EQ(again.equal_count, again.total_count) << "the whole step is not repeatable";
  for (const LeaveOut what : kLeaveOutKinds) {
    const gpu_test::Agreement agreement =
        gpu_test::compare(whole, served(static_cast<uint32_t>(what)));
    EXPECT_LT(agreement.equal_count, agreement.total_count)
        << to_string(what) << " left out, yet every request generated the whole step's tokens";
  }
}

TEST(CudaLeaveOut, WhatTheProfileCannotCoverIsRefusedByName) {
  LS_SKIP_WITHOUT_DEVICE();
  const ExecutorConfig ec = executor_config_for(gpu_test::tiny_scheduler());
  const auto build = [&](const CudaBackendOptions& o) {
    CudaBackend b(testing::tiny_weights(), ec, o);
  };
  const auto attention = static_cast<uint32_t>(LeaveOut::kAttention);
  EXPECT_THAT([&] { build({.leave_out = kLeaveOutAll + 1}); },
              ThrowsMessage<Error>(HasSubstr(fmt::format("bits {:#x} name no kernel",
                                                         kLeaveOutAll + 1))));
  const auto body = static_cast<uint32_t>(LeaveOut::kAttentionBody);
  const auto kv_reads = static_cast<uint32_t>(LeaveOut::kAttentionKvReads);
  const std::string parts_need = "attention's parts need head_dim 64 or 128 (the tensor-core "
                                 "kernel) and 4 query heads a KV head, not ";
  EXPECT_THAT([&] { build({.leave_out = body}); },
              ThrowsMessage<Error>(HasSubstr(parts_need + "head_dim 16 and 2")));  // tiny
  EXPECT_THAT([&] {
    CudaBackend b(testing::tiled_weights(), ec, CudaBackendOptions{.leave_out = kv_reads});
  }, ThrowsMessage<Error>(HasSubstr(parts_need + "head_dim 64 and 2")));
  EXPECT_THAT([&] {
    CudaBackend b(group4_weights(), ec, CudaBackendOptions{.leave_out = body | kv_reads});
  }, ThrowsMessage<Error>(HasSubstr("attention_body, attention_kv_reads and attention_arithmetic "
                                    "are parts of one kernel, left out one at a time")));
  const auto arithmetic = static_cast<uint32_t>(LeaveOut::kAttentionArithmetic);
  EXPECT_THAT([&] {
    CudaBackend b(group4_weights(), ec, CudaBackendOptions{.leave_out = kv_reads | arithmetic});
  }, ThrowsMessage<Error>(HasSubstr("are parts of one kernel, left out one at a time")));
  EXPECT_THAT([&] { build({.precision = CudaPrecision::kFp32, .leave_out = attention}); },
              ThrowsMessage<Error>(HasSubstr("leave_out (a benchmark's profile) runs bf16 only")));
  EXPECT_THAT([&] { build(batch_invariant_options({.leave_out = attention})); },
              ThrowsMessage<Error>(HasSubstr("does not cover batch-invariant mode")));
  EXPECT_THAT([&] { build({.leave_out = attention, .drafter = "ngram"}); },
              ThrowsMessage<Error>(HasSubstr("does not cover a drafter ('ngram')")));
  ExecutorConfig hybrid_config = testing::small_config();
  hybrid_config.mamba_slots_count = 12;
  EXPECT_THAT([&] {
    CudaBackend b(testing::hybrid_checkpoint_weights(), hybrid_config,
                  CudaBackendOptions{.leave_out = attention});
  }, ThrowsMessage<Error>(HasSubstr("leave_out (a benchmark's profile) does not cover Mamba")));
  CudaBackend profiled(testing::tiny_weights(), ec, CudaBackendOptions{.leave_out = attention});
  EXPECT_THAT([&] { profiled.capture_activations(ActivationCapture::kDigests); },
              ThrowsMessage<Error>(HasSubstr("leaves kernels out of every step")));
}

}  // namespace
}  // namespace ls
