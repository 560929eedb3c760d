// The per-token layer kernels against their CPU reference loops (core/cpu_model.cpp), on odd
// token counts (1, 7, 129, 2048). Inputs are bf16-representable, so the only differences are the
// device's accumulation order and its bf16 output rounding; tolerances are stated per test (RoPE
// has none: the CPU's bits).
#include "core/model/rope.h"
#include "core/ops/layer_math.h"
#include "core/ops/nan_guard.h"
#include "kernels/gemm.h"
#include "kernels/gemm_plans.h"
#include "kernels/layer_ops.h"
#include "kernels/logits_ops.h"
#include "tests/gpu/gpu_test_support.h"

#include <gtest/gtest.h>

#include <cublas_v2.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

namespace ls {
namespace {

using gpu_test::DeviceBuffer;
using gpu_test::linear_ref;
using gpu_test::random_bf16_values;
using gpu_test::random_floats;
using gpu_test::relative_error;
using kernels::bf16;

constexpr double kBf16Output = 8e-3;  // one bf16 rounding of the output: ≤ 2^-8 relative
constexpr double kFp32 = 1e-5;

class TokenCounts : public ::testing::TestWithParam<int32_t> {};

TEST_P(TokenCounts, EmbeddingGathersRows) {
  LS_SKIP_WITHOUT_DEVICE();
  const int32_t tokens = GetParam(), vocab = 517, hidden = 200;
  const std::vector<float> table = random_bf16_values(size_t(vocab) * hidden, 1, -1, 1);
  std::vector<int32_t> ids(tokens);
  for (int32_t t = 0; t < tokens; ++t) ids[t] = (t * 131 + 7) % vocab;
  DeviceBuffer<bf16> d_table(gpu_test::to_bf16(table));
  DeviceBuffer<int32_t> d_ids(ids);
  DeviceBuffer<float> d_out(size_t(tokens) * hidden);
  ASSERT_EQ(kernels::launch_embedding(d_table.ptr, d_ids.ptr, tokens, hidden, d_out.ptr, nullptr),
            cudaSuccess);
  const std::vector<float> out = d_out.download();
  for (int32_t t = 0; t < tokens; ++t) {
    for (int32_t i = 0; i < hidden; ++i) {
      ASSERT_EQ(out[size_t(t) * hidden + i], table[size_t(ids[t]) * hidden + i]) << t << "," << i;
    }
  }
}

// CPU reference: core/cpu_model.cpp's rms_norm, ops::rms_norm_row.
std::vector<float> rms_norm_ref(const std::vector<float>& x, const std::vector<int32_t>& rows,
                                const std::vector<float>& w, int32_t n, float eps) {
  std::vector<float> y(rows.size() * n);
  for (size_t r = 0; r < rows.size(); ++r) {
    ops::rms_norm_row(x.data() + size_t(static_cast<uint32_t>(rows[r])) * n, w.data(), n, eps,
                      y.data() + r * n);
  }
  return y;
}

// Widths: odd (the scalar kernel), multiples of 4 (the vectorised one, 2048 and 4100 with a
// partial last round of loads), and one past the vectorised kernel's register limit.
TEST_P(TokenCounts, RmsNormMatchesTheReference) {
  LS_SKIP_WITHOUT_DEVICE();
  for (const int32_t n : {2051, 2048, 4100, 8196}) {
    const int32_t tokens = GetParam();
    const float eps = 1e-5f;
    const std::vector<float> x = random_floats(size_t(tokens) * n, 2, -3, 3);
    const std::vector<float> w = random_floats(n, 3, 0.5f, 1.5f);
    // Gathered rows (the final norm's logits rows) in reverse order, and the plain form.
    std::vector<int32_t> rows(tokens), identity(tokens);
    for (int32_t r = 0; r < tokens; ++r) rows[r] = tokens - 1 - r, identity[r] = r;
    DeviceBuffer<float> d_x(x), d_w(w);
    DeviceBuffer<int32_t> d_rows(rows);
    DeviceBuffer<bf16> d_out(size_t(tokens) * n);
    DeviceBuffer<float> d_out_f32(size_t(tokens) * n);
    for (const bool gathered : {false, true}) {
      ASSERT_EQ(kernels::launch_rms_norm(d_x.ptr, gathered ? d_rows.ptr : nullptr, tokens, n,
                                         d_w.ptr, eps, d_out.ptr, nullptr),
                cudaSuccess);
      ASSERT_EQ(kernels::launch_rms_norm(d_x.ptr, gathered ? d_rows.ptr : nullptr, tokens, n,
                                         d_w.ptr, eps, d_out_f32.ptr, nullptr),
                cudaSuccess);
      const std::vector<float> out = gpu_test::from_bf16(d_out.download());
      const std::vector<float> ref = rms_norm_ref(x, gathered ? rows : identity, w, n, eps);
      EXPECT_LT(relative_error(out, ref), kBf16Output)
          << "tokens " << tokens << " n " << n << " gathered " << gathered;
      EXPECT_LT(relative_error(d_out_f32.download(), ref), kFp32)
          << "fp32 out, tokens " << tokens << " n " << n << " gathered " << gathered;
      EXPECT_GT(gpu_test::norm(ref), 0);
    }
  }
}

// `rotary`: the dims of each head RoPE rotates (head_dim, or Bamba's partial rotary); the CPU's
// apply_rope over a table of that width is the reference, the dims past it pass through.
void check_rope(int32_t tokens, int32_t rotary) {
  const int32_t qh = 4, kvh = 2, d = 16, positions_count = 3000;
  const int32_t q_size = qh * d, kv_size = kvh * d, width = q_size + 2 * kv_size;
  const int64_t slots_count = 5000;
  // Llama 3 scaling: the table the backend uploads for a scaled model.
  const RopeTable rope = build_rope_table(
      RopeConfig{RopeType::kLlama3, 500000.0f, 8.0f, 1.0f, 4.0f, 128}, rotary, positions_count);
  const std::vector<float> qkv = random_floats(size_t(tokens) * width, 4, -2, 2);
  std::vector<int32_t> positions(tokens);
  std::vector<int64_t> slots(tokens);
  for (int32_t t = 0; t < tokens; ++t) {
    positions[t] = t == 0 ? positions_count + 10 : (t * 37) % positions_count;  // one past the table
    slots[t] = (t * 7 + 3) % slots_count;  // distinct for tokens ≤ 2048
  }
  DeviceBuffer<float> d_qkv(qkv), d_cos(rope.cos), d_sin(rope.sin), d_q(size_t(tokens) * q_size);
  DeviceBuffer<int32_t> d_pos(positions);
  DeviceBuffer<int64_t> d_slots(slots);
  DeviceBuffer<bf16> d_k(size_t(slots_count) * kv_size), d_v(size_t(slots_count) * kv_size);
  ASSERT_EQ(kernels::launch_rope_qkv(d_qkv.ptr, d_pos.ptr, d_slots.ptr, tokens, qh, kvh, d,
                                     rotary, d_cos.ptr, d_sin.ptr, positions_count, d_q.ptr,
                                     d_k.ptr, d_v.ptr, nullptr),
            cudaSuccess);
  const std::vector<float> q = d_q.download();
  const std::vector<float> k = gpu_test::from_bf16(d_k.download());
  const std::vector<float> v = gpu_test::from_bf16(d_v.download());
  std::vector<float> q_ref(size_t(tokens) * q_size), q_out(q_ref.size());
  std::vector<float> k_ref, k_out, v_ref, v_out;
  for (int32_t t = 0; t < tokens; ++t) {
    std::vector<float> row(qkv.begin() + size_t(t) * width, qkv.begin() + size_t(t + 1) * width);
    const int32_t p = std::min(positions[t], positions_count - 1);
    for (int32_t h = 0; h < qh + kvh; ++h) apply_rope(rope, p, row.data() + h * d);
    std::copy(row.begin(), row.begin() + q_size, q_ref.begin() + size_t(t) * q_size);
    std::copy(q.begin() + size_t(t) * q_size, q.begin() + size_t(t + 1) * q_size,
              q_out.begin() + size_t(t) * q_size);
    const size_t s = static_cast<size_t>(slots[t]) * kv_size;
    k_ref.insert(k_ref.end(), row.begin() + q_size, row.begin() + q_size + kv_size);
    k_out.insert(k_out.end(), k.begin() + s, k.begin() + s + kv_size);
    v_ref.insert(v_ref.end(), row.begin() + q_size + kv_size, row.end());
    v_out.insert(v_out.end(), v.begin() + s, v.begin() + s + kv_size);
  }
  // The CPU's bits: Q as computed (fp32), K and V rounded once to bf16 as the cache stores them.
  // The rotated dims hold only if no product is fused into its sum (ops::rope_rotate), the
  // unrotated ones are the input's.
  for (std::vector<float>* cached : {&k_ref, &v_ref}) {
    for (float& x : *cached) x = gpu_test::round_bf16(x);
  }
  EXPECT_EQ(gpu_test::differing(q_out, q_ref), 0u) << "of Q differ, rotary " << rotary;
  EXPECT_EQ(gpu_test::differing(k_out, k_ref), 0u) << "of K differ, rotary " << rotary;
  EXPECT_EQ(gpu_test::differing(v_out, v_ref), 0u) << "of V differ, rotary " << rotary;
  EXPECT_GT(gpu_test::norm(q_ref), 0);
}

TEST_P(TokenCounts, RopeRotatesQAndKAndWritesTheCache) {
  LS_SKIP_WITHOUT_DEVICE();
  check_rope(GetParam(), 16);
}

TEST_P(TokenCounts, PartialRopeRotatesTheFirstDimsAndPassesTheRest) {
  LS_SKIP_WITHOUT_DEVICE();
  check_rope(GetParam(), 8);
  check_rope(GetParam(), 6);
}

// CPU reference: the bias and head-norm loop of core/cpu_model.cpp attention_layer_qkv (biases
// added to the whole row, then each q and k head normed over head_dim by ops::rms_norm_row).
std::vector<float> bias_head_norm_ref(std::vector<float> qkv, int32_t tokens, int32_t qh,
                                      int32_t kvh, int32_t d, const std::vector<float>* bias,
                                      const std::vector<float>* q_norm,
                                      const std::vector<float>* k_norm, float eps) {
  const int32_t width = (qh + 2 * kvh) * d;
  for (int32_t t = 0; t < tokens; ++t) {
    float* row = qkv.data() + size_t(t) * width;
    if (bias != nullptr) {
      for (int32_t i = 0; i < width; ++i) row[i] += (*bias)[i];
    }
    if (q_norm == nullptr) continue;
    for (int32_t h = 0; h < qh + kvh; ++h) {
      float* x = row + h * d;
      const std::vector<float>& w = h < qh ? *q_norm : *k_norm;
      ops::rms_norm_row(x, w.data(), d, eps, x);
    }
  }
  return qkv;
}

// Qwen2 (bias only), Qwen3 (head norms only) and both, at head_dim 24, 64 and 128 and odd head
// counts (5 q, 3 kv: the kernel does not need a GQA ratio).
TEST_P(TokenCounts, QkvBiasAndHeadNormMatchTheReference) {
  LS_SKIP_WITHOUT_DEVICE();
  const int32_t tokens = GetParam(), qh = 5, kvh = 3;
  const float eps = 1e-6f;
  for (const int32_t d : {24, 64, 128}) {
    const int32_t width = (qh + 2 * kvh) * d;
    const std::vector<float> qkv = random_floats(size_t(tokens) * width, 11, -3, 3);
    const std::vector<float> bias = random_floats(size_t(width), 12, -1, 1);
    const std::vector<float> q_norm = random_floats(size_t(d), 13, 0.5f, 1.5f);
    const std::vector<float> k_norm = random_floats(size_t(d), 14, 0.5f, 1.5f);
    DeviceBuffer<float> d_bias(bias), d_qn(q_norm), d_kn(k_norm);
    for (const int variant : {0, 1, 2}) {  // bias, norms, both
      SCOPED_TRACE(::testing::Message() << "tokens " << tokens << " head_dim " << d << " variant "
                                        << variant);
      const bool with_bias = variant != 1, with_norm = variant != 0;
      DeviceBuffer<float> d_qkv(qkv);
      ASSERT_EQ(kernels::launch_qkv_bias_head_norm(
                    d_qkv.ptr, tokens, qh, kvh, d, with_bias ? d_bias.ptr : nullptr,
                    with_norm ? d_qn.ptr : nullptr, with_norm ? d_kn.ptr : nullptr, eps, nullptr),
                cudaSuccess);
      const std::vector<float> out = d_qkv.download();
      const std::vector<float> ref =
          bias_head_norm_ref(qkv, tokens, qh, kvh, d, with_bias ? &bias : nullptr,
                             with_norm ? &q_norm : nullptr, with_norm ? &k_norm : nullptr, eps);
      ASSERT_GT(gpu_test::norm(ref), 0.0);
      EXPECT_LT(relative_error(out, ref), kFp32);
      // V is never normed: with norms only, the V part is the input unchanged.
      if (variant == 1) {
        for (int32_t t = 0; t < tokens; ++t) {
          const size_t v_at = size_t(t) * width + size_t(qh + kvh) * d;
          ASSERT_TRUE(std::equal(out.begin() + v_at, out.begin() + v_at + size_t(kvh) * d,
                                 qkv.begin() + v_at)) << "token " << t;
        }
      }
    }
  }
  float* null_qkv = nullptr;
  EXPECT_EQ(kernels::launch_qkv_bias_head_norm(null_qkv, 1, qh, kvh, 64, nullptr, nullptr, nullptr,
                                               eps, nullptr),
            cudaErrorInvalidValue);
}

// Byte for byte (a float's bits, NaN included).
template <typename T>
bool same_bytes(const std::vector<T>& a, const std::vector<T>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(T)) == 0;
}

// launch_qkv_prep_rope against launch_qkv_bias_head_norm then launch_rope_qkv: the qkv rows, Q and
// both caches byte for byte (the caches' unwritten slots keep the buffers' poison on both sides).
template <typename T>
void check_prep_rope(int32_t tokens, int32_t d, int32_t rotary, int variant) {
  SCOPED_TRACE(::testing::Message() << "tokens " << tokens << " head_dim " << d << " rotary "
                                    << rotary << " variant " << variant << " cache bytes "
                                    << sizeof(T));
  const int32_t qh = 5, kvh = 3, positions_count = 3000;
  const int32_t q_size = qh * d, kv_size = kvh * d, width = q_size + 2 * kv_size;
  const int64_t slots_count = 4100;
  const float eps = 1e-6f;
  const RopeTable rope = build_rope_table(
      RopeConfig{RopeType::kLlama3, 500000.0f, 8.0f, 1.0f, 4.0f, 128}, rotary, positions_count);
  const std::vector<float> qkv = random_floats(size_t(tokens) * width, 21, -3, 3);
  const std::vector<float> bias = random_floats(size_t(width), 22, -1, 1);
  const std::vector<float> q_norm = random_floats(size_t(d), 23, 0.5f, 1.5f);
  const std::vector<float> k_norm = random_floats(size_t(d), 24, 0.5f, 1.5f);
  std::vector<int32_t> positions(tokens);
  std::vector<int64_t> slots(tokens);
  for (int32_t t = 0; t < tokens; ++t) {
    positions[t] = t == 0 ? positions_count + 10 : (t * 37) % positions_count;
    slots[t] = (t * 7 + 3) % slots_count;  // distinct for tokens ≤ 2048
  }
  DeviceBuffer<float> d_bias(bias), d_qn(q_norm), d_kn(k_norm), d_cos(rope.cos), d_sin(rope.sin);
  DeviceBuffer<int32_t> d_pos(positions);
  DeviceBuffer<int64_t> d_slots(slots);
  const bool with_bias = variant != 1, with_norm = variant != 0;
  const kernels::QkvHeadPrep prep{with_bias ? d_bias.ptr : nullptr,
                                  with_norm ? d_qn.ptr : nullptr, with_norm ? d_kn.ptr : nullptr,
                                  eps};
  DeviceBuffer<float> two_qkv(qkv), one_qkv(qkv);
  DeviceBuffer<float> two_q(size_t(tokens) * q_size), one_q(size_t(tokens) * q_size);
  DeviceBuffer<T> two_k(size_t(slots_count) * kv_size), two_v(size_t(slots_count) * kv_size);
  DeviceBuffer<T> one_k(size_t(slots_count) * kv_size), one_v(size_t(slots_count) * kv_size);
  ASSERT_EQ(kernels::launch_qkv_bias_head_norm(two_qkv.ptr, tokens, qh, kvh, d, prep.bias,
                                               prep.q_norm, prep.k_norm, eps, nullptr),
            cudaSuccess);
  ASSERT_EQ(kernels::launch_rope_qkv(two_qkv.ptr, d_pos.ptr, d_slots.ptr, tokens, qh, kvh, d,
                                     rotary, d_cos.ptr, d_sin.ptr, positions_count, two_q.ptr,
                                     two_k.ptr, two_v.ptr, nullptr),
            cudaSuccess);
  ASSERT_EQ(kernels::launch_qkv_prep_rope(one_qkv.ptr, prep, d_pos.ptr, d_slots.ptr, tokens, qh,
                                          kvh, d, rotary, d_cos.ptr, d_sin.ptr, positions_count,
                                          one_q.ptr, one_k.ptr, one_v.ptr, nullptr),
            cudaSuccess);
  EXPECT_TRUE(same_bytes(one_qkv.download(), two_qkv.download()));
  EXPECT_TRUE(same_bytes(one_q.download(), two_q.download()));
  EXPECT_TRUE(same_bytes(one_k.download(), two_k.download()));
  EXPECT_TRUE(same_bytes(one_v.download(), two_v.download()));
  EXPECT_FALSE(same_bytes(qkv, one_qkv.download())) << "the rows were prepared in place";
}

// Qwen2 (bias only), Qwen3 (head norms only) and both; whole and partial rotation; bf16 and fp32
// caches.
TEST_P(TokenCounts, QkvPrepAndRopeInOneLaunchEqualTheTwoLaunchesBitForBit) {
  LS_SKIP_WITHOUT_DEVICE();
  for (const int32_t d : {64, 128}) {
    for (const int32_t rotary : {d, d / 2}) {
      for (const int variant : {0, 1, 2}) {
        check_prep_rope<bf16>(GetParam(), d, rotary, variant);
        check_prep_rope<float>(GetParam(), d, rotary, variant);
      }
    }
  }
  float* null_qkv = nullptr;
  const kernels::QkvHeadPrep no_eps{};  // eps 0: refused, as launch_qkv_bias_head_norm refuses it
  float q = 0.0f;
  EXPECT_EQ(kernels::launch_qkv_prep_rope<float>(&q, no_eps, nullptr, nullptr, 1, 1, 1, 2, 2,
                                                 nullptr, nullptr, 1, nullptr, nullptr, nullptr,
                                                 nullptr),
            cudaErrorInvalidValue);
  EXPECT_EQ(kernels::launch_qkv_prep_rope<float>(null_qkv, kernels::QkvHeadPrep{.eps = 1e-6f},
                                                 nullptr, nullptr, 1, 1, 1, 2, 2, nullptr, nullptr,
                                                 1, nullptr, nullptr, nullptr, nullptr),
            cudaErrorInvalidValue);
}

TEST_P(TokenCounts, SwigluMatchesTheReference) {
  LS_SKIP_WITHOUT_DEVICE();
  const int32_t tokens = GetParam(), ffn = 301;
  const std::vector<float> gu = random_floats(size_t(tokens) * 2 * ffn, 5, -4, 4);
  DeviceBuffer<float> d_gu(gu);
  DeviceBuffer<bf16> d_out(size_t(tokens) * ffn);
  ASSERT_EQ(kernels::launch_swiglu(d_gu.ptr, tokens, ffn, d_out.ptr, nullptr), cudaSuccess);
  const std::vector<float> out = gpu_test::from_bf16(d_out.download());
  std::vector<float> ref(out.size());
  for (int32_t t = 0; t < tokens; ++t) {
    for (int32_t i = 0; i < ffn; ++i) {
      const float g = gu[size_t(t) * 2 * ffn + i], u = gu[size_t(t) * 2 * ffn + ffn + i];
      ref[size_t(t) * ffn + i] = ops::swiglu(g, u);
    }
  }
  EXPECT_LT(relative_error(out, ref), kBf16Output);
}

// The four-a-thread kernel (ffn % 4 == 0, gate_up 16-byte aligned) against the one-a-thread one
// (the same values one float past an aligned start): the same bits, bf16 and fp32.
TEST_P(TokenCounts, SwigluFourAThreadHasTheBitsOfOneAThread) {
  LS_SKIP_WITHOUT_DEVICE();
  const int32_t tokens = GetParam(), ffn = 512;
  const std::vector<float> gu = random_floats(size_t(tokens) * 2 * ffn, 6, -6, 6);
  std::vector<float> shifted(gu.size() + 1, 0.0f);
  std::copy(gu.begin(), gu.end(), shifted.begin() + 1);
  DeviceBuffer<float> d_gu(gu), d_shifted(shifted);
  DeviceBuffer<bf16> a(size_t(tokens) * ffn), b(size_t(tokens) * ffn);
  ASSERT_EQ(kernels::launch_swiglu(d_gu.ptr, tokens, ffn, a.ptr, nullptr), cudaSuccess);
  ASSERT_EQ(kernels::launch_swiglu(d_shifted.ptr + 1, tokens, ffn, b.ptr, nullptr), cudaSuccess);
  const std::vector<bf16> va = a.download(), vb = b.download();
  ASSERT_EQ(va.size(), vb.size());
  EXPECT_EQ(std::memcmp(va.data(), vb.data(), va.size() * sizeof(bf16)), 0) << "bf16";
  DeviceBuffer<float> fa(size_t(tokens) * ffn), fb(size_t(tokens) * ffn);
  ASSERT_EQ(kernels::launch_swiglu(d_gu.ptr, tokens, ffn, fa.ptr, nullptr), cudaSuccess);
  ASSERT_EQ(kernels::launch_swiglu(d_shifted.ptr + 1, tokens, ffn, fb.ptr, nullptr), cudaSuccess);
  const std::vector<float> ra = fa.download(), rb = fb.download();
  EXPECT_EQ(std::memcmp(ra.data(), rb.data(), ra.size() * sizeof(float)), 0) << "fp32";
  EXPECT_GT(gpu_test::norm(ra), 0);
}

TEST_P(TokenCounts, ResidualAddIsExact) {
  LS_SKIP_WITHOUT_DEVICE();
  const int64_t n = int64_t{GetParam()} * 333;
  const std::vector<float> a = random_floats(size_t(n), 6, -1, 1), b = random_floats(size_t(n), 7, -1, 1);
  DeviceBuffer<float> d_a(a), d_b(b);
  ASSERT_EQ(kernels::launch_residual_add(d_a.ptr, d_b.ptr, n, nullptr), cudaSuccess);
  const std::vector<float> out = d_a.download();
  for (size_t i = 0; i < out.size(); ++i) ASSERT_EQ(out[i], a[i] + b[i]) << i;
}

// y = x·wᵀ + beta·y through cuBLASLt with pinned plans (bf16 in, fp32 accumulate), against fp64
// on the same bf16 values; beta = 1 is the fused residual add. One plan per (shape, beta ≠ 0),
// made by prepare and only looked up by find: a second product of the same plan gives the same
// bits, and a shape never prepared has no plan (run cannot make one).
TEST_P(TokenCounts, GemmMatchesFp64AndIsDeterministic) {
  LS_SKIP_WITHOUT_DEVICE();
  const int32_t tokens = GetParam(), out_dim = 333, in_dim = 264;
  const std::vector<float> x = random_bf16_values(size_t(tokens) * in_dim, 8, -1, 1);
  const std::vector<float> w = random_bf16_values(size_t(out_dim) * in_dim, 9, -0.1f, 0.1f);
  const std::vector<float> y0 = random_floats(size_t(tokens) * out_dim, 10, -1, 1);
  DeviceBuffer<bf16> d_x(gpu_test::to_bf16(x)), d_w(gpu_test::to_bf16(w));
  DeviceBuffer<float> d_y(y0);
  DeviceBuffer<uint8_t> workspace(size_t(32) << 20);
  kernels::GemmPlans plans(nullptr, workspace.ptr, workspace.count);
  for (const bool accumulate : {false, true}) {
    ASSERT_EQ(plans.prepare(tokens, out_dim, in_dim, accumulate), CUBLAS_STATUS_SUCCESS);
  }
  ASSERT_EQ(plans.prepare(tokens, out_dim, in_dim, false), CUBLAS_STATUS_SUCCESS);
  EXPECT_EQ(plans.plans_count(), 2u) << "one pinned plan per shape and beta kind";
  EXPECT_EQ(plans.find(tokens + 1, out_dim, in_dim, false), nullptr) << "never prepared";
  EXPECT_EQ(plans.find(tokens, out_dim + 1, in_dim, false), nullptr) << "never prepared";
  for (const float beta : {0.0f, 1.0f}) {
    kernels::GemmPlans::Plan* plan = plans.find(tokens, out_dim, in_dim, beta != 0.0f);
    ASSERT_NE(plan, nullptr);
    EXPECT_EQ(plans.run(*plan, d_x.ptr, d_w.ptr, d_y.ptr, 1.0f - beta), CUBLAS_STATUS_INVALID_VALUE)
        << "a plan runs with the beta kind it was made for";
    d_y.upload(y0);
    ASSERT_EQ(plans.run(*plan, d_x.ptr, d_w.ptr, d_y.ptr, beta), CUBLAS_STATUS_SUCCESS);
    const std::vector<float> y = d_y.download();
    EXPECT_LT(relative_error(y, linear_ref(x, w, y0, tokens, out_dim, in_dim, beta)), kFp32)
        << "beta " << beta;
    d_y.upload(y0);
    ASSERT_EQ(plans.run(*plan, d_x.ptr, d_w.ptr, d_y.ptr, beta), CUBLAS_STATUS_SUCCESS);
    EXPECT_EQ(d_y.download(), y) << "run to run";
  }
  EXPECT_EQ(plans.plans_count(), 2u) << "running made no plan";
}

INSTANTIATE_TEST_SUITE_P(OddSizes, TokenCounts, ::testing::Values(1, 7, 129, 2048));

// The fp32 mode's GEMM (CUBLAS_COMPUTE_32F_PEDANTIC): only the order of sums differs from fp64
// on fp32 inputs, so the error is a few ulp of the dot products.
TEST_P(TokenCounts, Fp32GemmIsFullPrecision) {
  LS_SKIP_WITHOUT_DEVICE();
  const int32_t tokens = std::min(GetParam(), 129), out_dim = 333, in_dim = 264;
  const std::vector<float> x = random_floats(size_t(tokens) * in_dim, 18, -1, 1);
  const std::vector<float> w = random_floats(size_t(out_dim) * in_dim, 19, -0.1f, 0.1f);
  const std::vector<float> y0 = random_floats(size_t(tokens) * out_dim, 20, -1, 1);
  DeviceBuffer<float> d_x(x), d_w(w), d_y(y0);
  cublasHandle_t handle = nullptr;
  ASSERT_EQ(cublasCreate(&handle), CUBLAS_STATUS_SUCCESS);
  for (const float beta : {0.0f, 1.0f}) {
    d_y.upload(y0);
    ASSERT_EQ(kernels::gemm_f32_rowmajor(handle, d_x.ptr, d_w.ptr, d_y.ptr, tokens, out_dim,
                                         in_dim, beta),
              CUBLAS_STATUS_SUCCESS);
    const std::vector<float> ref = linear_ref(x, w, y0, tokens, out_dim, in_dim, beta);
    EXPECT_LT(relative_error(d_y.download(), ref), 1e-6) << "beta " << beta;
    EXPECT_GT(gpu_test::norm(ref), 0);
  }
  cublasDestroy(handle);
}

class GemvTokens : public ::testing::TestWithParam<int32_t> {};

// lockstep's decode GEMV (bf16 in, fp32 accumulate) against fp64 on the same bf16 values, for a
// short row (the tail loop only) and a long one (the unrolled loop), beta 0 and 1; run to run
// identical; and each token's result identical to that token run alone (batch invariance).
TEST_P(GemvTokens, GemvMatchesFp64AndIsTokenInvariant) {
  LS_SKIP_WITHOUT_DEVICE();
  const int32_t tokens = GetParam();
  for (const auto& [out_dim, in_dim] : {std::pair{333, 264}, std::pair{67, 8200}}) {
    const std::vector<float> x = random_bf16_values(size_t(tokens) * in_dim, 21, -1, 1);
    const std::vector<float> w = random_bf16_values(size_t(out_dim) * in_dim, 22, -0.1f, 0.1f);
    const std::vector<float> y0 = random_floats(size_t(tokens) * out_dim, 23, -1, 1);
    DeviceBuffer<bf16> d_x(gpu_test::to_bf16(x)), d_w(gpu_test::to_bf16(w));
    DeviceBuffer<float> d_y(y0);
    for (const float beta : {0.0f, 1.0f}) {
      d_y.upload(y0);
      ASSERT_EQ(kernels::launch_gemv_bf16(d_x.ptr, d_w.ptr, d_y.ptr, tokens, out_dim, in_dim, beta,
                                          nullptr),
                cudaSuccess);
      const std::vector<float> y = d_y.download();
      const std::vector<float> ref = linear_ref(x, w, y0, tokens, out_dim, in_dim, beta);
      EXPECT_LT(relative_error(y, ref), kFp32) << out_dim << "x" << in_dim << " beta " << beta;
      EXPECT_GT(gpu_test::norm(ref), 0);
      d_y.upload(y0);
      ASSERT_EQ(kernels::launch_gemv_bf16(d_x.ptr, d_w.ptr, d_y.ptr, tokens, out_dim, in_dim, beta,
                                          nullptr),
                cudaSuccess);
      EXPECT_EQ(d_y.download(), y) << "run to run";
      const int32_t last = tokens - 1;
      DeviceBuffer<bf16> d_x1(gpu_test::to_bf16(std::vector<float>(
          x.begin() + size_t(last) * in_dim, x.begin() + size_t(tokens) * in_dim)));
      DeviceBuffer<float> d_y1(std::vector<float>(y0.begin() + size_t(last) * out_dim,
                                                  y0.begin() + size_t(tokens) * out_dim));
      ASSERT_EQ(kernels::launch_gemv_bf16(d_x1.ptr, d_w.ptr, d_y1.ptr, 1, out_dim, in_dim, beta,
                                          nullptr),
                cudaSuccess);
      EXPECT_TRUE(std::equal(y.begin() + size_t(last) * out_dim, y.end(), d_y1.download().begin()))
          << "token " << last << " alone";
    }
  }
  // Outside its limits the launcher refuses rather than computing something else.
  DeviceBuffer<bf16> d_x(size_t(16) * 9), d_w(size_t(16) * 9);
  DeviceBuffer<float> d_y(16 * 9);
  EXPECT_EQ(kernels::launch_gemv_bf16(d_x.ptr, d_w.ptr, d_y.ptr, kernels::kGemvTokensMax + 1, 4, 8,
                                      0.0f, nullptr),
            cudaErrorInvalidValue);
  EXPECT_EQ(kernels::launch_gemv_bf16(d_x.ptr, d_w.ptr, d_y.ptr, 1, 4, 12, 0.0f, nullptr),
            cudaErrorInvalidValue);
}

INSTANTIATE_TEST_SUITE_P(OddBatches, GemvTokens, ::testing::Values(1, 3, 5, 8));

class LogitsRows : public ::testing::TestWithParam<int32_t> {};

// Rule 5 against CpuBackend::guard_logits and argmax_token: flags, sanitised values, argmax with
// the lowest id on ties, and the logprob pieces.
TEST_P(LogitsRows, GuardSanitisesFlagsAndFindsTheArgmax) {
  LS_SKIP_WITHOUT_DEVICE();
  const int32_t rows = GetParam(), vocab = 128256;
  std::vector<float> logits = random_floats(size_t(rows) * vocab, 11, -5, 5);
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const float inf = std::numeric_limits<float>::infinity();
  for (int32_t r = 0; r < rows; ++r) {
    float* row = logits.data() + size_t(r) * vocab;
    if (r % 3 == 0) row[(r * 17) % vocab] = nan;
    if (r % 4 == 1) row[(r * 29 + 5) % vocab] = inf, row[(r * 31 + 6) % vocab] = inf;
    if (r % 5 == 2) row[(r * 13 + 1) % vocab] = -inf;
    if (r % 2 == 0) row[vocab - 1] = 7.0f, row[(r * 101 + 3) % (vocab - 1)] = 7.0f;  // a tie
  }
  DeviceBuffer<float> d_logits(logits), d_max(rows), d_sum(rows);
  DeviceBuffer<uint8_t> d_workspace(kernels::logits_pass_workspace_bytes(rows, vocab));
  DeviceBuffer<int32_t> d_nan(rows), d_argmax(rows);
  const kernels::LogitsPassArgs pass{.logits = d_logits.ptr, .rows = rows, .vocab = vocab,
                                     .workspace = d_workspace.ptr, .nan_flags = d_nan.ptr,
                                     .argmax = d_argmax.ptr, .row_max = d_max.ptr,
                                     .row_sum = d_sum.ptr};
  ASSERT_EQ(kernels::launch_logits_pass(pass, nullptr), cudaSuccess);
  const std::vector<float> out = d_logits.download(), row_max = d_max.download(),
                           row_sum = d_sum.download();
  const std::vector<int32_t> flags = d_nan.download(), argmax = d_argmax.download();
  for (int32_t r = 0; r < rows; ++r) {
    const float* in = logits.data() + size_t(r) * vocab;
    const float* o = out.data() + size_t(r) * vocab;
    int32_t flag = 0, best = 0;
    std::vector<float> sanitised(in, in + vocab);
    for (float& x : sanitised) {
      if (std::isnan(x)) flag = 1;
      x = ops::sanitised_logit(x);
    }
    for (int32_t i = 1; i < vocab; ++i) if (sanitised[i] > sanitised[best]) best = i;
    double sum = 0;
    for (float x : sanitised) sum += std::exp(double{x} - sanitised[best]);
    ASSERT_EQ(flags[r], flag) << "row " << r;
    ASSERT_EQ(argmax[r], best) << "row " << r;
    ASSERT_EQ(0, std::memcmp(o, sanitised.data(), size_t(vocab) * 4)) << "row " << r;
    EXPECT_EQ(row_max[r], sanitised[best]);
    EXPECT_NEAR(row_sum[r], sum, 1e-5 * sum);
  }
}

INSTANTIATE_TEST_SUITE_P(OddBatches, LogitsRows, ::testing::Values(1, 3, 17, 64));

}  // namespace
}  // namespace ls
