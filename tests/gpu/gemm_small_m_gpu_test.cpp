// lockstep's small-M tensor-core GEMM (kernels/gemm_small_m.h): against fp64 dot products of the
// same bf16 values on the host, with beta 0 and 1, on shapes that split K and shapes that do not,
// `out` not a multiple of the 128-row tile and `in` not a multiple of the 64-wide chunk; the bits
// of one token's row the same at every token count (batch invariance); a second launch over the
// same workspace the same bits; refusals outside its limits; its SwiGLU and RoPE + KV-write
// epilogues against the product then launch_swiglu or launch_rope_qkv, bit for bit; and the CUDA
// backend with it switched on (plans, eager vs graphs, refusals of the option).
#include "core/check.h"
#include "kernels/cuda_backend.h"
#include "kernels/gemm_small_m.h"
#include "kernels/gemm_small_m_layout.h"
#include "kernels/layer_ops.h"
#include "tests/gpu/backend_test_support.h"
#include "tests/gpu/gpu_test_support.h"
#include "tests/test_support.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <string>
#include <tuple>
#include <vector>

namespace ls {
namespace {

using gpu_test::DeviceBuffer;
using gpu_test::linear_ref;
using gpu_test::random_bf16_values;
using gpu_test::random_floats;
using gpu_test::relative_error;
using gpu_test::same_bits;
using bf16 = __nv_bfloat16;

// fp32 accumulation of exact bf16 products: each sum is ~in / 16 chained MMA results plus the
// split partials, each addition rounding by ≤ 2^-24 of the running sum, so a norm-wise error of
// a few 1e-7 at these sizes (random signs); the MMA's internal alignment of its 16 products adds
// about as much. 1e-5 is the bound of every fp32-accumulating linear-layer test here (cuBLAS, the
// GEMV); a wrong fragment, a missing chunk or a dropped split gives errors of order 1e-2 or more.
constexpr double kFp32 = 1e-5;

struct Shape {
  int32_t out, in;
};

// (333, 264): one split, out past 2 tiles, in = 4 chunks + 8; (67, 8200): one tile, 26 splits of
// 5 chunks, the last of 4 (8200 = 128 · 64 + 8); (300, 4096): 3 tiles × 16 splits; (3072, 2048):
// llama-1b's q/k/v (24 tiles × 8 splits); (200, 520): 2 tiles × 2 splits of 5 and 4 chunks (the
// last ending 8 into its chunk), at up to 8 tokens reduced in a cluster
// (kernels/gemm_small_m_reduce.cuh), above by the reduction kernel.
constexpr Shape kShapes[] = {{333, 264}, {67, 8200}, {300, 4096}, {3072, 2048}, {200, 520}};

// Device workspace for `shape` at up to 64 tokens (zeroed, though nothing needs it: the partials
// are written before they are read).
struct Workspace {
  explicit Workspace(Shape shape)
      : bytes(kernels::gemm_small_m_workspace_bytes(shape.out, shape.in,
                                                    kernels::kSmallMGemmTokensMax)),
        buffer(std::max<size_t>(bytes, 1)) {
    EXPECT_EQ(cudaMemset(buffer.ptr, 0, buffer.count), cudaSuccess);
  }
  size_t bytes;
  DeviceBuffer<uint8_t> buffer;
};

cudaError_t run(const DeviceBuffer<bf16>& x, const DeviceBuffer<bf16>& w, DeviceBuffer<float>& y,
                int32_t tokens, Shape shape, float beta, Workspace& ws) {
  const cudaError_t launched = kernels::launch_gemm_small_m_bf16(
      x.ptr, w.ptr, y.ptr, tokens, shape.out, shape.in, beta, ws.buffer.ptr, ws.bytes, nullptr);
  if (launched != cudaSuccess) return launched;
  return cudaDeviceSynchronize();
}

TEST(SmallMGemm, SplitsDependOnTheShapeOnly) {
  EXPECT_EQ(kernels::gemm_small_m_splits(333, 264), 1);
  EXPECT_EQ(kernels::gemm_small_m_splits(67, 8200), 26);
  EXPECT_EQ(kernels::gemm_small_m_splits(300, 4096), 16);
  EXPECT_EQ(kernels::gemm_small_m_splits(3072, 2048), 8);
  // Up to two blocks for each of 132 SMs: llama-1b gate/up's 128 tiles split in two, llama-8b
  // down's 32 tiles in eight; llama-8b gate/up's 224 tiles and the LM head's do not split.
  EXPECT_EQ(kernels::gemm_small_m_splits(16384, 2048), 2);
  EXPECT_EQ(kernels::gemm_small_m_splits(4096, 14336), 8);
  EXPECT_EQ(kernels::gemm_small_m_splits(28672, 4096), 1);
  EXPECT_EQ(kernels::gemm_small_m_splits(128256, 2048), 1);
  EXPECT_EQ(kernels::gemm_small_m_workspace_bytes(333, 264, 64), 0u);
  EXPECT_GT(kernels::gemm_small_m_workspace_bytes(67, 8200, 64),
            kernels::gemm_small_m_workspace_bytes(67, 8200, 8));
}

class SmallMGemmTokens : public ::testing::TestWithParam<int32_t> {};

// Against fp64 on the host, beta 0 and 1 (the residual add: y0 must be read once and added), and
// run to run: a second launch over the same workspace (the first's partials still in it) gives
// the same bits.
TEST_P(SmallMGemmTokens, MatchesFp64AndRepeatsItsBits) {
  LS_SKIP_WITHOUT_DEVICE();
  const int32_t tokens = GetParam();
  for (const Shape shape : kShapes) {
    if (shape.out * int64_t{shape.in} > 1'000'000 && tokens != 1 && tokens != 17 && tokens != 64) {
      continue;  // the host reference of the large shape at three token counts only
    }
    const std::vector<float> x = random_bf16_values(size_t(tokens) * shape.in, 31, -1, 1);
    const std::vector<float> w =
        random_bf16_values(size_t(shape.out) * shape.in, 32, -0.1f, 0.1f);
    const std::vector<float> y0 = random_floats(size_t(tokens) * shape.out, 33, -1, 1);
    DeviceBuffer<bf16> d_x(gpu_test::to_bf16(x)), d_w(gpu_test::to_bf16(w));
    DeviceBuffer<float> d_y(y0);
    Workspace ws(shape);
    for (const float beta : {0.0f, 1.0f}) {
      d_y.upload(y0);
      ASSERT_EQ(run(d_x, d_w, d_y, tokens, shape, beta, ws), cudaSuccess);
      const std::vector<float> y = d_y.download();
      const std::vector<float> ref = linear_ref(x, w, y0, tokens, shape.out, shape.in, beta);
      const double error = relative_error(y, ref);
      EXPECT_LT(error, kFp32) << shape.out << "x" << shape.in << " beta " << beta;
      std::printf("small-M GEMM %d tokens × [%d, %d] beta %.0f: relative error %.2e\n", tokens,
                  shape.out, shape.in, beta, error);
      EXPECT_GT(gpu_test::norm(ref), 0);
      d_y.upload(y0);
      ASSERT_EQ(run(d_x, d_w, d_y, tokens, shape, beta, ws), cudaSuccess);
      EXPECT_EQ(d_y.download(), y) << "run to run, " << shape.out << "x" << shape.in;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(DecodeBatches, SmallMGemmTokens,
                         ::testing::Values(1, 2, 3, 8, 9, 17, 33, 64));

std::vector<uint32_t> bits_of(const float* begin, size_t count) {
  std::vector<uint32_t> bits(count);
  std::memcpy(bits.data(), begin, count * sizeof(float));
  return bits;
}

// One probe token's output row, computed at token counts 1, 2, 3, 8 and then one of each n-tile
// count (9 .. 64: every wgmma N from 16 to 64) with different other rows around it and at
// different positions (the last row, the middle one), with beta 0 and 1: bit for bit the row the
// probe gives alone.
TEST(SmallMGemm, ARowsBitsDoNotDependOnTheOtherTokens) {
  LS_SKIP_WITHOUT_DEVICE();
  for (const Shape shape : kShapes) {
    const std::vector<float> w =
        random_bf16_values(size_t(shape.out) * shape.in, 41, -0.1f, 0.1f);
    const std::vector<float> probe = random_bf16_values(size_t(shape.in), 42, -1, 1);
    const std::vector<float> probe_y0 = random_floats(size_t(shape.out), 43, -1, 1);
    DeviceBuffer<bf16> d_w(gpu_test::to_bf16(w));
    Workspace ws(shape);
    for (const float beta : {0.0f, 1.0f}) {
      std::vector<uint32_t> alone;
      for (const int32_t tokens : {1, 2, 3, 8, 9, 17, 32, 33, 48, 56, 64}) {
        for (const int32_t at : {tokens - 1, (tokens - 1) / 2}) {
          std::vector<float> x =
              random_bf16_values(size_t(tokens) * shape.in, 100 + uint32_t(tokens), -1, 1);
          std::vector<float> y0 =
              random_floats(size_t(tokens) * shape.out, 200 + uint32_t(tokens), -1, 1);
          std::copy(probe.begin(), probe.end(), x.begin() + size_t(at) * shape.in);
          std::copy(probe_y0.begin(), probe_y0.end(), y0.begin() + size_t(at) * shape.out);
          DeviceBuffer<bf16> d_x(gpu_test::to_bf16(x));
          DeviceBuffer<float> d_y(y0);
          ASSERT_EQ(run(d_x, d_w, d_y, tokens, shape, beta, ws), cudaSuccess);
          const std::vector<float> y = d_y.download();
          const std::vector<uint32_t> row = bits_of(y.data() + size_t(at) * shape.out, shape.out);
          if (alone.empty()) {
            alone = row;
            continue;
          }
          EXPECT_EQ(row, alone) << shape.out << "x" << shape.in << " beta " << beta << ": "
                                << tokens << " tokens, probe at " << at;
        }
      }
    }
  }
}

// Outside its limits the launcher refuses rather than computing something else.
TEST(SmallMGemm, RefusesWhatItCannotRun) {
  LS_SKIP_WITHOUT_DEVICE();
  const Shape split{67, 8200};
  DeviceBuffer<bf16> x(size_t(65) * 8200), w(size_t(67) * 8200);
  DeviceBuffer<float> y(size_t(65) * 67);
  Workspace ws(split);
  const auto launch = [&](const bf16* xp, int32_t tokens, int32_t in, size_t ws_bytes) {
    return kernels::launch_gemm_small_m_bf16(xp, w.ptr, y.ptr, tokens, split.out, in, 0.0f,
                                             ws.buffer.ptr, ws_bytes, nullptr);
  };
  EXPECT_EQ(launch(x.ptr, 0, 8200, ws.bytes), cudaErrorInvalidValue);
  EXPECT_EQ(launch(x.ptr, kernels::kSmallMGemmTokensMax + 1, 8200, ws.bytes),
            cudaErrorInvalidValue);
  EXPECT_EQ(launch(x.ptr, 4, 8196, ws.bytes), cudaErrorInvalidValue);  // in % 8 != 0
  EXPECT_EQ(launch(x.ptr + 1, 4, 8200, ws.bytes), cudaErrorInvalidValue);  // x misaligned
  EXPECT_EQ(launch(x.ptr, 64, 8200, kernels::gemm_small_m_workspace_bytes(67, 8200, 63) - 1),
            cudaErrorInvalidValue);  // a split shape's workspace too small
  EXPECT_EQ(cudaGetLastError(), cudaSuccess) << "nothing was launched";
}

// The SwiGLU epilogue (launch_gemm_small_m_swiglu_bf16) against what it replaces, the product
// into a [tokens, 2·ffn] buffer then launch_swiglu: the same bits at every token count, twice.
// (8192, 2048): llama-1b's gate/up, two splits; (150, 4096): 300 rows in 3 tiles, 16 splits, the
// last tile with 22 of its 64 gate rows; (100, 264): two tiles, no split.
TEST(SmallMGemm, SwigluEpilogueMatchesTheProductThenSwigluBitForBit) {
  LS_SKIP_WITHOUT_DEVICE();
  struct FfnShape {
    int32_t ffn, in;
  };
  for (const FfnShape shape : {FfnShape{8192, 2048}, FfnShape{150, 4096}, FfnShape{100, 264}}) {
    const Shape product{2 * shape.ffn, shape.in};
    const std::vector<float> w =
        random_bf16_values(size_t(product.out) * shape.in, 61, -0.1f, 0.1f);
    DeviceBuffer<bf16> d_w(gpu_test::to_bf16(w));
    Workspace ws(product);
    for (const int32_t tokens : {1, 2, 9, 17, 64}) {
      SCOPED_TRACE(std::to_string(shape.ffn) + "x" + std::to_string(shape.in) + ", " +
                   std::to_string(tokens) + " tokens");
      DeviceBuffer<bf16> d_x(
          gpu_test::to_bf16(random_bf16_values(size_t(tokens) * shape.in, 62, -1, 1)));
      DeviceBuffer<float> gate_up(size_t(tokens) * product.out);
      DeviceBuffer<bf16> unfused(size_t(tokens) * shape.ffn), fused(size_t(tokens) * shape.ffn);
      ASSERT_EQ(run(d_x, d_w, gate_up, tokens, product, 0.0f, ws), cudaSuccess);
      ASSERT_EQ(kernels::launch_swiglu(gate_up.ptr, tokens, shape.ffn, unfused.ptr, nullptr),
                cudaSuccess);
      const std::vector<bf16> reference = unfused.download();
      for (int32_t run_index = 0; run_index < 2; ++run_index) {
        ASSERT_EQ(cudaMemset(fused.ptr, 0xff, fused.count * sizeof(bf16)), cudaSuccess);  // NaNs
        ASSERT_EQ(kernels::launch_gemm_small_m_swiglu_bf16(d_x.ptr, d_w.ptr, fused.ptr, tokens,
                                                           shape.ffn, shape.in, ws.buffer.ptr,
                                                           ws.bytes, nullptr),
                  cudaSuccess);
        ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
        const std::vector<bf16> got = fused.download();
        EXPECT_EQ(0, std::memcmp(got.data(), reference.data(), got.size() * sizeof(bf16)))
            << "run " << run_index;
      }
      const std::vector<float> values = gpu_test::from_bf16(reference);
      EXPECT_GT(gpu_test::norm(values), 0);
      for (const float v : values) ASSERT_FALSE(std::isnan(v));
    }
  }
  // Refused as the product is, and without an output.
  DeviceBuffer<bf16> x(size_t(65) * 264), w(size_t(200) * 264), act(size_t(65) * 100);
  Workspace ws(Shape{200, 264});
  const auto launch = [&](bf16* out, int32_t tokens, int32_t ffn, int32_t in) {
    return kernels::launch_gemm_small_m_swiglu_bf16(x.ptr, w.ptr, out, tokens, ffn, in,
                                                    ws.buffer.ptr, ws.bytes, nullptr);
  };
  EXPECT_EQ(launch(nullptr, 4, 100, 264), cudaErrorInvalidValue);
  EXPECT_EQ(launch(act.ptr, 0, 100, 264), cudaErrorInvalidValue);
  EXPECT_EQ(launch(act.ptr, kernels::kSmallMGemmTokensMax + 1, 100, 264), cudaErrorInvalidValue);
  EXPECT_EQ(launch(act.ptr, 4, 0, 264), cudaErrorInvalidValue);
  EXPECT_EQ(launch(act.ptr, 4, 100, 260), cudaErrorInvalidValue);  // in % 8 != 0
  EXPECT_EQ(cudaGetLastError(), cudaSuccess) << "nothing was launched";
}
// The paired epilogues' tile rows, on the host: over every tile, each weight row once; a
// thread's fragment rows g and g + 8 (elements 0, 1 and 2, 3) a pair's first row and its
// partner, half further (SwiGLU: gate j and up ffn + j; RoPE: a head's i and i + head_dim/2).
TEST(SmallMGemmLayout, PairedTilesCoverEveryRowOnceWithPartnersHalfApart) {
  using kernels::small_m::Epilogue;
  struct Case {
    Epilogue epilogue;
    int32_t out, head_dim;
  };
  for (const Case c : {Case{Epilogue::kSwiglu, 2 * 8192, 0}, Case{Epilogue::kSwiglu, 2 * 150, 0},
                       Case{Epilogue::kRopeKv, 3072, 64}, Case{Epilogue::kRopeKv, 50, 10},
                       Case{Epilogue::kRopeKv, 1024, 128}}) {
    kernels::small_m::Params p{};
    p.out = c.out;
    p.epilogue = c.epilogue;
    p.rope.head_dim = c.head_dim;
    const int32_t half = kernels::small_m::pair_half(p);
    const int32_t tiles = (c.out + kernels::small_m::kTileRows - 1) / kernels::small_m::kTileRows;
    std::vector<int32_t> seen(size_t(c.out), 0);
    for (int32_t tile = 0; tile < tiles; ++tile) {
      for (int32_t r = 0; r < kernels::small_m::kTileRows; ++r) {
        const int32_t row = kernels::small_m::tile_row_weight(p, tile, r);
        if (row >= 0) ++seen[size_t(row)];
      }
      for (int32_t tid = 0; tid < kernels::small_m::kThreads; ++tid) {
        const int32_t first = kernels::small_m::tile_row_weight(
            p, tile, kernels::small_m::fragment_row(tid, 0));
        const int32_t second = kernels::small_m::tile_row_weight(
            p, tile, kernels::small_m::fragment_row(tid, 2));
        ASSERT_EQ(first < 0, second < 0) << "tile " << tile << " thread " << tid;
        if (first < 0) continue;
        EXPECT_EQ(second, first + half) << "tile " << tile << " thread " << tid;
        EXPECT_LT(first % (2 * half), half) << "a first row in its group's first half";
      }
    }
    EXPECT_EQ(std::count(seen.begin(), seen.end(), 1), c.out) << c.out << " rows";
  }
}

// The RoPE + KV-write epilogue (launch_gemm_small_m_rope_kv_bf16) against the product into a qkv
// buffer then launch_rope_qkv (rotary_dim = head_dim): Q, and the whole K and V caches (written at
// random distinct slots), the same bits at every token count. Heads: llama-1b's (32 + 2·8 of 64:
// 3072 rows, 8 splits); 4 + 2·2 of 128 over in 4096 (1024 rows, 16 splits); 3 + 2·1 of 10 over
// in 264 (50 rows in one tile; a head's 5 pairs cross the epilogue's 8-row groups).
TEST(SmallMGemm, RopeKvEpilogueMatchesTheProductThenRopeBitForBit) {
  LS_SKIP_WITHOUT_DEVICE();
  struct Heads {
    int32_t query, kv, dim, in;
  };
  constexpr int32_t kSlots = 96, kPositions = 80;
  for (const Heads heads : {Heads{32, 8, 64, 2048}, Heads{4, 2, 128, 4096}, Heads{3, 1, 10, 264}}) {
    const Shape product{(heads.query + 2 * heads.kv) * heads.dim, heads.in};
    const int32_t kv_size = heads.kv * heads.dim, q_size = heads.query * heads.dim;
    const int32_t half = heads.dim / 2;
    DeviceBuffer<bf16> d_w(gpu_test::to_bf16(
        random_bf16_values(size_t(product.out) * heads.in, 71, -0.1f, 0.1f)));
    DeviceBuffer<float> cos(random_floats(size_t(kPositions) * half, 72, -1, 1));
    DeviceBuffer<float> sin(random_floats(size_t(kPositions) * half, 73, -1, 1));
    const std::vector<bf16> cache0 =
        gpu_test::to_bf16(random_floats(size_t(kSlots) * kv_size, 74, -1, 1));
    Workspace ws(product);
    for (const int32_t tokens : {1, 2, 9, 17, 64}) {
      SCOPED_TRACE(std::to_string(heads.query) + "+2x" + std::to_string(heads.kv) + " heads of " +
                   std::to_string(heads.dim) + ", " + std::to_string(tokens) + " tokens");
      std::vector<int32_t> positions(static_cast<size_t>(tokens));
      std::vector<int64_t> slots(static_cast<size_t>(tokens));
      for (int32_t t = 0; t < tokens; ++t) {
        positions[size_t(t)] = (7 * t + 3) % (kPositions + 5);  // some past the table: clamped
        slots[size_t(t)] = (37 * t + 11) % kSlots;              // distinct: 37 is prime to 96
      }
      DeviceBuffer<int32_t> d_positions(positions);
      DeviceBuffer<int64_t> d_slots(slots);
      DeviceBuffer<bf16> d_x(
          gpu_test::to_bf16(random_bf16_values(size_t(tokens) * heads.in, 75, -1, 1)));
      struct Written {
        std::vector<float> q;
        std::vector<bf16> k, v;
      };
      const auto written = [&](bool fused) {
        DeviceBuffer<float> q(size_t(tokens) * q_size), qkv(size_t(tokens) * product.out);
        DeviceBuffer<bf16> k(cache0), v(cache0);
        EXPECT_EQ(cudaMemset(q.ptr, 0xff, q.count * sizeof(float)), cudaSuccess);  // NaNs
        const kernels::RopeKvTarget target{
            .positions = d_positions.ptr,
            .slots = d_slots.ptr,
            .query_heads = heads.query,
            .kv_heads = heads.kv,
            .head_dim = heads.dim,
            .cos = cos.ptr,
            .sin = sin.ptr,
            .positions_count = kPositions,
            .q_out = q.ptr,
            .k_cache = k.ptr,
            .v_cache = v.ptr,
        };
        if (fused) {
          EXPECT_EQ(kernels::launch_gemm_small_m_rope_kv_bf16(d_x.ptr, d_w.ptr, target, tokens,
                                                              heads.in, ws.buffer.ptr, ws.bytes,
                                                              nullptr),
                    cudaSuccess);
        } else {
          EXPECT_EQ(run(d_x, d_w, qkv, tokens, product, 0.0f, ws), cudaSuccess);
          EXPECT_EQ(kernels::launch_rope_qkv(qkv.ptr, d_positions.ptr, d_slots.ptr, tokens,
                                             heads.query, heads.kv, heads.dim, heads.dim, cos.ptr,
                                             sin.ptr, kPositions, q.ptr, k.ptr, v.ptr, nullptr),
                    cudaSuccess);
        }
        EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
        return Written{q.download(), k.download(), v.download()};
      };
      const Written reference = written(false);
      for (int32_t run_index = 0; run_index < 2; ++run_index) {
        const Written got = written(true);
        EXPECT_TRUE(same_bits(got.q, reference.q)) << "Q, run " << run_index;
        EXPECT_TRUE(same_bits(got.k, reference.k)) << "K cache, run " << run_index;
        EXPECT_TRUE(same_bits(got.v, reference.v)) << "V cache, run " << run_index;
      }
      EXPECT_GT(gpu_test::norm(reference.q), 0);
      for (const float x : reference.q) ASSERT_FALSE(std::isnan(x));
      EXPECT_FALSE(same_bits(reference.k, cache0)) << "the product wrote K";
    }
  }
  // Refused without its target, or with heads that do not make the rows.
  DeviceBuffer<bf16> x(size_t(4) * 264), w(size_t(50) * 264);
  Workspace ws(Shape{50, 264});
  EXPECT_EQ(kernels::launch_gemm_small_m_rope_kv_bf16(x.ptr, w.ptr, kernels::RopeKvTarget{}, 4,
                                                      264, ws.buffer.ptr, ws.bytes, nullptr),
            cudaErrorInvalidValue);
  EXPECT_EQ(cudaGetLastError(), cudaSuccess) << "nothing was launched";
}
// The folded norm (one token): launch_gemm_small_m_norm_{swiglu,rope_kv}_bf16 against
// launch_rms_norm then the same epilogue from the normed row, bit for bit, twice. The shapes of
// the two epilogue tests above with `in` the norm's width; random residual and norm weights.
TEST(SmallMGemm, FoldedNormMatchesTheNormThenTheProductBitForBit) {
  LS_SKIP_WITHOUT_DEVICE();
  constexpr float kEps = 1e-5f;
  for (const int32_t in : {2048, 4096}) {
    SCOPED_TRACE("in " + std::to_string(in));
    DeviceBuffer<float> residual(random_floats(size_t(in), 81, -3, 3));
    DeviceBuffer<float> weight(random_floats(size_t(in), 82, 0.5f, 1.5f));
    DeviceBuffer<bf16> normed(static_cast<size_t>(in));
    ASSERT_EQ(kernels::launch_rms_norm(residual.ptr, nullptr, 1, in, weight.ptr, kEps, normed.ptr,
                                       nullptr),
              cudaSuccess);
    const kernels::SmallMNorm norm{residual.ptr, weight.ptr, kEps};
    {  // SwiGLU: 8192 gate rows (llama-1b's, 2 splits at in 2048) and 150 (3 tiles, 16 splits)
      for (const int32_t ffn : {8192, 150}) {
        const Shape product{2 * ffn, in};
        DeviceBuffer<bf16> w(gpu_test::to_bf16(
            random_bf16_values(size_t(product.out) * in, 83, -0.1f, 0.1f)));
        Workspace ws(product);
        DeviceBuffer<bf16> unfolded(static_cast<size_t>(ffn)), folded(static_cast<size_t>(ffn));
        ASSERT_EQ(kernels::launch_gemm_small_m_swiglu_bf16(normed.ptr, w.ptr, unfolded.ptr, 1, ffn,
                                                           in, ws.buffer.ptr, ws.bytes, nullptr),
                  cudaSuccess);
        const std::vector<bf16> reference = unfolded.download();
        for (int32_t run_index = 0; run_index < 2; ++run_index) {
          ASSERT_EQ(cudaMemset(folded.ptr, 0xff, folded.count * sizeof(bf16)), cudaSuccess);
          ASSERT_EQ(kernels::launch_gemm_small_m_norm_swiglu_bf16(norm, w.ptr, folded.ptr, ffn, in,
                                                                  ws.buffer.ptr, ws.bytes,
                                                                  nullptr),
                    cudaSuccess);
          ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
          EXPECT_TRUE(same_bits(folded.download(), reference))
              << "SwiGLU, ffn " << ffn << ", run " << run_index;
        }
        EXPECT_GT(gpu_test::norm(gpu_test::from_bf16(reference)), 0);
      }
    }
    {  // RoPE: llama-8b's heads at in 4096 would be 6144 rows; 4 + 2·2 of 128 keeps it small
      constexpr int32_t kQuery = 4, kKv = 2, kDim = 128, kSlots = 8, kPositions = 16;
      const Shape product{(kQuery + 2 * kKv) * kDim, in};
      DeviceBuffer<bf16> w(gpu_test::to_bf16(
          random_bf16_values(size_t(product.out) * in, 84, -0.1f, 0.1f)));
      DeviceBuffer<float> cos(random_floats(size_t(kPositions) * kDim / 2, 85, -1, 1));
      DeviceBuffer<float> sin(random_floats(size_t(kPositions) * kDim / 2, 86, -1, 1));
      DeviceBuffer<int32_t> position(std::vector<int32_t>{11});
      DeviceBuffer<int64_t> slot(std::vector<int64_t>{5});
      const std::vector<bf16> cache0 =
          gpu_test::to_bf16(random_floats(size_t(kSlots) * kKv * kDim, 87, -1, 1));
      Workspace ws(product);
      const auto written = [&](bool fold) {
        DeviceBuffer<float> q(size_t(kQuery) * kDim);
        DeviceBuffer<bf16> k(cache0), v(cache0);
        const kernels::RopeKvTarget target{.positions = position.ptr,
                                           .slots = slot.ptr,
                                           .query_heads = kQuery,
                                           .kv_heads = kKv,
                                           .head_dim = kDim,
                                           .cos = cos.ptr,
                                           .sin = sin.ptr,
                                           .positions_count = kPositions,
                                           .q_out = q.ptr,
                                           .k_cache = k.ptr,
                                           .v_cache = v.ptr};
        EXPECT_EQ(fold ? kernels::launch_gemm_small_m_norm_rope_kv_bf16(
                             norm, w.ptr, target, in, ws.buffer.ptr, ws.bytes, nullptr)
                       : kernels::launch_gemm_small_m_rope_kv_bf16(normed.ptr, w.ptr, target, 1,
                                                                   in, ws.buffer.ptr, ws.bytes,
                                                                   nullptr),
                  cudaSuccess);
        EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
        return std::make_tuple(q.download(), k.download(), v.download());
      };
      const auto reference = written(false);
      for (int32_t run_index = 0; run_index < 2; ++run_index) {
        const auto got = written(true);
        EXPECT_TRUE(same_bits(std::get<0>(got), std::get<0>(reference))) << "Q, run " << run_index;
        EXPECT_TRUE(same_bits(std::get<1>(got), std::get<1>(reference))) << "K, run " << run_index;
        EXPECT_TRUE(same_bits(std::get<2>(got), std::get<2>(reference))) << "V, run " << run_index;
      }
    }
  }
  // Refused: a width past the vectorised norm, a misaligned residual, no eps.
  DeviceBuffer<float> residual(8200 + 4), weight(8200);
  DeviceBuffer<bf16> w(size_t(16) * 8200), act(8);
  Workspace ws(Shape{16, 8200});
  const auto launch = [&](const kernels::SmallMNorm& norm, int32_t in) {
    return kernels::launch_gemm_small_m_norm_swiglu_bf16(norm, w.ptr, act.ptr, 8, in,
                                                         ws.buffer.ptr, ws.bytes, nullptr);
  };
  EXPECT_FALSE(kernels::small_m_norm_fits(8200));
  EXPECT_TRUE(kernels::small_m_norm_fits(4096));
  EXPECT_EQ(launch({residual.ptr, weight.ptr, kEps}, 8200), cudaErrorInvalidValue);
  EXPECT_EQ(launch({residual.ptr + 1, weight.ptr, kEps}, 2048), cudaErrorInvalidValue);
  EXPECT_EQ(launch({residual.ptr, weight.ptr, 0.0f}, 2048), cudaErrorInvalidValue);
  EXPECT_EQ(cudaGetLastError(), cudaSuccess) << "nothing was launched";
}

// The backend with the small-M GEMM for every step of at most 64 tokens (the GEMV off): no plan
// for those counts (4 layer products and the LM head each), and the same tokens eager and with
// graphs; bad values of the option are refused by name.
TEST(SmallMGemmBackend, RunsStepsUpToItsLimitWithoutPlans) {
  LS_SKIP_WITHOUT_DEVICE();
  const SchedulerConfig sc = gpu_test::tiny_scheduler();
  const ExecutorConfig ec = executor_config_for(sc);
  const ModelWeights& tiny = testing::tiny_weights();
  const int32_t vocab = tiny.config.vocab_size;
  const auto requests = gpu_test::greedy_requests(20, 90, 24, vocab, 5);
  const auto above = [](int32_t count, int32_t limit) { return std::max(0, count - limit); };
  const int64_t expected = 4 * int64_t{above(ec.step_tokens_max(), 64)} +
                           above(ec.logits_rows_max(), 64);
  gpu_test::Outcomes first;
  for (const bool graphs : {false, true}) {
    CudaBackend cuda(tiny, ec,
                     CudaBackendOptions{.graphs = graphs, .gemv_tokens_max = 0,
                                        .small_m_gemm_tokens_max = 64});
    EXPECT_EQ(cuda.gemm_plans_count(), expected) << "graphs " << graphs;
    const gpu_test::Outcomes outcomes = gpu_test::generate(cuda, sc, vocab, requests);
    if (first.empty()) {
      first = outcomes;
    } else {
      EXPECT_EQ(outcomes, first) << "graphs vs eager";
    }
  }
  CudaBackend cublas(tiny, ec,
                     CudaBackendOptions{.gemv_tokens_max = 0, .small_m_gemm_tokens_max = 0,
                                        .small_m_gemm_large_tokens_max = 0});
  const gpu_test::Agreement agreement =
      gpu_test::compare(first, gpu_test::generate(cublas, sc, vocab, requests));
  std::printf("small-M GEMM vs cuBLAS (bf16): %d of %d sequences equal, %ld of %ld tokens\n",
              agreement.equal_count, agreement.total_count,
              static_cast<long>(agreement.tokens_equal), static_cast<long>(agreement.tokens_total));
  using ::testing::HasSubstr;
  using ::testing::ThrowsMessage;
  const auto build = [&](const CudaBackendOptions& options) {
    CudaBackend built(tiny, ec, options);
  };
  EXPECT_THAT([&] { build({.small_m_gemm_tokens_max = 65}); },
              ThrowsMessage<Error>(HasSubstr("small_m_gemm_tokens_max 65 is outside [0, 64]")));
  EXPECT_THAT([&] { build({.small_m_gemm_tokens_max = -1}); },
              ThrowsMessage<Error>(HasSubstr("small_m_gemm_tokens_max -1 is outside [0, 64]")));
  EXPECT_THAT([&] { build({.precision = CudaPrecision::kFp32, .small_m_gemm_tokens_max = 8}); },
              ThrowsMessage<Error>(HasSubstr("small_m_gemm_tokens_max 8 needs bf16 precision")));
  const auto refused = [](const char* what) { return ThrowsMessage<Error>(HasSubstr(what)); };
  EXPECT_THAT([&] { build({.small_m_gemm_large_tokens_max = 65}); },
              refused("small_m_gemm_large_tokens_max 65 is outside [0, 64]"));
  EXPECT_THAT([&] { build({.small_m_gemm_tokens_max = 0, .small_m_gemm_large_tokens_max = -1}); },
              refused("small_m_gemm_large_tokens_max -1 is outside [0, 64]"));
  EXPECT_THAT(
      [&] { build({.precision = CudaPrecision::kFp32, .small_m_gemm_large_tokens_max = 64}); },
      refused("small_m_gemm_large_tokens_max 64 needs bf16 precision"));
  EXPECT_THAT([&] { build({.small_m_gemm_tokens_max = 48, .small_m_gemm_large_tokens_max = 40}); },
              refused("small_m_gemm_large_tokens_max 40 is below small_m_gemm_tokens_max 48"));
  // Unset, each is the precision's default: 32 and 64 in bf16, 0 (cuBLAS) in fp32, where it is no
  // refusal.
  EXPECT_EQ(small_m_gemm_tokens_max_of({}), kSmallMGemmTokensDefault);
  EXPECT_EQ(small_m_gemm_tokens_max_of({.precision = CudaPrecision::kFp32}), 0);
  EXPECT_EQ(small_m_gemm_large_tokens_max_of({}), kSmallMGemmLargeTokensDefault);
  EXPECT_EQ(small_m_gemm_large_tokens_max_of({.precision = CudaPrecision::kFp32}), 0);
  build({.precision = CudaPrecision::kFp32});
}

// Which products the small-M GEMM runs up to which token count, by default: the shapes whose
// kernel times at 64 tokens set the rule (CudaBackendOptions::small_m_gemm_large_tokens_max), and
// one whose grid leaves its waves mostly empty, which none of the settings sends to the GEMM.
// Host logic only: runs without a device.
TEST(SmallMGemmRouting, LargeProductsRunItUpTo64TokensTheOthersUpTo32) {
  const CudaBackendOptions defaults;
  struct Product {
    const char* name;
    int64_t out, in;
    int32_t tokens_max;
  };
  for (const Product& p : {Product{"llama-8b gate/up (224 MiB)", 28672, 4096, 64},
                           Product{"llama-8b down (112 MiB)", 4096, 14336, 64},
                           Product{"llama-8b lm_head", 128256, 4096, 64},
                           Product{"llama-1b lm_head", 128256, 2048, 64},
                           Product{"96 MiB exactly", 24576, 2048, 64},
                           Product{"96 MiB less one row", 24575, 2048, 32},
                           Product{"llama-8b q/k/v", 6144, 4096, 32},
                           Product{"llama-8b o", 4096, 4096, 32},
                           Product{"llama-1b gate/up (64 MiB)", 16384, 2048, 32},
                           Product{"llama-1b down", 2048, 8192, 32},
                           Product{"llama-1b o (128 blocks, one wave)", 2048, 2048, 32},
                           Product{"qwen2.5-7b down (130 MiB)", 3584, 18944, 64},
                           Product{"qwen2.5-7b lm_head (1,188 blocks, 90%)", 152064, 3584, 64},
                           // 296 blocks: 1.12 waves of 264, 56% of them filled.
                           Product{"qwen2.5-7b gate/up", 37888, 3584, 0},
                           // 265 blocks: one past a wave.
                           Product{"265 tiles", 265 * 128, 1024, 0}}) {
    EXPECT_EQ(small_m_gemm_tokens_max_for(defaults, p.out, p.in), p.tokens_max) << p.name;
    const int32_t fills = p.tokens_max > 0 ? 1 : 0;
    // Off for the large ones: every product up to small_m_gemm_tokens_max.
    EXPECT_EQ(small_m_gemm_tokens_max_for({.small_m_gemm_large_tokens_max = 32}, p.out, p.in),
              32 * fills)
        << p.name;
    // Every product up to 64 (batch-invariant mode's setting), whatever its size, but one whose
    // grid leaves its waves mostly empty.
    EXPECT_EQ(small_m_gemm_tokens_max_for({.small_m_gemm_tokens_max = 64}, p.out, p.in),
              64 * fills)
        << p.name;
    EXPECT_EQ(small_m_gemm_tokens_max_for({.precision = CudaPrecision::kFp32}, p.out, p.in), 0)
        << p.name;
  }
}

// A backend whose LM head is large (96 MiB: vocab 32,768 × hidden 1,536, in 256 blocks that fill
// their wave: gemm_small_m_fills_its_waves) runs it on the small-M GEMM up to
// small_m_gemm_large_tokens_max logits rows and its layer products (small) up to
// small_m_gemm_tokens_max tokens: cuBLAS plans exist for the counts above each, no others. Steps
// of up to 72 rows (each side of the limit) give the same tokens eager and with graphs.
TEST(SmallMGemmBackend, ALargeProductRunsItUpToItsOwnLimit) {
  LS_SKIP_WITHOUT_DEVICE();
  ModelConfig model = model_config_named("tiny");
  model.name = "tiny-large-head";
  model.hidden_size = 1536, model.query_heads_count = 12, model.kv_heads_count = 2;
  model.head_dim = 128, model.ffn_size = 2048;
  model.vocab_size = static_cast<int32_t>(kSmallMGemmLargeProductBytes / (2 * 1536));
  SchedulerConfig sc = gpu_test::tiny_scheduler();
  sc.max_batch_rows = 80;  // logits rows past 64 too
  const ExecutorConfig ec = executor_config_for(sc);
  ASSERT_GT(ec.logits_rows_max(), 64);
  const auto above = [](int32_t count, int32_t limit) { return std::max(0, count - limit); };
  for (const int32_t large : {32, 48, 64}) {
    const CudaBackendOptions options{.gemv_tokens_max = 0, .small_m_gemm_large_tokens_max = large};
    CudaBackend cuda(DeviceSeededWeights{model, 5}, ec, options);
    const int64_t expected = 4 * int64_t{above(ec.step_tokens_max(), kSmallMGemmTokensDefault)} +
                             above(ec.logits_rows_max(), large);
    EXPECT_EQ(cuda.gemm_plans_count(), expected) << "small_m_gemm_large_tokens_max " << large;
  }
  const auto requests = gpu_test::greedy_requests(72, 40, 8, model.vocab_size, 9);
  gpu_test::Outcomes first;
  for (const bool graphs : {false, true}) {
    CudaBackend cuda(DeviceSeededWeights{model, 5}, ec, CudaBackendOptions{.graphs = graphs});
    const gpu_test::Outcomes outcomes = gpu_test::generate(cuda, sc, model.vocab_size, requests);
    if (first.empty()) {
      first = outcomes;
    } else {
      EXPECT_EQ(outcomes, first) << "graphs vs eager";
    }
  }
}

}  // namespace
}  // namespace ls
