// The Mamba2 mixer kernels (kernels/mamba_ops.h) against the CPU reference mixer
// (core/mamba_mixer.h, run token by token in each row's order), and their determinism claims
// compared in bits: prefill whole, chunked and token by token (decode) agree; a row's result does
// not depend on its batch; padded rows touch no state. The state-pool ops against the list
// applied in order on the host, eagerly and replayed from a captured graph. Labelled `gpu`: run on
// the H200, skipped without a device.
//
// Tolerances. fp32 (≤ 1e-5 relative): the kernels compute every product and sum of the conv and
// of the state update with the CPU's roundings (core/ops/mamba_math.h), so the differences are
// the device's libm (expf, log1pf: within 2 ulp) feeding the step size, the decay and SiLU, and
// the order of two sums (C·h over the state dimension, the gated norm's sum of squares), each a
// relative perturbation of a few 2^-24; the state's decay is < 1, so over the rows' ≤ 33 tokens
// these stay near 1e-6 — 1e-5 leaves a tenfold margin and still fails on any real mistake (a
// wrong tap, a missing clamp, a state not carried), which moves the result by far more. bf16
// (≤ 8e-3 on the output): the same, plus one bf16 rounding of each output element (≤ 2^-9
// relative); the state stays fp32 in both modes and keeps the 1e-5 bound.
#include "core/logits_digest.h"
#include "core/mamba_mixer.h"
#include "kernels/mamba_ops.h"
#include "tests/gpu/gpu_test_support.h"
#include "tests/gpu/mamba_test_support.h"

#include <gtest/gtest.h>

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <limits>
#include <numeric>
#include <span>
#include <string>
#include <utility>
#include <vector>

