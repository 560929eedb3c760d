// The chunked (SSD) scan of the Mamba2 mixer (kernels/mamba_scan.h) against the CPU reference
// mixer run token by token, and its bit-identity claims compared in bits: run to run, cuts on the
// block grid, a row whatever its batch and slot, a row with no complete block equal to the
// sequential scan, and a verified row in a mixed step equal to the same row in a decode step.
// Labelled `gpu`: run on the H200, skipped without a device.
//
// Tolerances. fp32 (≤ 1e-4 relative, outputs and states): the SSD form is the sequential
// recurrence reassociated — the decays e^{Δ·A} multiplied token by token become exponentials of
// sums of Δ·A, the state's sum over a block's tokens becomes a product over s ascending, C·h a
// sum of the block's start state and its tokens' terms — so each term differs from the CPU's by
// a few roundings of its own size (2^-24 each; the exponentials' arguments are summed over their
// own terms, ≤ 64 of them, so their rounding is relative to the decay that matters), and the
// sums over ≤ 256 state elements and ≤ 64 tokens add such errors of mixed sign: some 1e-6 to
// 1e-5 relative; 1e-4 leaves a margin and still fails on any real mistake (a missing decay, a
// term off the diagonal, a state not passed between blocks moves the result by far more than
// 1e-3). bf16 (≤ 8e-3 on the output): that plus one bf16 rounding of each output (≤ 2^-9).
#include "tests/gpu/mamba_test_support.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdio>
#include <initializer_list>
#include <span>
#include <string>
#include <vector>

