// The small-M GEMM's split reduction (kernels/gemm_small_m.cu launches it): a split shape's
// blocks each write their K range's partial sum to the workspace and return; a second kernel over
// every tile adds the partials in split order and stores y; or, at one n-tile in two splits, the
// tile's two blocks do so as one cluster (reduce_in_cluster, below).
//
// Why a second kernel. The first design had the tile's last block to arrive (a counter per tile)
// add the other blocks' partials: at 64 tokens a tile's partials are 32 KB a split, so that one
// block read up to 224 KB serially while the rest of the GPU idled. The H200 sweep of 584a06a
// (lockstep_gpu_bench --small-m-sweep, bench/results/…-584a06a69e69-small-m-sweep.log) measured
// it and a binary tree of pairwise adds against this kernel: at the production splits this one
// was as fast or faster at every token count (llama-1b o at 64 tokens 17.4 → 9.7 µs, llama-8b
// down 46.0 → 39.2 µs; at 1 token within ±0.3 µs or faster, the launch overlapping the GEMM's
// tail), the tree the slowest. It adds the same values in the same order as the last-block
// design did, so no result changed.
#pragma once

#include "kernels/gemm_small_m_store.cuh"
#include "kernels/launch.cuh"

#include <cooperative_groups.h>

namespace ls::kernels::small_m {

__device__ __forceinline__ float4* partial_at(const Params& p, int32_t tile, int32_t split,
                                              int32_t n_tiles, int32_t j) {
  return p.partials + ((int64_t{tile} * p.splits + split) * n_tiles + j) * kThreads + threadIdx.x;
}

template <int32_t NT>
__device__ __forceinline__ void write_partial(const Params& p, int32_t tile, int32_t split,
                                              const float (&sum)[NT][4]) {
#pragma unroll
  for (int32_t j = 0; j < NT; ++j) {
    *partial_at(p, tile, split, NT, j) = make_float4(sum[j][0], sum[j][1], sum[j][2], sum[j][3]);
  }
}

// Every split's float4 of one thread slot, partial(s), added in split order s = 0, 1, ... into
// total (eight loads out before their additions): the one order both reductions below use.
template <typename Partial>
__device__ __forceinline__ void add_in_split_order(int32_t splits, Partial&& partial,
                                                   float (&total)[4]) {
  constexpr int32_t kAtOnce = 8;
  for (int32_t s0 = 0; s0 < splits; s0 += kAtOnce) {
    float4 q[kAtOnce];
#pragma unroll
    for (int32_t b = 0; b < kAtOnce; ++b) {
      q[b] = s0 + b < splits ? partial(s0 + b) : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    }
#pragma unroll
    for (int32_t b = 0; b < kAtOnce; ++b) {
      const int32_t s = s0 + b;
      if (s >= splits) break;
      const float v[4] = {q[b].x, q[b].y, q[b].z, q[b].w};
#pragma unroll
      for (int32_t e = 0; e < 4; ++e) total[e] = s == 0 ? v[e] : total[e] + v[e];
    }
  }
}

// grid (n-tiles, tiles), kThreads threads: thread tid of block (j, tile) adds element tid of
// n-tile j of every split's partial, in split order, and stores it where the GEMM's thread tid
// would have stored an unsplit sum.
__global__ void __launch_bounds__(kThreads) gemm_small_m_reduce_kernel(const Params p,
                                                                       int32_t n_tiles) {
  allow_successor();
  wait_for_predecessor();
  const int32_t tid = static_cast<int32_t>(threadIdx.x);
  const int32_t j = static_cast<int32_t>(blockIdx.x), tile = static_cast<int32_t>(blockIdx.y);
  float total[4] = {0.0f, 0.0f, 0.0f, 0.0f};
  add_in_split_order(
      p.splits, [&](int32_t split) { return __ldcg(partial_at(p, tile, split, n_tiles, j)); },
      total);
  store_fragment(p, tile, tid, j, total);
}

// The reduction without the workspace and the second kernel, for one n-tile (at most 8 tokens,
// partials of 4 KB a block): the tile's split blocks are one thread block cluster (split s its
// block s), each puts its sums in its own shared memory (`mine`, kThreads float4s), and after the
// cluster's barrier each block adds, for its share of the thread slots that hold a token (slot
// groups of four, (slot / 4) % splits == split), every split's float4 of that slot in split order
// over distributed shared memory, and stores it as gemm_small_m_reduce_kernel's thread `slot`
// does: the same values added in the same order, so the same bits. The second barrier keeps every
// block's shared memory until its peers have read it. What it saves at one token is a kernel
// boundary and the partials' round trip through global memory for each split product.
__device__ __forceinline__ void reduce_in_cluster(const Params& p, int32_t tile, int32_t split,
                                                  float4* mine, const float (&sum)[4]) {
  namespace cg = cooperative_groups;
  const cg::cluster_group cluster = cg::this_cluster();
  const int32_t slot = static_cast<int32_t>(threadIdx.x);
  mine[slot] = make_float4(sum[0], sum[1], sum[2], sum[3]);
  cluster.sync();
  if (fragment_token(slot, 0, 0) < p.tokens && (slot / 4) % p.splits == split) {
    float total[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    add_in_split_order(
        p.splits,
        [&](int32_t peer) {
          return *cluster.map_shared_rank(mine + slot, static_cast<unsigned>(peer));
        },
        total);
    store_fragment(p, tile, slot, 0, total);
  }
  cluster.sync();
}

}  // namespace ls::kernels::small_m