namespace ls {
namespace {

using gpu_test::DeviceBuffer;
using gpu_test::random_floats;
using gpu_test::relative_error;
using bf16 = __nv_bfloat16;
using namespace mamba_test;  // NOLINT: the fixtures of this file and mamba_scan_gpu_test.cpp

constexpr double kFp32 = 1e-5;
constexpr double kBf16Output = 8e-3;
template <typename T>
void expect_matches_the_reference(const MambaConfig& m, double output_tolerance) {
  // Rows of 1, 7 and 33 tokens (slot 0 among them: a real slot), a padded row of 3 between.
  const Rows rows{.counts = {1, 7, 3, 33}, .slots = {2, 0, -1, 5}};
  const LayerWeights w = random_mixer(m, 11);
  const std::vector<float> pool = random_floats(size_t(kSlots) * slot_floats(m), 21, -1.0f, 1.0f);
  const std::vector<float> proj = random_proj(m, rows.tokens(), 31);
  const Result cpu = run_cpu(m, w, pool, rows, proj);
  const Result gpu = run_gpu<T>(m, w, pool, rows, proj);
  const std::string what = "shape heads " + std::to_string(m.heads_count) + " × " +
                           std::to_string(m.head_dim) + ", state " + std::to_string(m.state_size) +
                           ", seeds 11/21/31";
  ASSERT_GT(gpu_test::norm(cpu.out), 0.0) << what;
  ASSERT_GT(gpu_test::norm(gpu.out), 0.0) << what;
  EXPECT_LE(relative_error(gpu.out, cpu.out), output_tolerance) << what;
  for (int32_t slot = 0; slot < kSlots; ++slot) {
    const bool touched = slot == 2 || slot == 0 || slot == 5;
    if (touched) {
      EXPECT_LE(relative_error(slot_of(m, gpu.pool, slot), slot_of(m, cpu.pool, slot)), kFp32)
          << what << ", slot " << slot;
      EXPECT_FALSE(same_bits(slot_of(m, gpu.pool, slot), slot_of(m, pool, slot))) << slot;
    } else {
      EXPECT_TRUE(same_bits(slot_of(m, gpu.pool, slot), slot_of(m, pool, slot)))
          << what << ", slot " << slot;
    }
  }
  // Layer 0 of every slot is not this launch's: untouched.
  for (int32_t slot = 0; slot < kSlots; ++slot) {
    const auto layer0 = [&](const std::vector<float>& p) {
      return slot_of(m, p, slot).first(size_t(layer_floats(m)));
    };
    EXPECT_TRUE(same_bits(layer0(gpu.pool), layer0(pool))) << what << ", slot " << slot;
  }
  // The padded row's tokens [8, 11) are zeros.
  for (size_t i = size_t(8) * m.inner_size(); i < size_t(11) * m.inner_size(); ++i) {
    ASSERT_EQ(gpu.out[i], 0.0f) << what << ", element " << i;
  }
}

TEST(MambaMixerGpu, Fp32MatchesTheCpuReference) {
  LS_SKIP_WITHOUT_DEVICE();
  expect_matches_the_reference<float>(odd_shape(), kFp32);
  expect_matches_the_reference<float>(bamba_like_shape(), kFp32);
}

TEST(MambaMixerGpu, Bf16MatchesTheCpuReference) {
  LS_SKIP_WITHOUT_DEVICE();
  expect_matches_the_reference<bf16>(odd_shape(), kBf16Output);
  expect_matches_the_reference<bf16>(bamba_like_shape(), kBf16Output);
}

// One row of 23 tokens on slot 3: prefilled whole, in chunks of 5, 11 and 7, and token by token
// (23 decode launches), the outputs and the state are the same bits.
template <typename T>
void expect_chunkings_agree(const MambaConfig& m) {
  constexpr int32_t kTokens = 23;
  constexpr int32_t kSlot = 3;
  const LayerWeights w = random_mixer(m, 41);
  const DeviceMixer mixer(w);
  const std::vector<float> pool = random_floats(size_t(kSlots) * slot_floats(m), 51, -1.0f, 1.0f);
  const std::vector<float> proj = random_proj(m, kTokens, 61);
  const auto run_chunked = [&](const std::vector<int32_t>& chunks) {
    DeviceBuffer<float> d_pool(pool);
    std::vector<float> out;
    int32_t begin = 0;
    for (const int32_t count : chunks) {
      const std::vector<float> part =
          launch<T>(m, mixer, d_pool, Rows{.counts = {count}, .slots = {kSlot}},
                    tokens_of(m, proj, begin, count));
      out.insert(out.end(), part.begin(), part.end());
      begin += count;
    }
    return Result{std::move(out), d_pool.download()};
  };
  const Result whole = run_chunked({kTokens});
  const Result chunked = run_chunked({5, 11, 7});
  const Result decode = run_chunked(std::vector<int32_t>(kTokens, 1));
  ASSERT_GT(gpu_test::norm(whole.out), 0.0);
  EXPECT_FALSE(same_bits(slot_of(m, whole.pool, kSlot), slot_of(m, pool, kSlot)));
  EXPECT_TRUE(same_bits(chunked.out, whole.out)) << "seeds 41/51/61";
  EXPECT_TRUE(same_bits(chunked.pool, whole.pool)) << "seeds 41/51/61";
  EXPECT_TRUE(same_bits(decode.out, whole.out)) << "seeds 41/51/61";
  EXPECT_TRUE(same_bits(decode.pool, whole.pool)) << "seeds 41/51/61";
}

TEST(MambaMixerGpu, PrefillWholeChunkedAndDecodeAreBitIdentical) {
  LS_SKIP_WITHOUT_DEVICE();
  expect_chunkings_agree<float>(odd_shape());
  expect_chunkings_agree<float>(bamba_like_shape());
  expect_chunkings_agree<bf16>(bamba_like_shape());
}

// Row X (slot 4, 9 tokens) alone, then among other rows (before it a real and a padded row,
// after it a decode row on slot 0): its outputs and its slot are the same bits. Then a decode
// batch of 64 rows (one per slot, some padded) against each of its rows alone.
template <typename T>
void expect_batch_independence(const MambaConfig& m) {
  const LayerWeights w = random_mixer(m, 71);
  const DeviceMixer mixer(w);
  const std::vector<float> pool = random_floats(size_t(kSlots) * slot_floats(m), 81, -1.0f, 1.0f);
  const std::vector<float> x_proj = random_proj(m, 9, 91);
  std::vector<float> batch_proj = random_proj(m, 5 + 3, 92);
  batch_proj.insert(batch_proj.end(), x_proj.begin(), x_proj.end());
  const std::vector<float> tail = random_proj(m, 1, 93);
  batch_proj.insert(batch_proj.end(), tail.begin(), tail.end());
  const Result alone = run_gpu<T>(m, w, pool, Rows{.counts = {9}, .slots = {4}}, x_proj);
  const Result batched =
      run_gpu<T>(m, w, pool, Rows{.counts = {5, 3, 9, 1}, .slots = {1, -1, 4, 0}}, batch_proj);
  const std::span<const float> x_out =
      std::span<const float>(batched.out).subspan(size_t(8) * m.inner_size(), alone.out.size());
  ASSERT_GT(gpu_test::norm(alone.out), 0.0);
  EXPECT_TRUE(same_bits(x_out, alone.out)) << "seeds 71/81/91";
  EXPECT_TRUE(same_bits(slot_of(m, batched.pool, 4), slot_of(m, alone.pool, 4)));

  constexpr int32_t kDecodeRows = 64;
  constexpr int32_t kDecodeSlots = 64;
  const std::vector<float> decode_pool =
      random_floats(size_t(kDecodeSlots) * slot_floats(m), 101, -1.0f, 1.0f);
  const std::vector<float> decode_proj = random_proj(m, kDecodeRows, 111);
  Rows decode{.counts = std::vector<int32_t>(kDecodeRows, 1), .slots = {}};
  for (int32_t r = 0; r < kDecodeRows; ++r) decode.slots.push_back(r % 5 == 4 ? -1 : (r * 37) % 64);
  const Result all = run_gpu<T>(m, w, decode_pool, decode, decode_proj);
  for (const int32_t r : {0, 1, 13, 63}) {
    ASSERT_GE(decode.slots[r], 0);
    const int32_t slot = decode.slots[r];
    const Result one = run_gpu<T>(m, w, decode_pool, Rows{.counts = {1}, .slots = {slot}},
                                  tokens_of(m, decode_proj, r, 1));
    EXPECT_TRUE(same_bits(std::span<const float>(all.out).subspan(size_t(r) * m.inner_size(),
                                                                  one.out.size()),
                          one.out))
        << "decode row " << r << ", seeds 71/101/111";
    EXPECT_TRUE(same_bits(slot_of(m, all.pool, slot), slot_of(m, one.pool, slot)))
        << "decode row " << r;
  }
}

TEST(MambaMixerGpu, ARowsResultDoesNotDependOnItsBatch) {
  LS_SKIP_WITHOUT_DEVICE();
  expect_batch_independence<float>(bamba_like_shape());
  expect_batch_independence<bf16>(bamba_like_shape());
}

// A batch of padded rows around one real row (slot 3): every other slot, slot 0 included, keeps
// its bits, and every padded token's output is zero.
TEST(MambaMixerGpu, PaddedRowsTouchNoState) {
  LS_SKIP_WITHOUT_DEVICE();
  const MambaConfig m = odd_shape();
  const Rows rows{.counts = {2, 1, 4, 1}, .slots = {-1, -1, 3, -1}};
  const LayerWeights w = random_mixer(m, 121);
  const std::vector<float> pool = random_floats(size_t(kSlots) * slot_floats(m), 131, -1.0f, 1.0f);
  const Result gpu = run_gpu<float>(m, w, pool, rows, random_proj(m, rows.tokens(), 141));
  for (int32_t slot = 0; slot < kSlots; ++slot) {
    EXPECT_EQ(same_bits(slot_of(m, gpu.pool, slot), slot_of(m, pool, slot)), slot != 3) << slot;
  }
  const size_t inner = size_t(m.inner_size());
  for (size_t i = 0; i < gpu.out.size(); ++i) {
    const size_t token = i / inner;
    if (token >= 3 && token < 7) continue;  // the real row
    ASSERT_EQ(gpu.out[i], 0.0f) << "token " << token;
  }
  ASSERT_GT(gpu_test::norm(std::span<const float>(gpu.out).subspan(3 * inner, 4 * inner)), 0.0);
}

// Validation happens before any launch (no device needed): with every pointer set and no
// tokens the good shape is a no-op success, and each broken limit is refused.
TEST(MambaMixerGpu, LaunchersRefuseWhatTheyCannotRun) {
  float dummy[4] = {};
  int32_t index[1] = {};
  const kernels::MambaLayerParams params{.conv_weight = dummy, .conv_bias = nullptr,
                                         .dt_bias = dummy, .a_log = dummy, .d_skip = dummy,
                                         .norm_weight = dummy};
  const kernels::MambaShape good = shape_of(odd_shape());
  const kernels::MambaStateView state{.conv = dummy, .ssm = dummy,
                                      .slot_stride_floats = good.ssm_state_floats()};
  const kernels::MambaRows rows{.token_offsets = index, .token_counts = index, .slots = index,
                                .rows_grid = 1};
  auto status = [&](kernels::MambaShape s, int32_t tokens, size_t workspace_floats) {
    return kernels::launch_mamba_mixer<float>(s, params, state, rows, dummy, tokens, dummy,
                                              workspace_floats, dummy, nullptr);
  };
  EXPECT_EQ(status(good, 0, 0), cudaSuccess);
  kernels::MambaShape s = good;
  s.conv_kernel = kernels::kMambaConvKernelMax + 1;
  EXPECT_EQ(status(s, 0, 0), cudaErrorInvalidValue);
  s = good, s.state_size = kernels::kMambaStateSizeMax + 1;
  EXPECT_EQ(status(s, 0, 0), cudaErrorInvalidValue);
  s = good, s.groups_count = 4;  // 6 heads in 4 groups
  EXPECT_EQ(status(s, 0, 0), cudaErrorInvalidValue);
  s = good, s.rms_eps = 0.0f;
  EXPECT_EQ(status(s, 0, 0), cudaErrorInvalidValue);
  // One token needs conv_dim + inner floats of workspace.
  EXPECT_EQ(status(good, 1, kernels::mamba_workspace_floats(good, 1) - 1), cudaErrorInvalidValue);
  EXPECT_EQ(kernels::launch_mamba_copy_slots(nullptr, 8, index, 1, nullptr), cudaErrorInvalidValue);
  EXPECT_EQ(kernels::launch_mamba_zero_slots(dummy, 0, index, 1, nullptr), cudaErrorInvalidValue);
}

// The pool ops' model: the list applied in order, as CpuModel::copy_mamba_state and
// zero_mamba_state apply one entry each.
void copy_in_order(std::vector<float>& pool, size_t slot_size, const std::vector<int32_t>& pairs) {
  for (size_t p = 0; p + 1 < pairs.size(); p += 2) {
    if (pairs[p] < 0 || pairs[p + 1] < 0) continue;
    std::copy_n(pool.begin() + ptrdiff_t(pairs[p] * slot_size), slot_size,
                pool.begin() + ptrdiff_t(pairs[p + 1] * slot_size));
  }
}
void zero_in_order(std::vector<float>& pool, size_t slot_size, const std::vector<int32_t>& slots) {
  for (const int32_t s : slots) {
    if (s >= 0) std::fill_n(pool.begin() + ptrdiff_t(s * slot_size), slot_size, 0.0f);
  }
}

constexpr size_t kPoolSlots = 6;
// Slot sizes of more floats than one pass of the kernels' grid covers: odd (the scalar kernel)
// and a multiple of 4 (the float4 kernel).
constexpr int64_t kSlotSizes[] = {1100003, 1100004};

// A chain (1→2, 2→3 leaves 1's state in 3), padded pairs on either side, a copy into slot 0;
// then zeroes with padding.
TEST(MambaPoolGpu, CopyAndZeroApplyTheListInOrder) {
  LS_SKIP_WITHOUT_DEVICE();
  for (const int64_t slot_size : kSlotSizes) {
    const std::vector<float> pool = random_floats(kPoolSlots * slot_size, 151, -1.0f, 1.0f);
    const std::vector<int32_t> pairs = {1, 2, 2, 3, -1, 4, 5, -1, 4, 0};
    const std::vector<int32_t> zeroes = {5, -1, 2};
    DeviceBuffer<float> d_pool(pool);
    DeviceBuffer<int32_t> d_pairs(pairs), d_zeroes(zeroes);
    ASSERT_EQ(kernels::launch_mamba_copy_slots(d_pool.ptr, slot_size, d_pairs.ptr, 5, nullptr),
              cudaSuccess);
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    std::vector<float> expected = pool;
    copy_in_order(expected, slot_size, pairs);
    EXPECT_TRUE(same_bits(d_pool.download(), expected)) << "slot size " << slot_size;
    EXPECT_TRUE(same_bits(std::span<const float>(expected).subspan(3 * slot_size, slot_size),
                          std::span<const float>(pool).subspan(1 * slot_size, slot_size)));
    ASSERT_EQ(kernels::launch_mamba_zero_slots(d_pool.ptr, slot_size, d_zeroes.ptr, 3, nullptr),
              cudaSuccess);
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    zero_in_order(expected, slot_size, zeroes);
    EXPECT_TRUE(same_bits(d_pool.download(), expected)) << "slot size " << slot_size;
  }
}

// The record's state digests against the definition (core/logits_digest.h, the portable loop)
// over each listed slot: one chunk, a few, and more than the 256 chunks of 16384 floats (larger
// chunks then), with NaN, ±0 and ±inf among the values; a −1 entry (padding) leaves its digest.
TEST(MambaPoolGpu, StateDigestsAreTheDefinitionOverEachListedSlot) {
  LS_SKIP_WITHOUT_DEVICE();
  constexpr uint64_t kUntouched = 0xABABABABABABABABull;
  for (const int64_t slot_size : {int64_t{1}, int64_t{40001}, int64_t{5000003}}) {
    std::vector<float> pool = random_floats(4 * slot_size, 171, -2.0f, 2.0f);
    const float specials[] = {std::numeric_limits<float>::quiet_NaN(), -0.0f, 0.0f,
                              std::numeric_limits<float>::infinity(),
                              -std::numeric_limits<float>::infinity()};
    for (size_t i = 0; i < std::size(specials); ++i) {
      pool[(i * 7919) % pool.size()] = specials[i];
    }
    const std::vector<int32_t> slots = {2, -1, 0, 3, -1, 2};
    const int32_t rows = static_cast<int32_t>(slots.size());
    DeviceBuffer<float> d_pool(pool);
    DeviceBuffer<int32_t> d_slots(slots);
    DeviceBuffer<uint64_t> d_digests(std::vector<uint64_t>(slots.size(), kUntouched));
    const size_t words = kernels::mamba_digest_workspace_words(slot_size, rows);
    DeviceBuffer<uint32_t> d_workspace(std::vector<uint32_t>(words, 0));
    ASSERT_EQ(kernels::launch_mamba_state_digests(d_pool.ptr, slot_size, d_slots.ptr, rows,
                                                  d_workspace.ptr, words, d_digests.ptr, nullptr),
              cudaSuccess);
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    const std::vector<uint64_t> got = d_digests.download();
    for (size_t r = 0; r < slots.size(); ++r) {
      const uint64_t expected =
          slots[r] < 0 ? kUntouched
                       : logits_row_digest_portable(std::span<const float>(pool).subspan(
                             static_cast<size_t>(slots[r] * slot_size),
                             static_cast<size_t>(slot_size)));
      EXPECT_EQ(got[r], expected) << "slot size " << slot_size << " row " << r;
    }
    EXPECT_NE(got[0], got[2]) << "slot size " << slot_size;
    EXPECT_EQ(kernels::launch_mamba_state_digests(d_pool.ptr, slot_size, d_slots.ptr, rows,
                                                  d_workspace.ptr, words - 1, d_digests.ptr,
                                                  nullptr),
              cudaErrorInvalidValue)
        << "a workspace one word short";
  }
}

// Captured once, the ops read their indices from device memory at each replay: new indices
// written into the same buffers take effect without a new capture.
TEST(MambaPoolGpu, AGraphReadsTheIndicesOfEachReplay) {
  LS_SKIP_WITHOUT_DEVICE();
  const int64_t slot_size = kSlotSizes[1];
  const std::vector<float> pool = random_floats(kPoolSlots * slot_size, 161, -1.0f, 1.0f);
  DeviceBuffer<float> d_pool(pool);
  DeviceBuffer<int32_t> d_pairs(std::vector<int32_t>{0, 1, -1, -1});
  DeviceBuffer<int32_t> d_zeroes(std::vector<int32_t>{-1, -1});
  cudaStream_t stream = nullptr;
  ASSERT_EQ(cudaStreamCreate(&stream), cudaSuccess);
  cudaGraph_t graph = nullptr;
  ASSERT_EQ(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal), cudaSuccess);
  ASSERT_EQ(kernels::launch_mamba_copy_slots(d_pool.ptr, slot_size, d_pairs.ptr, 2, stream),
            cudaSuccess);
  ASSERT_EQ(kernels::launch_mamba_zero_slots(d_pool.ptr, slot_size, d_zeroes.ptr, 2, stream),
            cudaSuccess);
  ASSERT_EQ(cudaStreamEndCapture(stream, &graph), cudaSuccess);
  cudaGraphExec_t exec = nullptr;
  ASSERT_EQ(cudaGraphInstantiate(&exec, graph, 0), cudaSuccess);
  std::vector<float> expected = pool;
  for (const auto& [pairs, zeroes] :
       std::vector<std::pair<std::vector<int32_t>, std::vector<int32_t>>>{
           {{0, 1, -1, -1}, {-1, -1}}, {{3, 4, 4, 5}, {0, -1}}, {{-1, -1, 2, 0}, {3, 2}}}) {
    d_pairs.upload(pairs);
    d_zeroes.upload(zeroes);
    ASSERT_EQ(cudaGraphLaunch(exec, stream), cudaSuccess);
    ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
    copy_in_order(expected, slot_size, pairs);
    zero_in_order(expected, slot_size, zeroes);
    EXPECT_TRUE(same_bits(d_pool.download(), expected))
        << "pairs " << pairs[0] << "→" << pairs[1] << ", " << pairs[2] << "→" << pairs[3];
  }
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  cudaStreamDestroy(stream);
}

// The checkpoint rule on the device against CpuBackend::snapshot_mamba_checkpoints' condition:
// a snapshot is kept when its row's vcl ends a page (vcl 0 included), padding (row −1) never;
// the kept pairs then copy as the list says.
TEST(MambaPoolGpu, SnapshotsAreTheRowsWhoseVclEndsAPage) {
  LS_SKIP_WITHOUT_DEVICE();
  constexpr int32_t kPageSize = 16;
  const std::vector<int32_t> pool_rows = {3, 1, 4, 2, 5};
  const std::vector<int32_t> vcl = {7, 32, 5, 17, 0, 48};  // by pool row
  // (row, src, dst): rows 0..4 → pool rows 3, 1, 4, 2, 5 with vcl 17, 32, 0, 5, 48.
  const std::vector<int32_t> snapshots = {0, 1, 2, 1, 0, 3, -1, 4, 5, 2, 4, 1, 3, 5, 0, 4, 2, 0};
  const std::vector<int32_t> expected_pairs = {-1, -1, 0, 3, -1, -1, 4, 1, -1, -1, 2, 0};
  DeviceBuffer<int32_t> d_snapshots(snapshots), d_rows(pool_rows), d_vcl(vcl), d_pairs(12);
  ASSERT_EQ(kernels::launch_mamba_snapshot_pairs(d_snapshots.ptr, 6, d_rows.ptr, d_vcl.ptr,
                                                 kPageSize, d_pairs.ptr, nullptr),
            cudaSuccess);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  EXPECT_EQ(d_pairs.download(), expected_pairs);
  const int64_t slot_size = 1001;
  const std::vector<float> pool = random_floats(kPoolSlots * slot_size, 201, -1.0f, 1.0f);
  DeviceBuffer<float> d_pool(pool);
  ASSERT_EQ(kernels::launch_mamba_copy_slots(d_pool.ptr, slot_size, d_pairs.ptr, 6, nullptr),
            cudaSuccess);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  std::vector<float> expected = pool;
  copy_in_order(expected, slot_size, expected_pairs);
  EXPECT_TRUE(same_bits(d_pool.download(), expected));
}

// A decode graph captured at 8 rows reads each replay's slots and counts from device memory: two
// replays with different slots (padding among them, slot 0 real) give the eager launches' bits.
TEST(MambaMixerGpu, ACapturedDecodeLaunchReadsEachReplaysRows) {
  LS_SKIP_WITHOUT_DEVICE();
  using T = bf16;
  constexpr int32_t kRows = 8;
  const MambaConfig m = bamba_like_shape();
  const kernels::MambaShape shape = shape_of(m);
  const LayerWeights w = random_mixer(m, 171);
  const DeviceMixer mixer(w);
  const std::vector<float> pool = random_floats(size_t(kSlots) * slot_floats(m), 181, -1.0f, 1.0f);
  const std::vector<std::vector<int32_t>> replays = {{0, 1, 2, -1, 3, 4, 5, 6},
                                                     {6, -1, -1, 0, 2, -1, 5, -1}};
  const std::vector<std::vector<float>> projs = {random_proj(m, kRows, 191),
                                                 random_proj(m, kRows, 192)};
  Rows rows{.counts = std::vector<int32_t>(kRows, 1), .slots = replays[0]};
  // Eager: the two steps one after the other on one pool.
  DeviceBuffer<float> eager_pool(pool);
  std::vector<std::vector<float>> eager_out;
  for (size_t i = 0; i < replays.size(); ++i) {
    rows.slots = replays[i];
    eager_out.push_back(launch<T>(m, mixer, eager_pool, rows, projs[i]));
  }
  // Captured once, replayed twice with new rows and inputs written into its buffers.
  DeviceBuffer<float> graph_pool(pool);
  DeviceBuffer<int32_t> offsets(rows.offsets()), counts(rows.counts), slots(replays[0]);
  DeviceBuffer<float> d_proj(projs[0]);
  const size_t workspace_floats = kernels::mamba_workspace_floats(shape, kRows);
  DeviceBuffer<float> workspace(workspace_floats);
  DeviceBuffer<T> out(size_t(kRows) * m.inner_size());
  float* layer = graph_pool.ptr + kRunLayer * layer_floats(m);
  const kernels::MambaStateView state{.conv = layer, .ssm = layer + m.conv_state_floats(),
                                      .slot_stride_floats = slot_floats(m)};
  const kernels::MambaRows device_rows{.token_offsets = offsets.ptr, .token_counts = counts.ptr,
                                       .slots = slots.ptr, .rows_grid = kRows};
  cudaStream_t stream = nullptr;
  ASSERT_EQ(cudaStreamCreate(&stream), cudaSuccess);
  cudaGraph_t graph = nullptr;
  ASSERT_EQ(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal), cudaSuccess);
  ASSERT_EQ(kernels::launch_mamba_mixer<T>(shape, mixer.params(), state, device_rows, d_proj.ptr,
                                           kRows, workspace.ptr, workspace_floats, out.ptr,
                                           kernels::LaunchStream(stream, true)),
            cudaSuccess);
  ASSERT_EQ(cudaStreamEndCapture(stream, &graph), cudaSuccess);
  cudaGraphExec_t exec = nullptr;
  ASSERT_EQ(cudaGraphInstantiate(&exec, graph, 0), cudaSuccess);
  for (size_t i = 0; i < replays.size(); ++i) {
    slots.upload(replays[i]);
    d_proj.upload(projs[i]);
    ASSERT_EQ(cudaGraphLaunch(exec, stream), cudaSuccess);
    ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
    EXPECT_TRUE(same_bits(to_floats(out.download()), eager_out[i])) << "replay " << i;
  }
  EXPECT_TRUE(same_bits(graph_pool.download(), eager_pool.download()));
  EXPECT_FALSE(same_bits(graph_pool.download(), pool));
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  cudaStreamDestroy(stream);
}

}  // namespace
}  // namespace ls
