// The small-M GEMM's split reductions (kernels/gemm_small_m.cu runs them): how the partial sums
// of a shape's K ranges become y.
#pragma once

#include "kernels/gemm_small_m_layout.cuh"
#include "kernels/launch.cuh"

namespace ls::kernels::small_m {

// Split shapes: each block's partial sum goes to the workspace and the K ranges are added in
// one of two fixed orders (SmallMReduce, kernels/gemm_small_m_tuning.h): in split order, by the
// tile's last block to arrive or by a separate kernel (the same additions: the same bits), or as
// a binary tree over the splits, each node added by the second of its two children to arrive.
// Which block arrives last changes who adds, never what is added in which order.

__device__ __forceinline__ float4* partial_at(const Params& p, int32_t tile, int32_t slot,
                                              int32_t n_tiles, int32_t j) {
  return p.partials + ((int64_t{tile} * p.splits + slot) * n_tiles + j) * kThreads + threadIdx.x;
}

template <int32_t NT>
__device__ __forceinline__ void write_partial(const Params& p, int32_t tile, int32_t slot,
                                              const float (&sum)[NT][4]) {
#pragma unroll
  for (int32_t j = 0; j < NT; ++j) {
    *partial_at(p, tile, slot, NT, j) = make_float4(sum[j][0], sum[j][1], sum[j][2], sum[j][3]);
  }
}

// The block's arrival at `counter` after writing its partial (visible device-wide first); true
// for the `arrivals`-th arrival, which zeroes the counter for the next launch and then sees every
// earlier arrival's partial.
__device__ __forceinline__ bool arrive_last(int32_t* counter, int32_t arrivals) {
  __shared__ int32_t last;
  __threadfence();
  __syncthreads();
  if (threadIdx.x == 0) {
    last = atomicAdd(counter, 1) == arrivals - 1;
    if (last) *counter = 0;
  }
  __syncthreads();
  if (!last) return false;
  __threadfence();
  return true;
}

template <int32_t NT>
constexpr int32_t kSplitsAtOnce = NT >= 8 ? 1 : 8 / NT;

// In split order by the tile's last block: true for it, which then holds the sum of every split's
// partial (its own from registers: the same bits).
template <int32_t NT>
__device__ __forceinline__ bool sum_in_order(const Params& p, int32_t tile, int32_t split,
                                             float (&sum)[NT][4]) {
  write_partial<NT>(p, tile, split, sum);
  if (!arrive_last(p.counters + tile * p.counters_per_tile, p.splits)) return false;
  // kSplitsAtOnce<NT> splits' loads go out before their additions (about 8 float4 in flight a
  // thread): the tail is a few L2 round trips, not one per split. The additions stay in order.
  constexpr int32_t kAtOnce = kSplitsAtOnce<NT>;
  float total[NT][4];
  for (int32_t s0 = 0; s0 < p.splits; s0 += kAtOnce) {
    float4 q[kAtOnce][NT];
#pragma unroll
    for (int32_t b = 0; b < kAtOnce; ++b) {
      const int32_t s = s0 + b;
#pragma unroll
      for (int32_t j = 0; j < NT; ++j) {
        q[b][j] = s >= p.splits ? make_float4(0.0f, 0.0f, 0.0f, 0.0f)
                  : s == split  ? make_float4(sum[j][0], sum[j][1], sum[j][2], sum[j][3])
                                : __ldcg(partial_at(p, tile, s, NT, j));
      }
    }
#pragma unroll
    for (int32_t b = 0; b < kAtOnce; ++b) {
      const int32_t s = s0 + b;
      if (s >= p.splits) break;
#pragma unroll
      for (int32_t j = 0; j < NT; ++j) {
        const float v[4] = {q[b][j].x, q[b][j].y, q[b][j].z, q[b][j].w};
#pragma unroll
        for (int32_t e = 0; e < 4; ++e) total[j][e] = s == 0 ? v[e] : total[j][e] + v[e];
      }
    }
  }
#pragma unroll
  for (int32_t j = 0; j < NT; ++j) {
#pragma unroll
    for (int32_t e = 0; e < 4; ++e) sum[j][e] = total[j][e];
  }
  return true;
}

// As a binary tree over the splits (leaves tree_leaves(splits), missing right subtrees passed
// through): at level l the block holds the sum of subtree `index` (splits index·2^l onward),
// stored in the slot of its first split, whose earlier contents every reader has consumed (their
// reads come before the arrivals that complete the subtree). Node n of level l counts its two
// children at counter leaves − (leaves >> l) + n. True for the block that holds the root. Left +
// right at every node: IEEE addition is commutative, so the second child's block computes the
// same bits whichever it is.
template <int32_t NT>
__device__ __forceinline__ bool sum_by_tree(const Params& p, int32_t tile, int32_t split,
                                            float (&sum)[NT][4]) {
  int32_t* counters = p.counters + tile * p.counters_per_tile;
  int32_t index = split;
  for (int32_t level = 0; (1 << level) < p.splits; ++level, index >>= 1) {
    const int32_t sibling = index ^ 1;
    if ((sibling << level) >= p.splits) continue;
    write_partial<NT>(p, tile, index << level, sum);
    const int32_t node = p.counters_per_tile - (p.counters_per_tile >> level) + (index >> 1);
    if (!arrive_last(counters + node, 2)) return false;
#pragma unroll
    for (int32_t j = 0; j < NT; ++j) {
      const float4 q = __ldcg(partial_at(p, tile, sibling << level, NT, j));
      const float other[4] = {q.x, q.y, q.z, q.w};
#pragma unroll
      for (int32_t e = 0; e < 4; ++e) {
        sum[j][e] = (index & 1) != 0 ? other[e] + sum[j][e] : sum[j][e] + other[e];
      }
    }
  }
  return true;
}

// True for the block that then holds the tile's whole sum and stores it.
template <int32_t NT>
__device__ __forceinline__ bool reduce_splits(const Params& p, int32_t tile, int32_t split,
                                              float (&sum)[NT][4]) {
  switch (p.reduce) {
    case SmallMReduce::kLastBlockInOrder: return sum_in_order<NT>(p, tile, split, sum);
    case SmallMReduce::kTree: return sum_by_tree<NT>(p, tile, split, sum);
    case SmallMReduce::kSeparateKernelInOrder: write_partial<NT>(p, tile, split, sum); return false;
  }
  return false;
}

// The separate in-order reduction, launched after the GEMM: grid (n-tiles, tiles), thread tid of
// block (j, tile) adds element tid of n-tile j of every split's partial in split order (as
// sum_in_order does) and stores it where the GEMM's thread tid would have.
__global__ void __launch_bounds__(kThreads) gemm_small_m_reduce_kernel(const Params p,
                                                                       int32_t n_tiles) {
  allow_successor();
  wait_for_predecessor();
  const int32_t tid = static_cast<int32_t>(threadIdx.x);
  const int32_t j = static_cast<int32_t>(blockIdx.x), tile = static_cast<int32_t>(blockIdx.y);
  constexpr int32_t kAtOnce = 8;
  float total[4] = {0.0f, 0.0f, 0.0f, 0.0f};
  for (int32_t s0 = 0; s0 < p.splits; s0 += kAtOnce) {
    float4 q[kAtOnce];
#pragma unroll
    for (int32_t b = 0; b < kAtOnce; ++b) {
      q[b] = s0 + b < p.splits ? __ldcg(partial_at(p, tile, s0 + b, n_tiles, j))
                               : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    }
#pragma unroll
    for (int32_t b = 0; b < kAtOnce; ++b) {
      const int32_t s = s0 + b;
      if (s >= p.splits) break;
      const float v[4] = {q[b].x, q[b].y, q[b].z, q[b].w};
#pragma unroll
      for (int32_t e = 0; e < 4; ++e) total[e] = s == 0 ? v[e] : total[e] + v[e];
    }
  }
#pragma unroll
  for (int32_t e = 0; e < 4; ++e) {
    store_one(p, tile * kTileRows + fragment_row(tid, e), fragment_token(tid, j, e), total[e]);
  }
}

}  // namespace ls::kernels::small_m
