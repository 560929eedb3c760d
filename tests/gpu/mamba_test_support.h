// The Mamba2 mixer kernels' test fixtures, shared by tests/gpu/mamba_ops_gpu_test.cpp (the
// sequential scan, the pool ops) and tests/gpu/mamba_scan_gpu_test.cpp (the chunked scan): seeded
// shapes, weights and in_proj outputs, the CPU reference run token by token, and launches of
// either mixer on a device pool that holds two layers per slot (the launches run layer 1).
#pragma once

#include "core/mamba_mixer.h"
#include "kernels/mamba_ops.h"
#include "kernels/mamba_scan.h"
#include "tests/gpu/gpu_test_support.h"

#include <gtest/gtest.h>

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <cstring>
#include <numeric>
#include <span>
#include <vector>

namespace ls::mamba_test {

using gpu_test::DeviceBuffer;
using gpu_test::random_floats;
using bf16 = __nv_bfloat16;

inline constexpr float kRmsEps = 1e-5f;
inline constexpr int32_t kLayers = 2;      // the pool holds two layers; the launches run layer 1
inline constexpr int32_t kRunLayer = 1;

// Two shapes: odd sizes with two groups, a state size that is not a multiple of 32 and a conv
// bias; and a Bamba-like head (64 × 128 state, one group) without the bias.
inline MambaConfig odd_shape() {
  return MambaConfig{.heads_count = 6, .head_dim = 10, .groups_count = 2, .state_size = 40,
                     .conv_kernel = 4, .conv_bias = true, .dt_min = 0.01f, .dt_max = 1.0f};
}
inline MambaConfig bamba_like_shape() {
  return MambaConfig{.heads_count = 4, .head_dim = 64, .groups_count = 1, .state_size = 128,
                     .conv_kernel = 4, .conv_bias = false, .dt_min = 0.01f, .dt_max = 1.0f};
}

inline kernels::MambaShape shape_of(const MambaConfig& m) {
  return kernels::MambaShape{.heads_count = m.heads_count, .head_dim = m.head_dim,
                             .groups_count = m.groups_count, .state_size = m.state_size,
                             .conv_kernel = m.conv_kernel, .dt_min = m.dt_min, .dt_max = m.dt_max,
                             .rms_eps = kRmsEps};
}

inline int64_t layer_floats(const MambaConfig& m) {
  return m.conv_state_floats() + m.ssm_state_floats();
}
inline int64_t slot_floats(const MambaConfig& m) { return kLayers * layer_floats(m); }

// Seeded mixer parameters: softplus(dt + dt_bias) spans both clamp bounds; A = −exp(a_log) in
// [−4.5, −1], so the decays lie in (0, 1).
inline LayerWeights random_mixer(const MambaConfig& m, uint32_t seed) {
  LayerWeights w;
  w.conv_weight = random_floats(size_t(m.conv_state_floats()), seed + 1, -0.5f, 0.5f);
  if (m.conv_bias) w.conv_bias = random_floats(size_t(m.conv_dim()), seed + 2, -0.25f, 0.25f);
  w.dt_bias = random_floats(size_t(m.heads_count), seed + 3, -1.0f, 1.0f);
  w.a_log = random_floats(size_t(m.heads_count), seed + 4, 0.0f, 1.5f);
  w.d_skip = random_floats(size_t(m.heads_count), seed + 5, 0.5f, 1.5f);
  w.mamba_norm = random_floats(size_t(m.inner_size()), seed + 6, 0.5f, 1.5f);
  return w;
}

// The in_proj outputs of `tokens` tokens: gate, xBC in [−2, 2); dt in [−4, 2).
inline std::vector<float> random_proj(const MambaConfig& m, int32_t tokens, uint32_t seed) {
  std::vector<float> proj = random_floats(size_t(tokens) * m.in_proj_size(), seed, -2.0f, 2.0f);
  const std::vector<float> dt =
      random_floats(size_t(tokens) * m.heads_count, seed + 1, -4.0f, 2.0f);
  for (int32_t t = 0; t < tokens; ++t) {
    for (int32_t h = 0; h < m.heads_count; ++h) {
      proj[size_t(t) * m.in_proj_size() + m.inner_size() + m.conv_dim() + h] =
          dt[size_t(t) * m.heads_count + h];
    }
  }
  return proj;
}

// A launch's rows: row r owns counts[r] tokens from the running offset and updates slots[r].
// verify_base (empty: no verified rows) is MambaRows::verify_base, one entry a row.
struct Rows {
  std::vector<int32_t> counts;
  std::vector<int32_t> slots;
  std::vector<int32_t> verify_base = {};
  std::vector<int32_t> offsets() const {
    std::vector<int32_t> o(counts.size(), 0);
    for (size_t r = 1; r < counts.size(); ++r) o[r] = o[r - 1] + counts[r - 1];
    return o;
  }
  int32_t tokens() const { return std::accumulate(counts.begin(), counts.end(), 0); }
};

struct Result {
  std::vector<float> out;   // [tokens, inner]
  std::vector<float> pool;  // [slots, kLayers, layer floats]
};

// The oracle: each real row's tokens through core/mamba_mixer.h in order, on layer kRunLayer of
// each slot; padded rows' outputs are zeros.
inline Result run_cpu(const MambaConfig& m, const LayerWeights& w, const std::vector<float>& pool,
               const Rows& rows, const std::vector<float>& proj) {
  Result r{std::vector<float>(size_t(rows.tokens()) * m.inner_size(), 0.0f), pool};
  MambaScratch scratch = make_mamba_scratch(m);
  const std::vector<int32_t> offsets = rows.offsets();
  for (size_t row = 0; row < rows.counts.size(); ++row) {
    if (rows.slots[row] < 0) continue;
    float* state = r.pool.data() + size_t(rows.slots[row]) * slot_floats(m) +
                   size_t(kRunLayer) * layer_floats(m);
    for (int32_t t = offsets[row]; t < offsets[row] + rows.counts[row]; ++t) {
      mamba_mixer_token(m, w, kRmsEps, proj.data() + size_t(t) * m.in_proj_size(), state, scratch,
                        r.out.data() + size_t(t) * m.inner_size());
    }
  }
  return r;
}

// The mixer's parameters on the device.
struct DeviceMixer {
  explicit DeviceMixer(const LayerWeights& w)
      : conv_weight(w.conv_weight), conv_bias(w.conv_bias), dt_bias(w.dt_bias), a_log(w.a_log),
        d_skip(w.d_skip), norm(w.mamba_norm), has_bias(!w.conv_bias.empty()) {}
  kernels::MambaLayerParams params() const {
    return kernels::MambaLayerParams{.conv_weight = conv_weight.ptr,
                                     .conv_bias = has_bias ? conv_bias.ptr : nullptr,
                                     .dt_bias = dt_bias.ptr, .a_log = a_log.ptr,
                                     .d_skip = d_skip.ptr, .norm_weight = norm.ptr};
  }
  DeviceBuffer<float> conv_weight, conv_bias, dt_bias, a_log, d_skip, norm;
  bool has_bias;
};

inline std::vector<float> to_floats(const std::vector<float>& v) { return v; }
inline std::vector<float> to_floats(const std::vector<bf16>& v) { return gpu_test::from_bf16(v); }

// One launch on the device state `pool` (kept across launches by the caller).
// With `positions` (each token's absolute position), the chunked launcher
// (kernels/mamba_scan.h); without, the sequential one.
template <typename T>
std::vector<float> launch(const MambaConfig& m, const DeviceMixer& mixer, DeviceBuffer<float>& pool,
                          const Rows& rows, const std::vector<float>& proj,
                          const std::vector<int32_t>* positions = nullptr) {
  const int32_t tokens = rows.tokens();
  const bool verified = !rows.verify_base.empty();
  EXPECT_TRUE(!verified || rows.verify_base.size() == rows.counts.size());
  DeviceBuffer<int32_t> offsets(rows.offsets()), counts(rows.counts), slots(rows.slots),
      verify_base(verified ? rows.verify_base : std::vector<int32_t>(rows.counts.size(), -1));
  DeviceBuffer<float> d_proj(proj);
  const kernels::MambaShape shape = shape_of(m);
  const size_t workspace_floats = positions != nullptr
                                      ? kernels::mamba_chunked_workspace_floats(shape, tokens)
                                      : kernels::mamba_workspace_floats(shape, tokens);
  DeviceBuffer<float> workspace(workspace_floats);
  DeviceBuffer<T> out(size_t(tokens) * m.inner_size());
  float* layer = pool.ptr + kRunLayer * layer_floats(m);
  const kernels::MambaStateView state{.conv = layer, .ssm = layer + m.conv_state_floats(),
                                      .slot_stride_floats = slot_floats(m)};
  const kernels::MambaRows device_rows{.token_offsets = offsets.ptr, .token_counts = counts.ptr,
                                       .slots = slots.ptr,
                                       .rows_grid = static_cast<int32_t>(rows.counts.size()),
                                       .verify_base = verified ? verify_base.ptr : nullptr};
  if (positions != nullptr) {
    const DeviceBuffer<int32_t> d_positions(*positions);
    EXPECT_EQ(kernels::launch_mamba_mixer_chunked<T>(shape, mixer.params(), state, device_rows,
                                                     d_positions.ptr, d_proj.ptr, tokens,
                                                     workspace.ptr, workspace_floats, out.ptr,
                                                     nullptr),
              cudaSuccess);
    EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    return to_floats(out.download());
  }
  EXPECT_EQ(kernels::launch_mamba_mixer<T>(shape, mixer.params(), state, device_rows, d_proj.ptr,
                                           tokens, workspace.ptr, workspace_floats, out.ptr,
                                           nullptr),
            cudaSuccess);
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  return to_floats(out.download());
}

template <typename T>
Result run_gpu(const MambaConfig& m, const LayerWeights& w, const std::vector<float>& pool,
               const Rows& rows, const std::vector<float>& proj,
               const std::vector<int32_t>* positions = nullptr) {
  const DeviceMixer mixer(w);
  DeviceBuffer<float> d_pool(pool);
  std::vector<float> out = launch<T>(m, mixer, d_pool, rows, proj, positions);
  return Result{std::move(out), d_pool.download()};
}

inline bool same_bits(std::span<const float> a, std::span<const float> b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

inline std::span<const float> slot_of(const MambaConfig& m, const std::vector<float>& pool,
                                      int32_t slot) {
  return std::span<const float>(pool).subspan(size_t(slot) * slot_floats(m),
                                              size_t(slot_floats(m)));
}

inline constexpr int32_t kSlots = 7;

// The tokens [begin, begin + count) of proj.
inline std::vector<float> tokens_of(const MambaConfig& m, const std::vector<float>& proj,
                                    int32_t begin, int32_t count) {
  const auto first = proj.begin() + ptrdiff_t(begin) * m.in_proj_size();
  return std::vector<float>(first, first + ptrdiff_t(count) * m.in_proj_size());
}

}  // namespace ls::mamba_test