namespace ls {
namespace {

using namespace mamba_test;  // NOLINT: the shared mixer fixtures
using gpu_test::relative_error;

constexpr double kChunkedFp32 = 1e-4;
constexpr double kChunkedBf16Output = 8e-3;
constexpr int32_t kGrid = kernels::kMambaScanChunk;

// A shape whose head_dim (80) and state (200) each need two tiles of the SSD kernels and whose
// state needs eight elements a lane in the sequential scan; conv 3 with a bias, two groups.
MambaConfig wide_shape() {
  return MambaConfig{.heads_count = 4, .head_dim = 80, .groups_count = 2, .state_size = 200,
                     .conv_kernel = 3, .conv_bias = true, .dt_min = 0.01f, .dt_max = 1.0f};
}

// Each token's absolute position: row r's tokens from starts[r].
std::vector<int32_t> positions_of(const Rows& rows, const std::vector<int32_t>& starts) {
  std::vector<int32_t> positions;
  for (size_t r = 0; r < rows.counts.size(); ++r) {
    for (int32_t i = 0; i < rows.counts[r]; ++i) positions.push_back(starts[r] + i);
  }
  return positions;
}

std::string describe(const MambaConfig& m) {
  return "shape heads " + std::to_string(m.heads_count) + " × " + std::to_string(m.head_dim) +
         ", groups " + std::to_string(m.groups_count) + ", state " +
         std::to_string(m.state_size);
}

// Rows cut every way the grid allows: from position 0 with three blocks and a tail; from 37 with
// a head, one block and a tail; a decode row; a padded row of 70; exactly one block at 128; a
// short row at 60 that reaches a grid point but no complete block. Slot 0 is among the real ones.
struct CutRows {
  Rows rows{.counts = {200, 130, 1, 70, 64, 9}, .slots = {2, 0, 4, -1, 5, 6}};
  std::vector<int32_t> starts = {0, 37, 12, 5, 128, 60};
};

// With `slow_decay`, A = −exp(a_log) in [−0.06, −0.05]: a state keeps a good part of itself over
// a block (e^{−0.05 · 64 · Δ}), so what the blocks pass each other matters in every output; the
// seeded A in [−4.5, −1] forgets within a few tokens.
LayerWeights mixer_for(const MambaConfig& m, uint32_t seed, bool slow_decay) {
  LayerWeights w = random_mixer(m, seed);
  if (slow_decay) {
    for (float& a : w.a_log) a = std::log(0.05f) + 0.1f * a;
  }
  return w;
}

template <typename T>
void expect_chunked_matches_the_reference(const MambaConfig& m, double output_tolerance,
                                          bool slow_decay) {
  const CutRows cut;
  const LayerWeights w = mixer_for(m, 211, slow_decay);
  const std::vector<float> pool = random_floats(size_t(kSlots) * slot_floats(m), 221, -1.0f, 1.0f);
  const std::vector<float> proj = random_proj(m, cut.rows.tokens(), 231);
  const std::vector<int32_t> positions = positions_of(cut.rows, cut.starts);
  const Result cpu = run_cpu(m, w, pool, cut.rows, proj);
  const Result gpu = run_gpu<T>(m, w, pool, cut.rows, proj, &positions);
  const std::string what =
      describe(m) + (slow_decay ? ", slow decay" : "") + ", seeds 211/221/231";
  ASSERT_GT(gpu_test::norm(cpu.out), 0.0) << what;
  const double error = relative_error(gpu.out, cpu.out);
  std::printf("chunked scan vs CPU, %s: output relative error %.3g\n", what.c_str(), error);
  EXPECT_LE(error, output_tolerance) << what;
  for (int32_t slot = 0; slot < kSlots; ++slot) {
    const bool touched = slot == 2 || slot == 0 || slot == 4 || slot == 5 || slot == 6;
    if (touched) {
      EXPECT_LE(relative_error(slot_of(m, gpu.pool, slot), slot_of(m, cpu.pool, slot)),
                kChunkedFp32)
          << what << ", slot " << slot;
    } else {
      EXPECT_TRUE(same_bits(slot_of(m, gpu.pool, slot), slot_of(m, pool, slot)))
          << what << ", slot " << slot;
    }
  }
  // The padded row's tokens [331, 401) are zeros.
  for (size_t i = size_t(331) * m.inner_size(); i < size_t(401) * m.inner_size(); ++i) {
    ASSERT_EQ(gpu.out[i], 0.0f) << what << ", element " << i;
  }
}

TEST(MambaChunkedScanGpu, Fp32MatchesTheCpuReferenceOverShapesAndCuts) {
  LS_SKIP_WITHOUT_DEVICE();
  for (const MambaConfig& m : {odd_shape(), bamba_like_shape(), wide_shape()}) {
    for (const bool slow_decay : {false, true}) {
      expect_chunked_matches_the_reference<float>(m, kChunkedFp32, slow_decay);
    }
  }
}

TEST(MambaChunkedScanGpu, Bf16MatchesTheCpuReferenceOverShapesAndCuts) {
  LS_SKIP_WITHOUT_DEVICE();
  for (const MambaConfig& m : {odd_shape(), bamba_like_shape(), wide_shape()}) {
    for (const bool slow_decay : {false, true}) {
      expect_chunked_matches_the_reference<bf16>(m, kChunkedBf16Output, slow_decay);
    }
  }
}

// Many blocks in a row: 1000 tokens from position 0 (15 blocks and a tail) against the sequential
// scan on the device, with the slow decay, so that a state pass that drifts from block to block
// shows.
TEST(MambaChunkedScanGpu, ALongRowStaysCloseToTheSequentialScan) {
  LS_SKIP_WITHOUT_DEVICE();
  const MambaConfig m = bamba_like_shape();
  const Rows rows{.counts = {1000}, .slots = {1}};
  const LayerWeights w = mixer_for(m, 241, true);
  const std::vector<float> pool = random_floats(size_t(kSlots) * slot_floats(m), 251, -1.0f, 1.0f);
  const std::vector<float> proj = random_proj(m, rows.tokens(), 261);
  const std::vector<int32_t> positions = positions_of(rows, {0});
  const Result sequential = run_gpu<float>(m, w, pool, rows, proj);
  const Result chunked = run_gpu<float>(m, w, pool, rows, proj, &positions);
  const double error = relative_error(chunked.out, sequential.out);
  std::printf("chunked vs sequential scan, 1000 tokens: output relative error %.3g\n", error);
  EXPECT_LE(error, kChunkedFp32) << "seeds 241/251/261";
  EXPECT_LE(relative_error(slot_of(m, chunked.pool, 1), slot_of(m, sequential.pool, 1)),
            kChunkedFp32);
}

template <typename T>
void expect_same_run_twice(const MambaConfig& m) {
  const CutRows cut;
  const LayerWeights w = random_mixer(m, 271);
  const std::vector<float> pool = random_floats(size_t(kSlots) * slot_floats(m), 281, -1.0f, 1.0f);
  const std::vector<float> proj = random_proj(m, cut.rows.tokens(), 291);
  const std::vector<int32_t> positions = positions_of(cut.rows, cut.starts);
  const Result first = run_gpu<T>(m, w, pool, cut.rows, proj, &positions);
  const Result second = run_gpu<T>(m, w, pool, cut.rows, proj, &positions);
  ASSERT_GT(gpu_test::norm(first.out), 0.0);
  EXPECT_TRUE(same_bits(first.out, second.out)) << describe(m);
  EXPECT_TRUE(same_bits(first.pool, second.pool)) << describe(m);
}

TEST(MambaChunkedScanGpu, RunTwiceIsBitIdentical) {
  LS_SKIP_WITHOUT_DEVICE();
  expect_same_run_twice<float>(bamba_like_shape());
  expect_same_run_twice<float>(wide_shape());
  expect_same_run_twice<bf16>(bamba_like_shape());
}

// One row prefilled from `start` in launches of `chunks` tokens (each a chunked launch at its
// absolute positions) on slot 3: the concatenated outputs and the pool.
template <typename T>
Result prefill_in_chunks(const MambaConfig& m, const DeviceMixer& mixer,
                         const std::vector<float>& pool, const std::vector<float>& proj,
                         int32_t start, const std::vector<int32_t>& chunks) {
  DeviceBuffer<float> d_pool(pool);
  std::vector<float> out;
  int32_t begin = 0;
  for (const int32_t count : chunks) {
    const Rows rows{.counts = {count}, .slots = {3}};
    const std::vector<int32_t> positions = positions_of(rows, {start + begin});
    const std::vector<float> part =
        launch<T>(m, mixer, d_pool, rows, tokens_of(m, proj, begin, count), &positions);
    out.insert(out.end(), part.begin(), part.end());
    begin += count;
  }
  return Result{std::move(out), d_pool.download()};
}

// A prompt of 300 tokens from position 0, and one of 238 resuming at position 40 (a prefix hit's
// state): whole, and cut only on grid points, the same bits; cut off the grid, the same function
// within the tolerance (not asserted equal in bits: the cut block runs sequentially in two
// pieces).
template <typename T>
void expect_grid_cuts_agree(const MambaConfig& m) {
  const LayerWeights w = mixer_for(m, 301, true);
  const DeviceMixer mixer(w);
  const std::vector<float> pool = random_floats(size_t(kSlots) * slot_floats(m), 311, -1.0f, 1.0f);
  const std::vector<float> proj = random_proj(m, 300, 321);
  const Result whole = prefill_in_chunks<T>(m, mixer, pool, proj, 0, {300});
  ASSERT_GT(gpu_test::norm(whole.out), 0.0);
  for (const std::vector<int32_t>& cuts :
       {std::vector<int32_t>{64, 128, 108}, std::vector<int32_t>{192, 108},
        std::vector<int32_t>{kGrid, kGrid, kGrid, kGrid, 44}}) {
    const Result cut = prefill_in_chunks<T>(m, mixer, pool, proj, 0, cuts);
    EXPECT_TRUE(same_bits(cut.out, whole.out)) << describe(m) << ", first cut " << cuts[0];
    EXPECT_TRUE(same_bits(cut.pool, whole.pool)) << describe(m) << ", first cut " << cuts[0];
  }
  const Result off_grid = prefill_in_chunks<T>(m, mixer, pool, proj, 0, {100, 200});
  EXPECT_LE(relative_error(off_grid.out, whole.out), sizeof(T) == 4 ? kChunkedFp32 : 1e-2);
  EXPECT_LE(relative_error(off_grid.pool, whole.pool), kChunkedFp32);
  const std::vector<float> resumed_proj = tokens_of(m, proj, 0, 238);
  const Result resumed = prefill_in_chunks<T>(m, mixer, pool, resumed_proj, 40, {238});
  const Result resumed_cut = prefill_in_chunks<T>(m, mixer, pool, resumed_proj, 40, {24, 64, 150});
  EXPECT_TRUE(same_bits(resumed_cut.out, resumed.out)) << describe(m) << ", from 40";
  EXPECT_TRUE(same_bits(resumed_cut.pool, resumed.pool)) << describe(m) << ", from 40";
}

TEST(MambaChunkedScanGpu, CutsOnTheBlockGridGiveTheSameBits) {
  LS_SKIP_WITHOUT_DEVICE();
  expect_grid_cuts_agree<float>(odd_shape());
  expect_grid_cuts_agree<float>(bamba_like_shape());
  expect_grid_cuts_agree<bf16>(bamba_like_shape());
}

// Rows with no complete block — a decode row, short chunks, one that crosses a grid point but
// ends before the next, a padded row — get the sequential scan's bits, outputs and states.
TEST(MambaChunkedScanGpu, RowsWithoutACompleteBlockGetTheSequentialBits) {
  LS_SKIP_WITHOUT_DEVICE();
  for (const MambaConfig& m : {odd_shape(), bamba_like_shape(), wide_shape()}) {
    const Rows rows{.counts = {1, 7, 63, 3, 70, 40}, .slots = {1, 0, 2, -1, 5, 6}};
    const std::vector<int32_t> positions = positions_of(rows, {5, 0, 1, 0, 10, 30});
    const LayerWeights w = random_mixer(m, 331);
    const std::vector<float> pool =
        random_floats(size_t(kSlots) * slot_floats(m), 341, -1.0f, 1.0f);
    const std::vector<float> proj = random_proj(m, rows.tokens(), 351);
    const Result sequential = run_gpu<float>(m, w, pool, rows, proj);
    const Result chunked = run_gpu<float>(m, w, pool, rows, proj, &positions);
    ASSERT_GT(gpu_test::norm(sequential.out), 0.0);
    EXPECT_TRUE(same_bits(chunked.out, sequential.out)) << describe(m);
    EXPECT_TRUE(same_bits(chunked.pool, sequential.pool)) << describe(m);
  }
}

// Row X (150 tokens from position 20, slot 4) alone, then third in a batch on slot 1 behind a
// long row and a padded one, with a decode row after it: its outputs and state, the same bits.
TEST(MambaChunkedScanGpu, ARowsBitsDoNotDependOnItsBatchOrSlot) {
  LS_SKIP_WITHOUT_DEVICE();
  const MambaConfig m = bamba_like_shape();
  const LayerWeights w = random_mixer(m, 361);
  const std::vector<float> pool = random_floats(size_t(kSlots) * slot_floats(m), 371, -1.0f, 1.0f);
  const std::vector<float> x_proj = random_proj(m, 150, 381);
  const Rows alone_rows{.counts = {150}, .slots = {4}};
  const std::vector<int32_t> alone_positions = positions_of(alone_rows, {20});
  std::vector<float> batch_proj = random_proj(m, 100 + 5, 382);
  batch_proj.insert(batch_proj.end(), x_proj.begin(), x_proj.end());
  const std::vector<float> tail = random_proj(m, 1, 383);
  batch_proj.insert(batch_proj.end(), tail.begin(), tail.end());
  const Rows batch_rows{.counts = {100, 5, 150, 1}, .slots = {2, -1, 1, 0}};
  const std::vector<int32_t> batch_positions = positions_of(batch_rows, {64, 0, 20, 9});
  // Slot 1 of the batch's pool starts with slot 4's state of the lone run.
  std::vector<float> batch_pool = pool;
  std::copy_n(pool.begin() + ptrdiff_t(4 * slot_floats(m)), slot_floats(m),
              batch_pool.begin() + ptrdiff_t(1 * slot_floats(m)));
  const Result alone = run_gpu<float>(m, w, pool, alone_rows, x_proj, &alone_positions);
  const Result batched =
      run_gpu<float>(m, w, batch_pool, batch_rows, batch_proj, &batch_positions);
  ASSERT_GT(gpu_test::norm(alone.out), 0.0);
  const std::span<const float> x_out =
      std::span<const float>(batched.out).subspan(size_t(105) * m.inner_size(), alone.out.size());
  EXPECT_TRUE(same_bits(x_out, alone.out)) << "seeds 361/371/381";
  EXPECT_TRUE(same_bits(slot_of(m, batched.pool, 1), slot_of(m, alone.pool, 4)));
}

// A mixed step with a verified row (speculative decoding): a verified decode row of 5 tokens
// (working slot 0, verify slots 10–14) between two prefill rows that hold complete blocks, and a
// plain decode row, in one chunked launch. Against the prefill rows alone in a chunked launch and
// the two decode rows alone in a sequential launch (a decode step's): every output and every slot
// of the pool — the prefill rows' working slots, the verify slots' windows and states, the
// verified row's working slot left as it was — the same bits. The verify slots are also checked
// against the CPU mixer's state after each token (fp32 sequential-scan tolerance), so the two
// launches cannot agree on a wrong state.
constexpr int32_t kVerifySlots = 16;
constexpr int32_t kVerifyBase = 10;
constexpr int32_t kVerifyTokens = 5;

// The CPU reference's state after each of the verified row's tokens, in the pool layout: slot
// kVerifyBase + j's run layer holds the state after token j; every other slot as in `pool`.
std::vector<float> cpu_verify_states(const MambaConfig& m, const LayerWeights& w,
                                     const std::vector<float>& pool, int32_t working,
                                     const std::vector<float>& proj) {
  std::vector<float> expected = pool;
  const size_t layer = size_t(kRunLayer) * layer_floats(m);
  std::vector<float> state(pool.begin() + ptrdiff_t(size_t(working) * slot_floats(m) + layer),
                           pool.begin() + ptrdiff_t(size_t(working) * slot_floats(m) + layer +
                                                    layer_floats(m)));
  MambaScratch scratch = make_mamba_scratch(m);
  std::vector<float> out(size_t(m.inner_size()));
  for (int32_t j = 0; j < kVerifyTokens; ++j) {
    mamba_mixer_token(m, w, kRmsEps, proj.data() + size_t(j) * m.in_proj_size(), state.data(),
                      scratch, out.data());
    std::copy(state.begin(), state.end(),
              expected.begin() + ptrdiff_t(size_t(kVerifyBase + j) * slot_floats(m) + layer));
  }
  return expected;
}

template <typename T>
void expect_verified_row_among_prefill_rows(const MambaConfig& m) {
  const LayerWeights w = mixer_for(m, 401, true);
  const std::vector<float> pool =
      random_floats(size_t(kVerifySlots) * slot_floats(m), 411, -1.0f, 1.0f);
  const std::vector<float> first_proj = random_proj(m, 150, 421);
  const std::vector<float> verify_proj = random_proj(m, kVerifyTokens, 422);
  const std::vector<float> decode_proj = random_proj(m, 1, 423);
  const std::vector<float> last_proj = random_proj(m, 100, 424);
  const auto joined = [](std::initializer_list<const std::vector<float>*> parts) {
    std::vector<float> all;
    for (const std::vector<float>* p : parts) all.insert(all.end(), p->begin(), p->end());
    return all;
  };
  const Rows mixed_rows{.counts = {150, kVerifyTokens, 1, 100}, .slots = {2, 0, 4, 5},
                        .verify_base = {-1, kVerifyBase, -1, -1}};
  const std::vector<int32_t> mixed_positions = positions_of(mixed_rows, {20, 37, 12, 64});
  const Result mixed =
      run_gpu<T>(m, w, pool, mixed_rows,
                 joined({&first_proj, &verify_proj, &decode_proj, &last_proj}), &mixed_positions);
  const Rows prefill_rows{.counts = {150, 100}, .slots = {2, 5}};
  const std::vector<int32_t> prefill_positions = positions_of(prefill_rows, {20, 64});
  const Result prefill = run_gpu<T>(m, w, pool, prefill_rows, joined({&first_proj, &last_proj}),
                                    &prefill_positions);
  const Rows decode_rows{.counts = {kVerifyTokens, 1}, .slots = {0, 4},
                         .verify_base = {kVerifyBase, -1}};
  const Result decode = run_gpu<T>(m, w, pool, decode_rows, joined({&verify_proj, &decode_proj}));
  const std::string what = describe(m) + ", seeds 401/411/421";
  ASSERT_GT(gpu_test::norm(mixed.out), 0.0) << what;
  const size_t inner = size_t(m.inner_size());
  const std::span<const float> out(mixed.out);
  EXPECT_TRUE(same_bits(out.subspan(0, 150 * inner),
                        std::span<const float>(prefill.out).subspan(0, 150 * inner)))
      << what;
  EXPECT_TRUE(same_bits(out.subspan(150 * inner, (kVerifyTokens + 1) * inner), decode.out))
      << what;
  EXPECT_TRUE(same_bits(out.subspan((151 + kVerifyTokens) * inner),
                        std::span<const float>(prefill.out).subspan(150 * inner)))
      << what;
  for (int32_t slot = 0; slot < kVerifySlots; ++slot) {
    const Result& alone = slot == 2 || slot == 5 ? prefill : decode;
    EXPECT_TRUE(same_bits(slot_of(m, mixed.pool, slot), slot_of(m, alone.pool, slot)))
        << what << ", slot " << slot;
  }
  EXPECT_TRUE(same_bits(slot_of(m, mixed.pool, 0), slot_of(m, pool, 0)))
      << what << ": the verified row's working slot was written";
  const std::vector<float> cpu = cpu_verify_states(m, w, pool, 0, verify_proj);
  for (int32_t slot = kVerifyBase; slot < kVerifyBase + kVerifyTokens; ++slot) {
    EXPECT_LE(relative_error(slot_of(m, mixed.pool, slot), slot_of(m, cpu, slot)), 1e-5)
        << what << ", verify slot " << slot;
  }
}

TEST(MambaChunkedScanGpu, AVerifiedRowAmongPrefillRowsGetsTheDecodeStepsBits) {
  LS_SKIP_WITHOUT_DEVICE();
  for (const MambaConfig& m : {odd_shape(), bamba_like_shape(), wide_shape()}) {
    expect_verified_row_among_prefill_rows<float>(m);
  }
  expect_verified_row_among_prefill_rows<bf16>(bamba_like_shape());
}

// Validation before any launch (no device needed): positions are required, and so is the
// chunked workspace (the sequential launch's is too small once a block fits).
TEST(MambaChunkedScanGpu, TheLauncherRefusesWhatItCannotRun) {
  float dummy[4] = {};
  int32_t index[1] = {};
  const kernels::MambaLayerParams params{.conv_weight = dummy, .conv_bias = nullptr,
                                         .dt_bias = dummy, .a_log = dummy, .d_skip = dummy,
                                         .norm_weight = dummy};
  const kernels::MambaShape shape = shape_of(odd_shape());
  const kernels::MambaStateView state{.conv = dummy, .ssm = dummy,
                                      .slot_stride_floats = shape.ssm_state_floats()};
  const kernels::MambaRows rows{.token_offsets = index, .token_counts = index, .slots = index,
                                .rows_grid = 1};
  const auto status = [&](const int32_t* positions, int32_t tokens, size_t workspace_floats) {
    return kernels::launch_mamba_mixer_chunked<float>(shape, params, state, rows, positions,
                                                      dummy, tokens, dummy, workspace_floats,
                                                      dummy, nullptr);
  };
  EXPECT_EQ(status(nullptr, 0, 0), cudaSuccess);
  EXPECT_EQ(status(nullptr, 1, kernels::mamba_chunked_workspace_floats(shape, 1)),
            cudaErrorInvalidValue);
  const size_t needed = kernels::mamba_chunked_workspace_floats(shape, kGrid);
  EXPECT_GT(needed, kernels::mamba_workspace_floats(shape, kGrid));
  EXPECT_EQ(status(index, kGrid, needed - 1), cudaErrorInvalidValue);
  kernels::MambaShape bad = shape;
  bad.groups_count = 4;  // 6 heads in 4 groups
  EXPECT_EQ(kernels::launch_mamba_mixer_chunked<float>(bad, params, state, rows, index, dummy, 0,
                                                       dummy, 0, dummy, nullptr),
            cudaErrorInvalidValue);
}

}  // namespace
}  // namespace ls
