// lockstep's small-M tensor-core linear layer (kernels/gemm_small_m.h).
//
// Why this shape of kernel. At 1..64 tokens a linear layer reads out·in·2 bytes of weights and
// does 2·tokens·out·in flops: at most 64 flops a byte, far under the H200's ~200 where bf16 matrix
// work stops being memory-bound. So the design goal is a full-bandwidth stream of the weights:
//   - "swap AB": the weights are the MMA's A operand (64 output rows × 16 k), the tokens its N side
//     (8 per n-tile, ⌈tokens / 8⌉ n-tiles), so no weight row is padded and a token count only
//     changes how many n-tiles an MMA covers, never which weights are read or in what order;
//   - a block owns kTileRows = 128 output rows and streams them through a kStages-deep cp.async
//     pipeline of kChunk = 64-wide k chunks (16 KB of weights a stage, kAhead stages loaded ahead
//     of the MMAs: with two blocks an SM ~64 KB in flight per SM, about twice what 4.4 TB/s over
//     132 SMs needs to cover a microsecond of latency), together
//     with the same k chunk of x (8 · n-tiles rows). cp.async writes shared memory without
//     registers; weights carry an L2 evict-first policy (read once), x stays in L2 for the other
//     tiles;
//   - two warpgroups (8 warps): warpgroup h multiplies rows 64h .. 64h + 63 of the block by every
//     token of the chunk with Hopper's wgmma (kernels/wgmma.cuh), one m64 × (8 · n-tiles) × k16
//     MMA for each of the chunk's four k16 steps, in k order, both operands read by the tensor
//     cores from shared memory. Against mma.sync fed by ldmatrix (this kernel until 2026-12-03)
//     no fragment passes through registers, and the sums run in k order without the k halves that
//     design added at the end;
//   - too few tiles to fill both block slots of every SM (out / 128 ≤ 132, e.g. every projection
//     of llama-1b but the LM head) split `in` into gemm_small_m_splits(out, in) K ranges, partials
//     added in split order by a second kernel (kernels/gemm_small_m_reduce.cuh), or, at one n-tile
//     in two splits, by the tile's two blocks as one cluster (reduce_in_cluster there).
// Shared memory rows are 128 bytes (one chunk of a weight row or of a token): the eight 16-byte
// pieces of row r are stored at piece ^ (r % 8) from a 1024-aligned stage, wgmma's 128-byte
// swizzle, so cp.async's writes of eight rows fall in eight different bank groups and the tensor
// cores read the stages as they lie. Both operands are K-major: A the weights [row][k], B the
// tokens [token][k]. An MMA's output element depends only on its own A row, B column and D input,
// so a token's sums do not depend on the other tokens, nor on where in the n-tile it sits, nor on
// how many n-tiles the MMA's N covers (SmallMGemm.ARowsBitsDoNotDependOnTheOtherTokens compares
// one row's bits at every N). The block's pipeline is kernels/gemm_small_m_pipeline.cuh; this file
// holds the split rule, the kernel and the launches.
#include "kernels/gemm_small_m.h"
#include "kernels/gemm_small_m_args.h"
#include "kernels/gemm_small_m_pipeline.cuh"
#include "kernels/gemm_small_m_reduce.cuh"
#include "kernels/gemm_small_m_tuning.h"

#include "kernels/kernel_fit.h"
#include "kernels/launch.cuh"

#include <algorithm>
#include <cstdint>

