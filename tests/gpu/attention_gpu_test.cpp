// Paged attention against a CPU reference written like CpuModel::attend (keys in ascending
// position through the block table, softmax, weighted values), for prefill chunks with a cached
// prefix (1, 7, 129, 2048 tokens, causal inside the chunk) and decode batches (1, 3, 17, 64 rows
// of different lengths, many crossing split boundaries), plus a chunked launch through a small
// workspace and a batch-invariance check (a row's output does not depend on its co-batch).
#include "kernels/attention.h"
#include "tests/gpu/gpu_test_support.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <tuple>

namespace ls {
namespace {

using gpu_test::DeviceBuffer;
using gpu_test::relative_error;
using kernels::AttentionShape;
using bf16 = __nv_bfloat16;

constexpr double kTolerance = 1e-2;  // bf16 output, fp32 softmax and sums

struct AttentionSetup {
  AttentionShape shape;
  int32_t pool_rows = 0;
  std::vector<int32_t> table;  // [pool rows, width], a shuffled page per column
  std::vector<float> k, v;     // [slots, kv_size] bf16 values
  int64_t slots = 0;
};

AttentionSetup make_setup(int32_t qh, int32_t kvh, int32_t d, int32_t width, int32_t page,
                 int32_t pool_rows, uint32_t seed) {
  AttentionSetup s;
  s.shape = AttentionShape{qh, kvh, d, width, page, width * page};
  s.pool_rows = pool_rows;
  const int32_t pages = pool_rows * width + 1;
  s.slots = int64_t{pages} * page;
  std::vector<int32_t> order(static_cast<size_t>(pages - 1));
  std::iota(order.begin(), order.end(), 1);
  std::mt19937 rng(seed);
  std::shuffle(order.begin(), order.end(), rng);
  s.table = order;
  s.table.resize(size_t(static_cast<uint32_t>(pool_rows)) * width);
  s.k = gpu_test::random_bf16_values(size_t(s.slots) * kvh * d, seed + 1, -1, 1);
  s.v = gpu_test::random_bf16_values(size_t(s.slots) * kvh * d, seed + 2, -1, 1);
  return s;
}

std::vector<float> reference(const AttentionSetup& s, const std::vector<float>& q,
                             const std::vector<int32_t>& positions,
                             const std::vector<int32_t>& rows) {
  const AttentionShape& a = s.shape;
  const int32_t d = a.head_dim, group = a.query_heads / a.kv_heads, kv = a.kv_heads * d;
  const int32_t qs = a.query_heads * d;
  const float scale = 1.0f / std::sqrt(static_cast<float>(d));
  std::vector<float> out(positions.size() * qs);
  std::vector<double> scores;
  for (size_t t = 0; t < positions.size(); ++t) {
    const int32_t keys = std::min(positions[t], a.positions_count - 1) + 1;
    const int32_t* table_row = s.table.data() + size_t(static_cast<uint32_t>(rows[t])) * a.table_width;
    scores.assign(size_t(keys), 0);
    for (int32_t h = 0; h < a.query_heads; ++h) {
      const float* qh = q.data() + t * qs + h * d;
      const int32_t kvh = h / group;
      double m = -INFINITY;
      for (int32_t p = 0; p < keys; ++p) {
        const int64_t slot = int64_t{table_row[p / a.page_size]} * a.page_size + p % a.page_size;
        double dot = 0;
        for (int32_t i = 0; i < d; ++i) dot += double{qh[i]} * s.k[size_t(slot) * kv + kvh * d + i];
        scores[p] = dot * scale;
        m = std::max(m, scores[p]);
      }
      double sum = 0;
      for (double& x : scores) sum += (x = std::exp(x - m));
      for (int32_t i = 0; i < d; ++i) {
        double acc = 0;
        for (int32_t p = 0; p < keys; ++p) {
          const int64_t slot = int64_t{table_row[p / a.page_size]} * a.page_size + p % a.page_size;
          acc += scores[p] * s.v[size_t(slot) * kv + kvh * d + i];
        }
        out[t * qs + h * d + i] = static_cast<float>(acc / sum);
      }
    }
  }
  return out;
}

// Runs the kernel with bf16 KV and output (production), or fp32 (the fp32 mode) when `fp32`.
std::vector<float> run(const AttentionSetup& s, const std::vector<float>& q,
                       const std::vector<int32_t>& positions, const std::vector<int32_t>& rows,
                       size_t workspace_floats, bool fp32 = false) {
  const int32_t tokens = static_cast<int32_t>(positions.size());
  const size_t out_count = size_t(static_cast<uint32_t>(tokens)) * s.shape.query_heads * s.shape.head_dim;
  DeviceBuffer<float> d_q(q), d_ws(workspace_floats);
  DeviceBuffer<int32_t> d_pos(positions), d_rows(rows), d_table(s.table);
  if (fp32) {
    DeviceBuffer<float> d_k(s.k), d_v(s.v), d_out(out_count);
    EXPECT_EQ(kernels::launch_paged_attention(s.shape, d_q.ptr, d_k.ptr, d_v.ptr, d_pos.ptr,
                                              d_rows.ptr, d_table.ptr, tokens, d_ws.ptr,
                                              workspace_floats, d_out.ptr, nullptr),
              cudaSuccess);
    EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    return d_out.download();
  }
  DeviceBuffer<bf16> d_k(gpu_test::to_bf16(s.k)), d_v(gpu_test::to_bf16(s.v));
  DeviceBuffer<bf16> d_out(out_count);
  EXPECT_EQ(kernels::launch_paged_attention(s.shape, d_q.ptr, d_k.ptr, d_v.ptr, d_pos.ptr,
                                            d_rows.ptr, d_table.ptr, tokens, d_ws.ptr,
                                            workspace_floats, d_out.ptr, nullptr),
            cudaSuccess);
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  return gpu_test::from_bf16(d_out.download());
}

class PrefillChunk : public ::testing::TestWithParam<int32_t> {};

TEST_P(PrefillChunk, CausalWithACachedPrefix) {
  LS_SKIP_WITHOUT_DEVICE();
  const int32_t chunk = GetParam(), prefix = 37;
  const AttentionSetup s = make_setup(8, 2, 64, 140, 16, 3, 100 + static_cast<uint32_t>(chunk));
  std::vector<int32_t> positions(chunk), rows(chunk, 2);
  for (int32_t t = 0; t < chunk; ++t) positions[t] = prefix + t;
  const size_t qs = size_t(8) * 64;
  const std::vector<float> q = gpu_test::random_floats(size_t(chunk) * qs, 7, -1, 1);
  const std::vector<float> ref = reference(s, q, positions, rows);
  const size_t ws = kernels::attention_workspace_floats(s.shape, chunk);
  const std::vector<float> out = run(s, q, positions, rows, ws);
  EXPECT_LT(relative_error(out, ref), kTolerance) << "chunk " << chunk;
  EXPECT_GT(gpu_test::norm(ref), 0);
  // A workspace for 5 tokens: the launch is cut into chunks, with the same bits.
  const size_t small = kernels::attention_workspace_floats(s.shape, 5);
  EXPECT_EQ(run(s, q, positions, rows, small), out) << "chunked launch";
}

INSTANTIATE_TEST_SUITE_P(OddSizes, PrefillChunk, ::testing::Values(1, 7, 129, 2048));

class DecodeBatch : public ::testing::TestWithParam<int32_t> {};

// llama-8b's head layout (32 query / 8 KV heads, head dim 128): one token per row, lengths from 1
// to past the table (clamped), so single- and multi-split rows mix.
TEST_P(DecodeBatch, GqaSplitKvAndBatchInvariant) {
  LS_SKIP_WITHOUT_DEVICE();
  const int32_t batch = GetParam();
  const AttentionSetup s = make_setup(32, 8, 128, 50, 16, batch + 2, 200 + static_cast<uint32_t>(batch));
  std::vector<int32_t> positions(batch), rows(batch);
  for (int32_t b = 0; b < batch; ++b) {
    rows[b] = 1 + b;
    positions[b] = b == 0 ? 5000 : (b * 97 + 3) % 800;  // row 0 past the table: clamped
  }
  const size_t qs = size_t(32) * 128;
  const std::vector<float> q = gpu_test::random_floats(size_t(batch) * qs, 9, -1, 1);
  const size_t ws = kernels::attention_workspace_floats(s.shape, batch);
  const std::vector<float> out = run(s, q, positions, rows, ws);
  EXPECT_LT(relative_error(out, reference(s, q, positions, rows)), kTolerance) << "batch " << batch;
  // The last row alone gives the same bits as inside the batch.
  const std::vector<float> alone =
      run(s, std::vector<float>(q.end() - static_cast<ptrdiff_t>(qs), q.end()), {positions.back()},
          {rows.back()}, ws);
  EXPECT_TRUE(std::equal(alone.begin(), alone.end(), out.end() - static_cast<ptrdiff_t>(qs)))
      << "batch invariance";
}

INSTANTIATE_TEST_SUITE_P(OddBatches, DecodeBatch, ::testing::Values(1, 3, 17, 64));

// The fp32 mode (fp32 KV and output): only the order of sums differs from the fp64 reference.
// Tiny's head layout (4 query / 2 KV heads, head dim 16) and llama-1b's (32 / 8, 64), decode rows
// of many lengths and a prefill chunk.
TEST(AttentionFp32, TinyAndLlama1bHeadsMatchFp64) {
  LS_SKIP_WITHOUT_DEVICE();
  constexpr double kFp32Tolerance = 1e-5;
  for (const auto& [qh, kvh, d] : {std::tuple{4, 2, 16}, std::tuple{32, 8, 64}}) {
    const AttentionSetup s = make_setup(qh, kvh, d, 40, 16, 10, 300 + static_cast<uint32_t>(d));
    std::vector<int32_t> positions, rows;
    for (int32_t b = 0; b < 9; ++b) positions.push_back((b * 83 + 1) % 640), rows.push_back(1 + b);
    for (int32_t t = 0; t < 37; ++t) positions.push_back(100 + t), rows.push_back(9);  // a chunk
    const std::vector<float> q =
        gpu_test::random_floats(positions.size() * size_t(qh) * d, 11, -1, 1);
    const size_t ws = kernels::attention_workspace_floats(s.shape, static_cast<int32_t>(positions.size()));
    const std::vector<float> ref = reference(s, q, positions, rows);
    EXPECT_LT(relative_error(run(s, q, positions, rows, ws, true), ref), kFp32Tolerance)
        << qh << "/" << kvh << " heads, head dim " << d;
    EXPECT_LT(relative_error(run(s, q, positions, rows, ws), ref), kTolerance) << "bf16";
    EXPECT_GT(gpu_test::norm(ref), 0);
  }
}

}  // namespace
}  // namespace ls
