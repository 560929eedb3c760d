// The simulator's hybrid world (`lockstep sim --model tiny-hybrid`) on the CUDA backend: the same
// worlds, fault sites and checkers as tests/sim_test.cpp's CPU sweeps (SimSweep.Hybrid*), with
// the backend `lockstep sim --backend cuda` builds (decode graphs on, the seed's drafter). Among
// the checkers, mamba-padding reads each token's working slot from CudaBackend::read_inputs —
// the slots the device's mixer launches read — and mamba-state-owner the device's slot digests;
// the twin run must give the same fingerprint. Labelled `gpu`: run on the H200, skipped without a
// device.
#include "backends/backend_factory.h"
#include "sim/sweep.h"
#include "tests/gpu/gpu_test_support.h"
#include "tests/test_support.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <memory>

namespace ls {
namespace {

// What `lockstep sim --backend cuda` builds: graphs on, the seed's drafter.
sim::WorldOptions cuda_world() {
  sim::WorldOptions world;
  world.make_backend = [](const sim::SimParams& p, const ModelWeights& weights,
                          const ExecutorConfig& limits) {
    return make_backend(BackendSpec{.name = "cuda", .drafter = p.drafter_name()}, weights, limits);
  };
  return world;
}

struct Sweep {
  int64_t failed = 0;
  int64_t drafts_accepted = 0;  // decode rows that accepted a' >= 2 tokens: a draft was right
  int64_t swaps = 0;
};

Sweep sweep(const sim::SimOverrides& o, uint64_t seeds) {
  Sweep s;
  for (uint64_t seed = 1; seed <= seeds; ++seed) {
    const sim::SimParams params = sim::derive_params(seed, o);
    EXPECT_TRUE(params.recurrent_state);
    const sim::SeedVerdict v =
        sim::run_seed(params, testing::sim_weights(params.model), cuda_world(), /*twin=*/true);
    if (!v.passed()) {
      ++s.failed;
      ADD_FAILURE() << sim::reproduce_command(params, o) << " --backend cuda: "
                    << (v.summary.failures.empty() ? "twin fingerprint differs"
                                                   : v.summary.failures[0].checker + ": " +
                                                         v.summary.failures[0].detail);
    }
    const auto& accepted = v.summary.decode_rows_by_accepted;
    for (size_t a = 2; a < accepted.size(); ++a) s.drafts_accepted += accepted[a];
    s.swaps += v.summary.retractions_swap;
  }
  return s;
}

sim::SimOverrides hybrid_overrides(bool speculative) {
  sim::SimOverrides o;
  o.model = "tiny-hybrid";
  o.speculative = speculative;
  if (speculative) o.drafter = sim::SimDrafter::kNgram;  // oracle-mix runs on the CPU only
  std::vector<sim::FaultSite> all;
  for (int i = 0; i < sim::kFaultSitesCount; ++i) all.push_back(static_cast<sim::FaultSite>(i));
  o.faults = all;
  return o;
}

// 20 seeds with every fault site on (retraction by swap among them: the working state carried
// with the pages), every checker passing and the twin identical.
TEST(HybridSimGpu, SeedsWithEveryFaultSitePassOnCuda) {
  LS_SKIP_WITHOUT_DEVICE();
  const Sweep s = sweep(hybrid_overrides(false), 20);
  std::printf("hybrid sim on CUDA, 20 seeds: %ld failed, %ld swaps\n", static_cast<long>(s.failed),
              static_cast<long>(s.swaps));
  EXPECT_EQ(s.failed, 0);
  EXPECT_GT(s.swaps, 0);
}

// Speculative decoding on the hybrid with the n-gram drafter (verify-state slots, the commit of
// the accepted state, mixed steps of verified and prefill rows on the chunked scan): 12 seeds,
// every checker passing, and some verified row accepted a draft.
TEST(HybridSimGpu, SpeculativeSeedsPassOnCuda) {
  LS_SKIP_WITHOUT_DEVICE();
  const Sweep s = sweep(hybrid_overrides(true), 12);
  std::printf("hybrid sim --spec --drafter ngram on CUDA, 12 seeds: %ld failed, %ld decode rows "
              "accepted a draft\n",
              static_cast<long>(s.failed), static_cast<long>(s.drafts_accepted));
  EXPECT_EQ(s.failed, 0);
  EXPECT_GT(s.drafts_accepted, 0);
}

}  // namespace
}  // namespace ls
