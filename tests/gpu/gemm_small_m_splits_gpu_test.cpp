// The small-M GEMM at split counts other than the production rule's (kernels/gemm_small_m_tuning.h:
// what the sweep measures), powers of two and not: against fp64 dot products on the host, run to
// run, and a probe token's row the same bits at every token count.
#include "kernels/gemm_small_m.h"
#include "kernels/gemm_small_m_tuning.h"
#include "tests/gpu/gpu_test_support.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

namespace ls {
namespace {

using gpu_test::DeviceBuffer;
using bf16 = __nv_bfloat16;

constexpr double kFp32 = 1e-5;  // as tests/gpu/gemm_small_m_gpu_test.cpp argues

struct Case {
  int32_t out, in, wanted_splits;
};

// (67, 8200): one tile, 129 chunks in 26 ranges (not a power of two) or 3; (300, 4096): three
// tiles, 64 chunks in 16 or 5 ranges.
constexpr Case kCases[] = {{67, 8200, 26}, {67, 8200, 3}, {300, 4096, 16}, {300, 4096, 5}};
std::vector<uint32_t> bits_of(const std::vector<float>& v) {
  std::vector<uint32_t> bits(v.size());
  std::memcpy(bits.data(), v.data(), v.size() * sizeof(float));
  return bits;
}

// One case's weights and workspace.
struct Rig {
  explicit Rig(const Case& shape)
      : c(shape),
        w_host(gpu_test::random_bf16_values(size_t(c.out) * c.in, 51, -0.1f, 0.1f)),
        w(gpu_test::to_bf16(w_host)),
        bytes(kernels::gemm_small_m_workspace_bytes_with(c.out, c.in,
                                                         kernels::kSmallMGemmTokensMax,
                                                         c.wanted_splits)),
        workspace(std::max<size_t>(bytes, 1)) {
    EXPECT_EQ(cudaMemset(workspace.ptr, 0, workspace.count), cudaSuccess);
  }

  // y for x (tokens rows) over y0 with beta.
  std::vector<float> run(const std::vector<float>& x, const std::vector<float>& y0, int32_t tokens,
                         float beta) {
    DeviceBuffer<bf16> d_x(gpu_test::to_bf16(x));
    DeviceBuffer<float> d_y(y0);
    EXPECT_EQ(kernels::launch_gemm_small_m_bf16_with(d_x.ptr, w.ptr, d_y.ptr, tokens, c.out, c.in,
                                                     beta, workspace.ptr, bytes, c.wanted_splits,
                                                     nullptr),
              cudaSuccess);
    EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    return d_y.download();
  }

  Case c;
  std::vector<float> w_host;
  DeviceBuffer<bf16> w;
  size_t bytes;
  DeviceBuffer<uint8_t> workspace;
};

TEST(SmallMGemmSplits, EachMatchesFp64AndRepeatsItsBits) {
  LS_SKIP_WITHOUT_DEVICE();
  for (const Case& c : kCases) {
    Rig rig(c);
    ASSERT_GT(kernels::gemm_small_m_splits_with(c.out, c.in, c.wanted_splits), 1);
    for (const int32_t tokens : {1, 9, 64}) {
      const std::vector<float> x = gpu_test::random_bf16_values(size_t(tokens) * c.in, 52, -1, 1);
      const std::vector<float> y0 = gpu_test::random_floats(size_t(tokens) * c.out, 53, -1, 1);
      for (const float beta : {0.0f, 1.0f}) {
        const std::vector<float> ref =
            gpu_test::linear_ref(x, rig.w_host, y0, tokens, c.out, c.in, beta);
        const std::vector<float> y = rig.run(x, y0, tokens, beta);
        EXPECT_LT(gpu_test::relative_error(y, ref), kFp32)
            << c.out << "x" << c.in << " / " << c.wanted_splits << ", " << tokens << " tokens";
        EXPECT_EQ(bits_of(rig.run(x, y0, tokens, beta)), bits_of(y))
            << "run to run: " << c.out << "x" << c.in << " / " << c.wanted_splits;
      }
    }
  }
}

// A probe token's row at 1, 3, 17 and 64 tokens, the other rows random: each split's bits the
// same at every count.
TEST(SmallMGemmSplits, ARowsBitsDoNotDependOnTheOtherTokens) {
  LS_SKIP_WITHOUT_DEVICE();
  for (const Case& c : kCases) {
    Rig rig(c);
    const std::vector<float> probe = gpu_test::random_bf16_values(size_t(c.in), 54, -1, 1);
    {
      std::vector<uint32_t> alone;
      for (const int32_t tokens : {1, 3, 17, 64}) {
        const int32_t at = tokens / 2;
        std::vector<float> x =
            gpu_test::random_bf16_values(size_t(tokens) * c.in, 60 + uint32_t(tokens), -1, 1);
        std::copy(probe.begin(), probe.end(), x.begin() + size_t(at) * c.in);
        const std::vector<float> y0(size_t(tokens) * c.out, 0.0f);
        const std::vector<float> y = rig.run(x, y0, tokens, 0.0f);
        const std::vector<float> row(y.begin() + size_t(at) * c.out,
                                     y.begin() + size_t(at + 1) * c.out);
        if (alone.empty()) alone = bits_of(row);
        EXPECT_EQ(bits_of(row), alone) << c.out << "x" << c.in << " / " << c.wanted_splits << ", "
                                       << tokens << " tokens";
      }
    }
  }
}

}  // namespace
}  // namespace ls
