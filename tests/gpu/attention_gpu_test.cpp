// Paged attention against a CPU reference written like CpuModel::attend (keys in ascending
// position through the block table, softmax, weighted values), for prefill chunks with a cached
// prefix (1, 7, 129, 2048 tokens, causal inside the chunk) and decode batches (1, 3, 17, 64 rows
// of different lengths, many crossing split boundaries), plus a chunked launch through a small
// workspace and a batch-invariance check (a row's output does not depend on its co-batch).
// The prefill tile kernel (AttentionPrefill::kTiles, the default mode): against the reference,
// run to run, through consecutive launches and beside decode rows, bit for bit; with it off
// (kDecodeKernel, batch-invariant mode) a chunk's token has the bits it has alone at decode.
// Shared-memory grants (kernels/kernel_fit.h) never lowered; an 800,000-position context combined.
#include "kernels/attention.h"
#include "tests/gpu/gpu_test_support.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <thread>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

namespace ls {
namespace {

using gpu_test::DeviceBuffer;
using gpu_test::relative_error;
using kernels::AttentionPrefill;
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

// fp64 softmax attention of token t into out (its query_heads · head_dim floats).
void reference_token(const AttentionSetup& s, const std::vector<float>& q, int32_t position,
                     int32_t row, size_t t, float* out) {
  const AttentionShape& a = s.shape;
  const int32_t d = a.head_dim, group = a.query_heads / a.kv_heads, kv = a.kv_heads * d;
  const int32_t qs = a.query_heads * d;
  const float scale = 1.0f / std::sqrt(static_cast<float>(d));
  const int32_t keys = std::min(position, a.positions_count - 1) + 1;
  const int32_t* table_row = s.table.data() + size_t(static_cast<uint32_t>(row)) * a.table_width;
  const auto slot_of = [&](int32_t p) {
    return size_t(int64_t{table_row[p / a.page_size]} * a.page_size + p % a.page_size);
  };
  std::vector<double> scores(static_cast<size_t>(keys)), acc(static_cast<size_t>(d));
  for (int32_t h = 0; h < a.query_heads; ++h) {
    const float* qh = q.data() + t * qs + h * d;
    const int32_t kvh = h / group;
    double m = -INFINITY;
    for (int32_t p = 0; p < keys; ++p) {
      const float* k = s.k.data() + slot_of(p) * kv + kvh * d;
      double dot = 0;
      for (int32_t i = 0; i < d; ++i) dot += double{qh[i]} * k[i];
      scores[size_t(p)] = dot * scale;
      m = std::max(m, scores[size_t(p)]);
    }
    double sum = 0;
    for (double& x : scores) sum += (x = std::exp(x - m));
    std::fill(acc.begin(), acc.end(), 0.0);
    for (int32_t p = 0; p < keys; ++p) {  // each acc[i] still sums over p in ascending order
      const float* v = s.v.data() + slot_of(p) * kv + kvh * d;
      for (int32_t i = 0; i < d; ++i) acc[size_t(i)] += scores[size_t(p)] * v[i];
    }
    for (int32_t i = 0; i < d; ++i) out[h * d + i] = static_cast<float>(acc[size_t(i)] / sum);
  }
}

// The host reference: every token's attention in fp64, tokens spread over the host's cores (each
// token computed alone, so the result does not depend on how many).
std::vector<float> reference(const AttentionSetup& s, const std::vector<float>& q,
                             const std::vector<int32_t>& positions,
                             const std::vector<int32_t>& rows) {
  const size_t qs = size_t(s.shape.query_heads) * s.shape.head_dim;
  std::vector<float> out(positions.size() * qs);
  const size_t workers = std::clamp<size_t>(std::thread::hardware_concurrency(), 1, 32);
  std::vector<std::thread> threads;
  for (size_t w = 0; w < workers; ++w) {
    threads.emplace_back([&, w] {
      for (size_t t = w; t < positions.size(); t += workers) {
        reference_token(s, q, positions[t], rows[t], t, out.data() + t * qs);
      }
    });
  }
  for (std::thread& thread : threads) thread.join();
  return out;
}

// How a test launches attention: the workspace, how many of the launch's first tokens are
// prefill chunks' and which kernel takes them, bf16 (production) or fp32 (the fp32 mode) KV and
// output.
struct Launch {
  size_t workspace_floats = 0;
  int32_t prefill_tokens = 0;
  AttentionPrefill prefill = AttentionPrefill::kTiles;
  bool fp32 = false;
};

// Runs the tokens in consecutive launches starting at each of `begins` (the first is 0), sharing
// the workspace and the output, as the layers of a step do; a launch's prefill tokens are those of
// launch.prefill_tokens that fall in it.
template <typename T>
std::vector<float> run_as(const AttentionSetup& s, const std::vector<float>& q,
                          const std::vector<int32_t>& positions, const std::vector<int32_t>& rows,
                          const Launch& launch, std::vector<int32_t> begins) {
  const int32_t tokens = static_cast<int32_t>(positions.size());
  const size_t qs = size_t(s.shape.query_heads) * s.shape.head_dim;
  DeviceBuffer<float> d_q(q), d_ws(launch.workspace_floats);
  DeviceBuffer<int32_t> d_pos(positions), d_rows(rows), d_table(s.table);
  std::vector<T> k, v;
  if constexpr (std::is_same_v<T, float>) {
    k = s.k, v = s.v;
  } else {
    k = gpu_test::to_bf16(s.k), v = gpu_test::to_bf16(s.v);
  }
  DeviceBuffer<T> d_k(k), d_v(v), d_out(size_t(static_cast<uint32_t>(tokens)) * qs);
  begins.push_back(tokens);
  for (size_t i = 0; i + 1 < begins.size(); ++i) {
    const int32_t begin = begins[i], n = begins[i + 1] - begin;
    const int32_t prefill = std::clamp(launch.prefill_tokens - begin, 0, n);
    EXPECT_EQ(kernels::launch_paged_attention(s.shape, d_q.ptr + begin * qs, d_k.ptr, d_v.ptr,
                                              d_pos.ptr + begin, d_rows.ptr + begin, d_table.ptr,
                                              n, prefill, launch.prefill, d_ws.ptr,
                                              launch.workspace_floats, d_out.ptr + begin * qs,
                                              nullptr),
              cudaSuccess)
        << "launch at token " << begin;
  }
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  if constexpr (std::is_same_v<T, float>) {
    return d_out.download();
  } else {
    return gpu_test::from_bf16(d_out.download());
  }
}

std::vector<float> run(const AttentionSetup& s, const std::vector<float>& q,
                       const std::vector<int32_t>& positions, const std::vector<int32_t>& rows,
                       const Launch& launch, std::vector<int32_t> begins = {0}) {
  return launch.fp32 ? run_as<float>(s, q, positions, rows, launch, std::move(begins))
                     : run_as<bf16>(s, q, positions, rows, launch, std::move(begins));
}

// Decode rows only (no prefill token): every token through the decode kernel.
Launch decode_launch(size_t workspace_floats) { return Launch{workspace_floats, 0}; }

// Whether two outputs have the same bits (not just equal values: −0 and +0 differ, NaN fails).
bool same_bits(const float* a, const float* b, size_t count) {
  return std::memcmp(a, b, count * sizeof(float)) == 0;
}

class PrefillChunk : public ::testing::TestWithParam<int32_t> {};

// Both prefill kernels (kTiles takes the 2048-token chunk through the tile kernel, the shorter ones
// through the decode kernel; kDecodeKernel takes every chunk through the decode kernel) against the
// reference, and each through small workspaces (launches cut to fit) with the same bits.
TEST_P(PrefillChunk, CausalWithACachedPrefix) {
  LS_SKIP_WITHOUT_DEVICE();
  const int32_t chunk = GetParam(), prefix = 37;
  const AttentionSetup s = make_setup(8, 2, 64, 140, 16, 3, 100 + static_cast<uint32_t>(chunk));
  std::vector<int32_t> positions(chunk), rows(chunk, 2);
  for (int32_t t = 0; t < chunk; ++t) positions[t] = prefix + t;
  const size_t qs = size_t(8) * 64;
  const std::vector<float> q = gpu_test::random_floats(size_t(chunk) * qs, 7, -1, 1);
  const std::vector<float> ref = reference(s, q, positions, rows);
  EXPECT_GT(gpu_test::norm(ref), 0);
  const size_t ws = kernels::attention_workspace_floats(s.shape, chunk);
  for (const AttentionPrefill prefill :
       {AttentionPrefill::kTiles, AttentionPrefill::kDecodeKernel}) {
    SCOPED_TRACE(prefill == AttentionPrefill::kTiles ? "tiles" : "decode kernel");
    const std::vector<float> out = run(s, q, positions, rows, Launch{ws, chunk, prefill});
    EXPECT_LT(relative_error(out, ref), kTolerance) << "chunk " << chunk;
    // Workspaces for 5 tokens and for 1: the decode kernel's launches are cut to fit, the tile
    // kernel's list fits either; the same bits.
    for (const int32_t tokens : {5, 1}) {
      const size_t small = kernels::attention_workspace_floats(s.shape, tokens);
      const std::vector<float> cut = run(s, q, positions, rows, Launch{small, chunk, prefill});
      EXPECT_TRUE(same_bits(cut.data(), out.data(), out.size())) << "workspace of " << tokens;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(OddSizes, PrefillChunk, ::testing::Values(1, 7, 129, 2048));

class DecodeBatch : public ::testing::TestWithParam<int32_t> {};

// llama-8b's head layout (32 query / 8 KV heads, head dim 128): one token per row, lengths from 1
// to past the table (clamped), so single- and multi-split rows mix.
TEST_P(DecodeBatch, GqaSplitKvAndBatchInvariant) {
  LS_SKIP_WITHOUT_DEVICE();
  const int32_t batch = GetParam();
  const int32_t pool_rows = std::min(batch, 64);  // rows shared past 64 (the cache stays small)
  const AttentionSetup s =
      make_setup(32, 8, 128, 50, 16, pool_rows + 2, 200 + static_cast<uint32_t>(batch));
  std::vector<int32_t> positions(batch), rows(batch);
  for (int32_t b = 0; b < batch; ++b) {
    rows[b] = 1 + b % pool_rows;
    positions[b] = b == 0 ? 5000 : (b * 97 + 3) % 800;  // row 0 past the table: clamped
  }
  const size_t qs = size_t(32) * 128;
  const std::vector<float> q = gpu_test::random_floats(size_t(batch) * qs, 9, -1, 1);
  const size_t ws = kernels::attention_workspace_floats(s.shape, batch);
  const std::vector<float> out = run(s, q, positions, rows, decode_launch(ws));
  EXPECT_LT(relative_error(out, reference(s, q, positions, rows)), kTolerance) << "batch " << batch;
  // Rows alone give the bits they have inside the batch (how many split lanes the launch spreads
  // its splits over, and which block takes a split, do not matter): eight rows spread over the
  // batch, first and last among them (every run uploads the whole cache again).
  const int32_t checked = std::min(batch, 8);
  for (int32_t i = 0; i < checked; ++i) {
    const int32_t b = checked == 1 ? 0 : i * (batch - 1) / (checked - 1);
    const auto row_q = q.begin() + static_cast<ptrdiff_t>(size_t(b) * qs);
    const std::vector<float> alone =
        run(s, std::vector<float>(row_q, row_q + static_cast<ptrdiff_t>(qs)), {positions[b]},
            {rows[b]}, decode_launch(ws));
    EXPECT_TRUE(same_bits(alone.data(), out.data() + size_t(b) * qs, qs))
        << "batch invariance, row " << b << " of " << batch;
  }
}

// 300: a batch past the decode batches served today (pool rows shared past 64).
INSTANTIATE_TEST_SUITE_P(OddBatches, DecodeBatch, ::testing::Values(1, 3, 17, 64, 300));

// Head layouts for the tile kernel: llama-8b's and llama-1b's (group 4, head dim 128 / 64), group
// 1, group 8 (two KV heads) and qwen2.5-7b's group 7 (126 of a tile's 128 rows), with chunks long
// enough to take it (tiles of 32, 32, 128, 16 and 18 tokens).
struct TileHeads {
  int32_t qh, kvh, d, chunk;
};
constexpr TileHeads kTileHeads[] = {{32, 8, 128, 600}, {32, 8, 64, 600}, {8, 8, 64, 2100},
                                    {16, 2, 128, 600}, {28, 4, 128, 600}};
constexpr int32_t kPrefix = 37;  // cached positions before the chunk: off the split grid

// One chunk of `chunk` tokens of pool row 2 at positions kPrefix .., in a table with room for it.
struct ChunkCase {
  AttentionSetup s;
  std::vector<int32_t> positions, rows;
  std::vector<float> q;
  size_t qs = 0;
};
ChunkCase chunk_case(int32_t qh, int32_t kvh, int32_t d, int32_t chunk, uint32_t seed) {
  ChunkCase c{make_setup(qh, kvh, d, (kPrefix + chunk) / 16 + 2, 16, 14, seed), {}, {}, {}, 0};
  for (int32_t t = 0; t < chunk; ++t) c.positions.push_back(kPrefix + t), c.rows.push_back(2);
  c.qs = size_t(qh) * d;
  c.q = gpu_test::random_floats(size_t(chunk) * c.qs, seed + 3, -1, 1);
  return c;
}

// A chunk's tokens worth checking alone: a tile's first, last and middle tokens, both sides of
// each split boundary, the chunk's last.
std::vector<int32_t> probe_tokens(int32_t chunk) {
  return {0, 1, 3, 4, 7, 8, 31, 32, 90, 91, 92, 218, 219, 220, chunk - 2, chunk - 1};
}

// Token t of the case alone, at decode (the decode kernel).
std::vector<float> alone_at_decode(const ChunkCase& c, int32_t t, size_t ws) {
  const auto q_of = c.q.begin() + t * ptrdiff_t(c.qs);
  return run(c.s, std::vector<float>(q_of, q_of + ptrdiff_t(c.qs)), {c.positions[t]}, {c.rows[t]},
             decode_launch(ws));
}

// The tile kernel against the reference, and deterministic: the same bits run to run.
TEST(AttentionTiles, ChunkMatchesTheReferenceAndRepeatsBitForBit) {
  LS_SKIP_WITHOUT_DEVICE();
  for (const TileHeads h : kTileHeads) {
    SCOPED_TRACE(::testing::Message() << h.qh << "/" << h.kvh << " heads, head dim " << h.d);
    const ChunkCase c = chunk_case(h.qh, h.kvh, h.d, h.chunk, 400 + uint32_t(h.d + h.qh));
    const Launch tiles{kernels::attention_workspace_floats(c.s.shape, h.chunk), h.chunk};
    const std::vector<float> first = run(c.s, c.q, c.positions, c.rows, tiles);
    const std::vector<float> ref = reference(c.s, c.q, c.positions, c.rows);
    EXPECT_GT(gpu_test::norm(ref), 0);
    EXPECT_LT(relative_error(first, ref), kTolerance);
    for (int32_t again = 0; again < 3; ++again) {
      const std::vector<float> next = run(c.s, c.q, c.positions, c.rows, tiles);
      EXPECT_TRUE(same_bits(next.data(), first.data(), first.size())) << "run " << again + 2;
    }
    // The dispatch gives the chunk to the tile kernel (and, asked for the decode kernel, to it).
    // Its bits may or may not equal the decode kernel's (on the H200 some layouts' probed tokens
    // all did), so they tell nothing; the prefill bench's 2x shows the kernel running.
    EXPECT_EQ(kernels::attention_tiled_tokens(c.s.shape, true, h.chunk, AttentionPrefill::kTiles),
              h.chunk);
    EXPECT_EQ(kernels::attention_tiled_tokens(c.s.shape, true, h.chunk,
                                              AttentionPrefill::kDecodeKernel), 0);
  }
}

// A 2048-token chunk through a workspace of one token's partials (llama-1b's head dim with one
// head: 1,122 floats, so the tile list is cut into launches of 1,120 tokens), through consecutive
// calls (tokens 0 .. 999, then 1000 .. 2047: tiles restart at 1000), and through both, with the
// bits of one launch: a token's bits do not depend on its tile or launch.
TEST(AttentionTiles, ConsecutiveLaunchesGiveTheBitsOfOne) {
  LS_SKIP_WITHOUT_DEVICE();
  const int32_t chunk = 2048;
  const ChunkCase c = chunk_case(1, 1, 64, chunk, 500);
  const size_t one_token = kernels::attention_workspace_floats(c.s.shape, 1);
  ASSERT_LT(one_token, size_t{chunk}) << "the list must not fit one launch";
  const std::vector<float> whole = run(
      c.s, c.q, c.positions, c.rows,
      Launch{kernels::attention_workspace_floats(c.s.shape, chunk), chunk});
  EXPECT_LT(relative_error(whole, reference(c.s, c.q, c.positions, c.rows)), kTolerance);
  const auto expect_whole = [&](const Launch& launch, std::vector<int32_t> begins,
                                const char* what) {
    const std::vector<float> out = run(c.s, c.q, c.positions, c.rows, launch, std::move(begins));
    EXPECT_TRUE(same_bits(out.data(), whole.data(), whole.size())) << what;
  };
  expect_whole(Launch{one_token, chunk}, {0}, "a workspace of one token");
  expect_whole(Launch{kernels::attention_workspace_floats(c.s.shape, chunk), chunk}, {0, 1000},
               "two calls");
  expect_whole(Launch{one_token, chunk}, {0, 1000}, "two calls, a workspace of one token");
}

// A step as the backend lays it out: two prefill chunks (pool rows 2 and 13, so a tile is cut
// where the pool row changes) then 10 decode rows (pool rows 3 .., long and short). The chunks'
// tokens have the bits of the first chunk alone through the tile kernel (and the second's are
// right), the decode rows the bits they have alone at decode, through workspaces that hold the
// step or one token.
TEST(AttentionTiles, DecodeRowsBesideChunksKeepTheirDecodeBits) {
  LS_SKIP_WITHOUT_DEVICE();
  for (const TileHeads h : kTileHeads) {
    SCOPED_TRACE(::testing::Message() << h.qh << "/" << h.kvh << " heads, head dim " << h.d);
    const ChunkCase c = chunk_case(h.qh, h.kvh, h.d, h.chunk, 600 + uint32_t(h.d + h.qh));
    const size_t qs = c.qs;
    std::vector<int32_t> positions = c.positions, rows = c.rows;
    std::vector<float> q = c.q;
    const std::vector<float> second_q = gpu_test::random_floats(200 * qs, 19, -1, 1);
    for (int32_t t = 0; t < 200; ++t) positions.push_back(300 + t), rows.push_back(13);
    q.insert(q.end(), second_q.begin(), second_q.end());
    const int32_t prefill = static_cast<int32_t>(positions.size());
    const std::vector<float> decode_q = gpu_test::random_floats(10 * qs, 17, -1, 1);
    q.insert(q.end(), decode_q.begin(), decode_q.end());
    for (int32_t b = 0; b < 10; ++b) {
      positions.push_back((b * 151 + 20) % 600), rows.push_back(3 + b);
    }
    const int32_t tokens = static_cast<int32_t>(positions.size());
    const std::vector<float> chunk_alone =
        run(c.s, c.q, c.positions, c.rows,
            Launch{kernels::attention_workspace_floats(c.s.shape, h.chunk), h.chunk});
    const std::vector<float> ref = reference(c.s, q, positions, rows);
    for (const int32_t ws_tokens : {tokens, 1}) {
      SCOPED_TRACE(::testing::Message() << "workspace of " << ws_tokens << " tokens");
      const size_t ws = kernels::attention_workspace_floats(c.s.shape, ws_tokens);
      const std::vector<float> step = run(c.s, q, positions, rows, Launch{ws, prefill});
      EXPECT_LT(relative_error(step, ref), kTolerance);
      EXPECT_TRUE(same_bits(step.data(), chunk_alone.data(), chunk_alone.size())) << "chunk";
      for (int32_t b = 0; b < 10; ++b) {
        const size_t at = size_t(prefill + b) * qs;
        const std::vector<float> alone =
            run(c.s, std::vector<float>(q.begin() + ptrdiff_t(at), q.begin() + ptrdiff_t(at + qs)),
                {positions[size_t(prefill + b)]}, {rows[size_t(prefill + b)]}, decode_launch(ws));
        EXPECT_TRUE(same_bits(alone.data(), step.data() + at, qs)) << "decode row " << b;
      }
    }
  }
}

// Batch-invariant mode's attention (kDecodeKernel): every token of a prefill chunk, in a step
// beside decode rows, has the bits it has alone at decode.
TEST(AttentionInvariant, ChunkTokensHaveTheirDecodeBits) {
  LS_SKIP_WITHOUT_DEVICE();
  for (const TileHeads h : kTileHeads) {
    SCOPED_TRACE(::testing::Message() << h.qh << "/" << h.kvh << " heads, head dim " << h.d);
    const ChunkCase c = chunk_case(h.qh, h.kvh, h.d, h.chunk, 700 + uint32_t(h.d + h.qh));
    std::vector<int32_t> positions = c.positions, rows = c.rows;
    std::vector<float> q = c.q;
    const std::vector<float> decode_q = gpu_test::random_floats(5 * c.qs, 23, -1, 1);
    q.insert(q.end(), decode_q.begin(), decode_q.end());
    for (int32_t b = 0; b < 5; ++b) {
      positions.push_back((b * 151 + 20) % 600), rows.push_back(3 + b);
    }
    const size_t ws = kernels::attention_workspace_floats(c.s.shape, h.chunk + 5);
    const std::vector<float> step =
        run(c.s, q, positions, rows, Launch{ws, h.chunk, AttentionPrefill::kDecodeKernel});
    EXPECT_LT(relative_error(step, reference(c.s, q, positions, rows)), kTolerance);
    for (const int32_t t : probe_tokens(h.chunk)) {
      const std::vector<float> alone = alone_at_decode(c, t, ws);
      EXPECT_TRUE(same_bits(alone.data(), step.data() + t * c.qs, c.qs)) << "token " << t;
    }
  }
}

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
    Launch fp32 = decode_launch(ws);
    fp32.fp32 = true;
    EXPECT_LT(relative_error(run(s, q, positions, rows, fp32), ref), kFp32Tolerance)
        << qh << "/" << kvh << " heads, head dim " << d;
    EXPECT_LT(relative_error(run(s, q, positions, rows, decode_launch(ws)), ref), kTolerance)
        << "bf16";
    EXPECT_GT(gpu_test::norm(ref), 0);
  }
}

// kernels/kernel_fit.h: a kernel's shared-memory grant is never lowered. The fp32 split kernel of
// one group size runs at head_dim 256 (128 KB of value rows), then 64 (32 KB), then 256 again: a
// grant that followed the last size asked would refuse the third launch. And a context whose
// combine needs more than the default 48 KB (800,000 positions: 6,250 splits, 50 KB) is granted it.
TEST(AttentionFit, GrantsAreNeverLoweredAndLongContextsCombine) {
  LS_SKIP_WITHOUT_DEVICE();
  constexpr double kFp32Tolerance = 1e-5;
  const auto check = [&](const AttentionSetup& s, const std::vector<int32_t>& positions) {
    const std::vector<int32_t> rows(positions.size(), 0);
    const AttentionShape& a = s.shape;
    const std::vector<float> q =
        gpu_test::random_floats(positions.size() * size_t(a.query_heads) * a.head_dim, 7, -1, 1);
    Launch fp32 = decode_launch(
        kernels::attention_workspace_floats(a, static_cast<int32_t>(positions.size())));
    fp32.fp32 = true;
    EXPECT_LT(relative_error(run(s, q, positions, rows, fp32), reference(s, q, positions, rows)),
              kFp32Tolerance)
        << "head dim " << a.head_dim << ", " << a.positions_count << " positions";
  };
  for (const int32_t d : {256, 64, 256}) {
    check(make_setup(2, 1, d, 4, 16, 1, 500 + static_cast<uint32_t>(d)), {3, 40, 63});
  }
  int64_t positions_max = 0;
  ASSERT_EQ(kernels::attention_positions_max(&positions_max), cudaSuccess);
  EXPECT_GT(positions_max, 800'000) << "an sm_90 block may have 227 KB of shared memory";
  check(make_setup(2, 1, 16, 12'500, 64, 1, 9), {5, 300, 130'000});
}

}  // namespace
}  // namespace ls