namespace ls::kernels {

namespace {

using namespace small_m;

constexpr int32_t kNTilesMax = kSmallMGemmTokensMax / 8;

// Splits: the largest power of two (no K range shorter than kChunksPerSplitMin chunks: the
// pipeline must fill) that keeps tiles × splits within kBlockSlots, two blocks on each of the
// H200's 132 SMs. Filling both slots matters most at high token counts: a block alone on its SM
// streams at about half the rate at 64 tokens (its MMAs and its loads take turns at every stage's
// barrier; the H200 figures of 2026-12-01: 128-block shapes at 25-41% of read bandwidth, the
// 224-block one at 73%). A constant, not the SM count: the same shape sums in the same order on
// every GPU.
constexpr int32_t kBlockSlots = kSmallMGemmBlockSlots;
constexpr int32_t kChunksPerSplitMin = 4;
// A block's partial sums at one n-tile, for the cluster's reduction (reduce_in_cluster).
constexpr size_t kClusterPartialsBytes = kThreads * sizeof(float4);
// What a kernel lays out in its dynamic shared memory: the pipeline, and for one n-tile the
// folded norm's region (kernels/gemm_small_m_norm.cuh) and the cluster's partials after it; and
// the alignment's slack.
template <int32_t NT>
constexpr size_t kKernelSharedBytes =
    kSharedBytes<NT> + (NT == 1 ? kFoldedRegionBytes + kClusterPartialsBytes : 0) + kSwizzleAtom -
    16;
static_assert(blocks_sharing_an_sm(kSharedBytes<kNTilesMax>) >= 2, "two blocks fit an SM");
// What a launch reserves: at least kTwoBlocksAnSm, so that no SM takes a third block. One or two
// n-tiles' pipelines (70-74 KB) would otherwise let three blocks share an SM (kernels/launch.h),
// and a shape of 224 blocks packed three an SM fills only 75 SMs: the H200 sweep of
// 584a06a had llama-8b gate/up at 16 tokens (2 n-tiles) at 81 µs against 60 at 8 tokens and 63 at
// 32; with the reservation (run of e5e08d1) 61 µs.
constexpr size_t kTwoBlocksAnSm = 80 * 1024;
static_assert(blocks_sharing_an_sm(kTwoBlocksAnSm) == 2, "two blocks an SM, never three");
template <int32_t NT>
constexpr size_t kLaunchSharedBytes = std::max(kKernelSharedBytes<NT>, kTwoBlocksAnSm);
static_assert(blocks_sharing_an_sm(kLaunchSharedBytes<1> + 128) == 2,
              "one n-tile with the folded norm's region, the cluster's partials (and block_sum's "
              "scratch): two an SM");
// The most split blocks a cluster holds. Two: clusters of 8 and 16 were measured slower at one
// token (H200 run of 4ab4092, lockstep_gpu_bench --small-m, llama-1b: o at 8 splits 5.7 → 6.1 µs,
// down at 16 splits 11.9 → 17.7 µs, q/k/v at 8 unchanged; gate/up at 2 splits 18.5 → 17.8 µs).
// Not profiled; likely a wide cluster waits for room on one GPC for all its blocks at once.
constexpr int32_t kClusterSplitsMax = 2;

struct Split {
  int32_t tiles = 0, chunks = 0, splits = 1, chunks_per_split = 0;
};

// `in` cut into about `wanted` K ranges of whole chunks (none left empty).
Split split_into(int32_t out, int32_t in, int32_t wanted) {
  Split s;
  s.tiles = (out + kTileRows - 1) / kTileRows;
  s.chunks = (in + kChunk - 1) / kChunk;
  const int32_t ranges = std::clamp(wanted, 1, s.chunks);
  s.chunks_per_split = (s.chunks + ranges - 1) / ranges;
  s.splits = (s.chunks + s.chunks_per_split - 1) / s.chunks_per_split;
  return s;
}

// The production rule (kernels/gemm_small_m.h): shape only.
Split split_of(int32_t out, int32_t in) {
  const int32_t tiles = (out + kTileRows - 1) / kTileRows;
  const int32_t chunks = (in + kChunk - 1) / kChunk;
  int32_t splits = 1;
  while (int64_t{tiles} * splits * 2 <= kBlockSlots &&
         chunks / (2 * splits) >= kChunksPerSplitMin) {
    splits *= 2;
  }
  return split_into(out, in, splits);
}

int32_t n_tiles_of(int32_t tokens) { return (tokens + 7) / 8; }

// The workspace of a split shape: every block's partial sums (a float4 of each thread for each
// n-tile).
size_t workspace_bytes_of(const Split& s, int32_t tokens_max) {
  if (s.splits == 1) return 0;
  const int32_t nt = n_tiles_of(std::min(tokens_max, kSmallMGemmTokensMax));
  return size_t{static_cast<uint32_t>(s.tiles)} * s.splits * nt * kThreads * sizeof(float4);
}

template <int32_t NT>
__device__ __forceinline__ void store(const Params& p, int32_t tile, const float (&sum)[NT][4]) {
  const int32_t tid = static_cast<int32_t>(threadIdx.x);
#pragma unroll
  for (int32_t j = 0; j < NT; ++j) store_fragment(p, tile, tid, j, sum[j]);
}

// grid (splits, tiles): block (split, tile) computes rows 128·tile .. + 127 over K range `split`.
template <int32_t NT>
__global__ void __launch_bounds__(kThreads, 2) gemm_small_m_kernel(const Params p) {
  allow_successor();
  extern __shared__ __align__(128) unsigned char shared_bytes[];
  const uint32_t unaligned = static_cast<uint32_t>(__cvta_generic_to_shared(shared_bytes));
  const uint32_t shared = (unaligned + uint32_t{kSwizzleAtom - 1}) & ~uint32_t{kSwizzleAtom - 1};
  const int32_t split = static_cast<int32_t>(blockIdx.x), tile = static_cast<int32_t>(blockIdx.y);
  const int32_t first_chunk = split * p.chunks_per_split;
  const int32_t stages = min(p.chunks_per_split, p.chunks - first_chunk);
  float acc[NT][4];
#pragma unroll
  for (int32_t j = 0; j < NT; ++j) {
#pragma unroll
    for (int32_t e = 0; e < 4; ++e) acc[j][e] = 0.0f;
  }
  stream_range<NT>(p, shared, tile, first_chunk, stages, acc);
  if (p.splits > 1) {
    if constexpr (NT == 1) {
      if (p.cluster_reduction) {
        const uint32_t partials =
            shared + static_cast<uint32_t>(kSharedBytes<1> + kFoldedRegionBytes);
        reduce_in_cluster(p, tile, split, static_cast<float4*>(__cvta_shared_to_generic(partials)),
                          acc[0]);
        return;
      }
    }
    write_partial<NT>(p, tile, split, acc);  // gemm_small_m_reduce_kernel adds and stores them
    return;
  }
  store<NT>(p, tile, acc);
}

template <int32_t NT>
cudaError_t launch_as(const Params& p, const Split& s, LaunchStream stream) {
  // Over 48 KB of dynamic shared memory needs the opt-in; the carveout at its most shared memory
  // lets two blocks of ~97 KB share an SM (the L1 keeps the rest; the kernel reads global memory
  // through cp.async).
  if (const cudaError_t e = grant_shared<gemm_small_m_kernel<NT>>(kLaunchSharedBytes<NT>, true);
      e != cudaSuccess) {
    return e;
  }
  const uint32_t cluster = p.cluster_reduction ? static_cast<uint32_t>(s.splits) : 1;
  return launch_kernel_in_clusters(gemm_small_m_kernel<NT>, dim3(s.splits, s.tiles),
                                   dim3(kThreads), kLaunchSharedBytes<NT>, stream, cluster, p);
}

cudaError_t launch_gemm(const Params& p, const Split& s, LaunchStream stream) {
  switch (n_tiles_of(p.tokens)) {
    case 1: return launch_as<1>(p, s, stream);
    case 2: return launch_as<2>(p, s, stream);
    case 3: return launch_as<3>(p, s, stream);
    case 4: return launch_as<4>(p, s, stream);
    case 5: return launch_as<5>(p, s, stream);
    case 6: return launch_as<6>(p, s, stream);
    case 7: return launch_as<7>(p, s, stream);
    default: return launch_as<8>(p, s, stream);
  }
}

// Checks the arguments and launches the product, then (a split shape) its reduction.
cudaError_t launch_split(Input from, const bf16* w, Output to, int32_t tokens, int32_t out,
                         int32_t in, void* workspace, size_t workspace_bytes, const Split& s,
                         LaunchStream stream) {
  if (tokens < 1 || tokens > kSmallMGemmTokensMax || out < 1 || in < 8 || in % 8 != 0 ||
      !readable(from, tokens, in) || w == nullptr || !writable(to, out) || !aligned16(w) ||
      s.tiles > 65535 || s.splits > 65535) {
    return cudaErrorInvalidValue;
  }
  Params p{from.x,   w,          to.y,     tokens,      out,    in,     to.beta,
           s.chunks, s.chunks_per_split, s.splits, nullptr, false, to.epilogue, to.act,
           to.rope,  from.norm};
  if (s.splits > 1) {
    if (workspace == nullptr || !aligned16(workspace) ||
        workspace_bytes < workspace_bytes_of(s, tokens)) {
      return cudaErrorInvalidValue;
    }
    p.partials = static_cast<float4*>(workspace);
  }
  // One n-tile in at most kClusterSplitsMax splits: the split blocks add their partials in a
  // cluster, no second kernel.
  p.cluster_reduction = n_tiles_of(tokens) == 1 && s.splits > 1 && s.splits <= kClusterSplitsMax;
  if (const cudaError_t e = launch_gemm(p, s, stream); e != cudaSuccess) return e;
  if (s.splits == 1 || p.cluster_reduction) return cudaSuccess;
  const int32_t n_tiles = n_tiles_of(tokens);
  return launch_kernel(gemm_small_m_reduce_kernel, dim3(n_tiles, s.tiles), dim3(kThreads), 0,
                       stream, p, n_tiles);
}

}  // namespace

int32_t gemm_small_m_splits(int32_t out, int32_t in) {
  return out < 1 || in < 1 ? 1 : split_of(out, in).splits;
}

bool gemm_small_m_fills_its_waves(int32_t out, int32_t in) {
  if (out < 1 || in < 1) return true;
  const Split s = split_of(out, in);
  const int64_t blocks = int64_t{s.tiles} * s.splits;
  const int64_t waves = (blocks + kBlockSlots - 1) / kBlockSlots;
  return waves == 1 || 5 * blocks >= 4 * waves * kBlockSlots;
}

size_t gemm_small_m_workspace_bytes(int32_t out, int32_t in, int32_t tokens_max) {
  if (out < 1 || in < 1 || tokens_max < 1) return 0;
  return workspace_bytes_of(split_of(out, in), tokens_max);
}

cudaError_t launch_gemm_small_m_bf16(const bf16* x, const bf16* w, float* y, int32_t tokens,
                                     int32_t out, int32_t in, float beta, void* workspace,
                                     size_t workspace_bytes, LaunchStream stream) {
  if (out < 1 || in < 1) return cudaErrorInvalidValue;
  return launch_split(from_x(x), w, into_y(y, beta), tokens, out, in, workspace,
                      workspace_bytes, split_of(out, in), stream);
}

cudaError_t launch_gemm_small_m_swiglu_bf16(const bf16* x, const bf16* w_gate_up, bf16* act,
                                            int32_t tokens, int32_t ffn, int32_t in,
                                            void* workspace, size_t workspace_bytes,
                                            LaunchStream stream) {
  if (ffn < 1 || ffn > INT32_MAX / 2 || in < 1 || act == nullptr) return cudaErrorInvalidValue;
  return launch_split(from_x(x), w_gate_up, through_swiglu(act), tokens, 2 * ffn, in, workspace,
                      workspace_bytes, split_of(2 * ffn, in), stream);
}

cudaError_t launch_gemm_small_m_rope_kv_bf16(const bf16* x, const bf16* w_qkv,
                                             const RopeKvTarget& target, int32_t tokens,
                                             int32_t in, void* workspace, size_t workspace_bytes,
                                             LaunchStream stream) {
  const int64_t out =
      (int64_t{target.query_heads} + 2 * int64_t{target.kv_heads}) * target.head_dim;
  if (out < 1 || out > INT32_MAX || in < 1) return cudaErrorInvalidValue;
  const int32_t rows = static_cast<int32_t>(out);
  return launch_split(from_x(x), w_qkv, through_rope_kv(target), tokens, rows, in, workspace,
                      workspace_bytes, split_of(rows, in), stream);
}

bool small_m_norm_fits(int32_t in) {
  return in % 8 == 0 && norm_vectorised(in) && in <= small_m::kFoldedKMax;
}

cudaError_t launch_gemm_small_m_norm_swiglu_bf16(const SmallMNorm& norm, const bf16* w_gate_up,
                                                 bf16* act, int32_t ffn, int32_t in,
                                                 void* workspace, size_t workspace_bytes,
                                                 LaunchStream stream) {
  if (ffn < 1 || ffn > INT32_MAX / 2 || in < 1 || act == nullptr) return cudaErrorInvalidValue;
  return launch_split(through_norm(norm), w_gate_up, through_swiglu(act), 1, 2 * ffn, in,
                      workspace, workspace_bytes, split_of(2 * ffn, in), stream);
}

cudaError_t launch_gemm_small_m_norm_rope_kv_bf16(const SmallMNorm& norm, const bf16* w_qkv,
                                                  const RopeKvTarget& target, int32_t in,
                                                  void* workspace, size_t workspace_bytes,
                                                  LaunchStream stream) {
  const int64_t out =
      (int64_t{target.query_heads} + 2 * int64_t{target.kv_heads}) * target.head_dim;
  if (out < 1 || out > INT32_MAX || in < 1) return cudaErrorInvalidValue;
  const int32_t rows = static_cast<int32_t>(out);
  return launch_split(through_norm(norm), w_qkv, through_rope_kv(target), 1, rows, in, workspace,
                      workspace_bytes, split_of(rows, in), stream);
}

int32_t gemm_small_m_splits_with(int32_t out, int32_t in, int32_t wanted) {
  return out < 1 || in < 1 ? 1 : split_into(out, in, wanted).splits;
}

size_t gemm_small_m_workspace_bytes_with(int32_t out, int32_t in, int32_t tokens_max,
                                         int32_t wanted) {
  if (out < 1 || in < 1 || tokens_max < 1) return 0;
  return workspace_bytes_of(split_into(out, in, wanted), tokens_max);
}

cudaError_t launch_gemm_small_m_bf16_with(const bf16* x, const bf16* w, float* y, int32_t tokens,
                                          int32_t out, int32_t in, float beta, void* workspace,
                                          size_t workspace_bytes, int32_t wanted_splits,
                                          LaunchStream stream) {
  if (out < 1 || in < 1) return cudaErrorInvalidValue;
  return launch_split(from_x(x), w, into_y(y, beta), tokens, out, in, workspace,
                      workspace_bytes, split_into(out, in, wanted_splits), stream);
}

}  // namespace ls::kernels
