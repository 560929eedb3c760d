// The gate/up product's partials handed to the down product at one token
// (launch_gemm_small_m_norm_gate_up_partials_bf16, then launch_gemm_small_m_swiglu_partials_bf16):
// bit for bit the gate/up product through its SwiGLU reduction into act, then the down product
// from act; where the activations come from on the host (swiglu_source); what is refused.
#include "kernels/gemm_small_m.h"
#include "kernels/gemm_small_m_layout.h"
#include "tests/gpu/gpu_test_support.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

namespace ls {
namespace {

using gpu_test::DeviceBuffer;
using gpu_test::random_bf16_values;
using gpu_test::random_floats;
using bf16 = __nv_bfloat16;

constexpr float kEps = 1e-5f;

std::vector<uint32_t> bits_of(const std::vector<float>& v) {
  std::vector<uint32_t> bits(v.size());
  std::memcpy(bits.data(), v.data(), v.size() * sizeof(float));
  return bits;
}

struct DeviceWorkspace {
  DeviceWorkspace(int32_t out, int32_t in)
      : bytes(kernels::gemm_small_m_workspace_bytes(out, in, 1)),
        buffer(std::max<size_t>(bytes, 16)) {}
  size_t bytes;
  DeviceBuffer<uint8_t> buffer;
};

// Every activation's source is the thread whose fragment rows are the pair's gate row (e = 0)
// and up row (e = 2) of token 0, in the tile of the pair: over every pair of two widths.
TEST(SmallMGemmLayout, SwigluSourceIsThePairsGateAndUpFragmentAtTokenZero) {
  for (const int32_t ffn : {8192, 150}) {
    kernels::small_m::Params p{};
    p.out = 2 * ffn;
    p.epilogue = kernels::small_m::Epilogue::kSwiglu;
    for (int32_t pair = 0; pair < ffn; ++pair) {
      const kernels::small_m::SwigluSource at = kernels::small_m::swiglu_source(pair);
      ASSERT_EQ(kernels::small_m::tile_row_weight(p, at.tile,
                                                  kernels::small_m::fragment_row(at.tid, 0)),
                pair)
          << "ffn " << ffn;
      ASSERT_EQ(kernels::small_m::tile_row_weight(p, at.tile,
                                                  kernels::small_m::fragment_row(at.tid, 2)),
                ffn + pair)
          << "ffn " << ffn;
      ASSERT_EQ(kernels::small_m::fragment_token(at.tid, 0, 0), 0);
      ASSERT_EQ(kernels::small_m::fragment_token(at.tid, 0, 2), 0);
    }
  }
}

// A layer's FFN at one token both ways, from a random residual and norm: down's output over a
// random residual (beta 1), the same bits, twice (the partials workspace reused). Shapes:
// llama-1b's (hidden 2048, ffn 8192: gate/up 2 splits, down 16), llama-8b's (4096, 14336: gate/up
// 1 split, refused), and a small one (hidden 512, ffn 1536: gate/up 24 tiles × 2 splits; down
// 4 tiles × 4 splits of 6 chunks, a block's 384 activations from 6 gate/up tiles' partials).
TEST(SmallMGemm, SwigluPartialsIntoDownMatchTheReducedActivationsThenDownBitForBit) {
  LS_SKIP_WITHOUT_DEVICE();
  struct Layer {
    int32_t hidden, ffn;
  };
  EXPECT_FALSE(kernels::small_m_swiglu_partials_fit(14336, 4096)) << "gate/up does not split";
  for (const Layer layer : {Layer{2048, 8192}, Layer{512, 1536}}) {
    const int32_t hidden = layer.hidden, ffn = layer.ffn;
    SCOPED_TRACE("hidden " + std::to_string(hidden) + ", ffn " + std::to_string(ffn));
    ASSERT_TRUE(kernels::small_m_swiglu_partials_fit(ffn, hidden));
    ASSERT_GT(kernels::gemm_small_m_splits(2 * ffn, hidden), 1);
    DeviceBuffer<float> residual(random_floats(size_t(hidden), 91, -3, 3));
    DeviceBuffer<float> norm_weight(random_floats(size_t(hidden), 92, 0.5f, 1.5f));
    DeviceBuffer<bf16> w_gate_up(gpu_test::to_bf16(
        random_bf16_values(size_t(2) * ffn * hidden, 93, -0.1f, 0.1f)));
    DeviceBuffer<bf16> w_down(
        gpu_test::to_bf16(random_bf16_values(size_t(hidden) * ffn, 94, -0.1f, 0.1f)));
    const std::vector<float> y0 = random_floats(size_t(hidden), 95, -1, 1);
    const kernels::SmallMNorm norm{residual.ptr, norm_weight.ptr, kEps};
    DeviceWorkspace gate_up_ws(2 * ffn, hidden), down_ws(hidden, ffn);

    DeviceBuffer<bf16> act(static_cast<size_t>(ffn));
    DeviceBuffer<float> reference(y0);
    ASSERT_EQ(kernels::launch_gemm_small_m_norm_swiglu_bf16(norm, w_gate_up.ptr, act.ptr, ffn,
                                                            hidden, gate_up_ws.buffer.ptr,
                                                            gate_up_ws.bytes, nullptr),
              cudaSuccess);
    ASSERT_EQ(kernels::launch_gemm_small_m_bf16(act.ptr, w_down.ptr, reference.ptr, 1, hidden,
                                                ffn, 1.0f, down_ws.buffer.ptr, down_ws.bytes,
                                                nullptr),
              cudaSuccess);
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    const std::vector<float> expected = reference.download();
    EXPECT_GT(gpu_test::norm(gpu_test::from_bf16(act.download())), 0);
    EXPECT_NE(bits_of(expected), bits_of(y0)) << "down added something";

    for (int32_t run_index = 0; run_index < 2; ++run_index) {
      DeviceBuffer<float> y(y0);
      ASSERT_EQ(cudaMemset(gate_up_ws.buffer.ptr, 0xff, gate_up_ws.buffer.count), cudaSuccess);
      ASSERT_EQ(kernels::launch_gemm_small_m_norm_gate_up_partials_bf16(
                    norm, w_gate_up.ptr, ffn, hidden, gate_up_ws.buffer.ptr, gate_up_ws.bytes,
                    nullptr),
                cudaSuccess);
      const kernels::SmallMSwigluPartials partials{gate_up_ws.buffer.ptr, ffn, hidden};
      ASSERT_EQ(kernels::launch_gemm_small_m_swiglu_partials_bf16(
                    partials, w_down.ptr, y.ptr, hidden, 1.0f, down_ws.buffer.ptr, down_ws.bytes,
                    nullptr),
                cudaSuccess);
      ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
      EXPECT_EQ(bits_of(y.download()), bits_of(expected)) << "run " << run_index;
    }
  }
}

// Refused, nothing launched: a gate/up shape that does not split, partials of another width than
// the product's in, a misaligned or missing workspace.
TEST(SmallMGemm, SwigluPartialsRefuseWhatTheyCannotRun) {
  LS_SKIP_WITHOUT_DEVICE();
  constexpr int32_t kHidden = 512, kFfn = 1536;
  DeviceBuffer<float> residual(size_t{kHidden}), norm_weight(size_t{kHidden}), y(size_t{kHidden});
  DeviceBuffer<bf16> w(size_t{2} * kFfn * kHidden);
  DeviceWorkspace gate_up_ws(2 * kFfn, kHidden), down_ws(kHidden, kFfn);
  const kernels::SmallMNorm norm{residual.ptr, norm_weight.ptr, kEps};
  // 4096 × 14336 (llama-8b): gate/up is one split, so there are no partials to hand over.
  EXPECT_EQ(kernels::launch_gemm_small_m_norm_gate_up_partials_bf16(
                norm, w.ptr, 14336, 4096, gate_up_ws.buffer.ptr, gate_up_ws.bytes, nullptr),
            cudaErrorInvalidValue);
  EXPECT_EQ(kernels::launch_gemm_small_m_norm_gate_up_partials_bf16(
                norm, w.ptr, kFfn, kHidden, gate_up_ws.buffer.ptr, gate_up_ws.bytes - 16, nullptr),
            cudaErrorInvalidValue)
      << "a workspace too small";
  const auto down = [&](const kernels::SmallMSwigluPartials& from) {
    return kernels::launch_gemm_small_m_swiglu_partials_bf16(
        from, w.ptr, y.ptr, kHidden, 1.0f, down_ws.buffer.ptr, down_ws.bytes, nullptr);
  };
  uint8_t* partials = gate_up_ws.buffer.ptr;
  EXPECT_EQ(down({partials, kFfn, kHidden}), cudaSuccess) << "the valid call, for contrast";
  EXPECT_EQ(down({nullptr, kFfn, kHidden}), cudaErrorInvalidValue);
  EXPECT_EQ(down({partials + 4, kFfn, kHidden}), cudaErrorInvalidValue) << "misaligned";
  EXPECT_EQ(down({partials, 14336, 4096}), cudaErrorInvalidValue) << "an unsplit gate/up";
  EXPECT_EQ(down({partials, kFfn, 0}), cudaErrorInvalidValue);
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);
}

}  // namespace
}  // namespace ls
