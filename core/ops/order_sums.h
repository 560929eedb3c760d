// The sums of the sampling definition (core/sampling.cpp, steps 5–9), shared by the CPU
// definition and the device sampler (kernels/sampling_ops.cu) so that both add the same fp32
// values in the same order.
//
// The weights in step 4's order, w(0), w(1), ..., are summed in blocks of kOrderSumBlock: a
// block's part up to j is b_j = w(cB) ⊕ w(cB + 1) ⊕ ... ⊕ w(j), left to right from 0 (c = j / B,
// ⊕ an fp32 sum rounded to nearest); the blocks before it are P_c = B_0 ⊕ ... ⊕ B_{c-1}, left to
// right from 0, B_b a whole block's part. The prefix sum is prefix(j) = P_c ⊕ b_j. It never
// decreases with j (the last prefix of a block is P_{c+1} itself), so "the first j whose prefix
// reaches x" is well defined — and a device can find it from the blocks' sums, computed in
// parallel, plus one block's walk, instead of walking the whole vocabulary on one thread.
//
// A skipped position (verify's correction leaves the rejected draft out) weighs 0 wherever it
// stands, in its block's part and so in every later P.
#pragma once

#include "core/ops/host_device.h"

#include <cstdint>

namespace ls::ops {

inline constexpr int32_t kOrderSumBlock = 128;
inline constexpr int32_t kNoSkip = -1;

// The number of blocks over n ordered weights.
LS_HOST_DEVICE LS_INLINE int32_t order_sum_blocks(int32_t n) {
  return (n + kOrderSumBlock - 1) / kOrderSumBlock;
}

// Floats that hold the B_c (or the P_c, c <= the blocks) of n ordered weights.
LS_HOST_DEVICE LS_INLINE int32_t order_sum_stride(int32_t n) { return order_sum_blocks(n) + 1; }

// w(first) ⊕ ... ⊕ w(last), left to right from 0, w(skip) taken as 0.
template <typename Weight>
LS_HOST_DEVICE float order_part(const Weight& w, int32_t first, int32_t last, int32_t skip) {
  float sum = 0.0f;
  for (int32_t j = first; j <= last; ++j) sum = add_rn(sum, j == skip ? 0.0f : w(j));
  return sum;
}

struct OrderPrefix {
  int32_t index;  // the first j in [0, n) whose prefix reached x, or n when none did
  float value;    // prefix(index), or prefix(n − 1) when none did
};

LS_HOST_DEVICE LS_INLINE bool order_reaches(float value, float x, bool strictly) {
  return strictly ? value > x : value >= x;
}

// The first j of block c below n with prefix(j) >= x (strictly: > x), given P_c = `before`; or,
// when none, {the block's end or n, the last prefix walked}.
template <typename Weight>
LS_HOST_DEVICE OrderPrefix order_walk_block(const Weight& w, int32_t c, float before, int32_t n,
                                            float x, bool strictly, int32_t skip) {
  const int32_t first = c * kOrderSumBlock;
  const int32_t end = first + kOrderSumBlock < n ? first + kOrderSumBlock : n;
  float part = 0.0f;
  float value = before;
  for (int32_t j = first; j < end; ++j) {
    part = add_rn(part, j == skip ? 0.0f : w(j));
    value = add_rn(before, part);
    if (order_reaches(value, x, strictly)) return {j, value};
  }
  return {end, value};
}

// The first j in [0, n) with prefix(j) >= x (strictly: > x), the blocks taken in order. `block(c)`
// is B_c, a whole block's part with nothing skipped (the device's precomputed sums; the host
// computes them); it is asked only for blocks that end before n − 1. n >= 1.
template <typename Weight, typename Block>
LS_HOST_DEVICE OrderPrefix order_prefix_reaching(const Weight& w, const Block& block, int32_t n,
                                                 float x, bool strictly, int32_t skip) {
  constexpr int32_t kB = kOrderSumBlock;
  const int32_t last_block = (n - 1) / kB;
  float before = 0.0f;  // P_c
  int32_t c = 0;
  for (; c < last_block; ++c) {
    const float whole =
        skip >= 0 && skip / kB == c ? order_part(w, c * kB, c * kB + kB - 1, skip) : block(c);
    const float after = add_rn(before, whole);
    if (order_reaches(after, x, strictly)) break;  // the block holds the first j: walk it
    before = after;
  }
  return order_walk_block(w, c, before, n, x, strictly, skip);
}

// order_prefix_reaching with nothing skipped, given the P_c (`prefix(c)` for c up to the block of
// n − 1, chained from the B_c left to right, as the device computes them once a row): P never
// decreases, so the block is found by a binary search over them, then walked.
template <typename Weight, typename Prefix>
LS_HOST_DEVICE OrderPrefix order_prefix_searched(const Weight& w, const Prefix& prefix, int32_t n,
                                                 float x, bool strictly) {
  int32_t low = 0, high = (n - 1) / kOrderSumBlock;  // the first block whose P_{c+1} reaches x
  while (low < high) {
    const int32_t mid = low + (high - low) / 2;
    if (order_reaches(prefix(mid + 1), x, strictly)) {
      high = mid;
    } else {
      low = mid + 1;
    }
  }
  return order_walk_block(w, low, prefix(low), n, x, strictly, kNoSkip);
}

// prefix(n − 1): the sum of the first n ordered weights. n >= 1.
template <typename Weight, typename Block>
LS_HOST_DEVICE float order_prefix_sum(const Weight& w, const Block& block, int32_t n,
                                      int32_t skip) {
  // Nothing reaches +inf: the walk ends at n − 1 with its prefix.
  return order_prefix_reaching(w, block, n, __builtin_huge_valf(), false, skip).value;
}

// How many of the first n ordered weights are >= threshold, counted from w(0), which always
// counts (min-p, step 7). The weights never increase along the order: a binary search.
template <typename Weight>
LS_HOST_DEVICE int32_t order_count_at_least(const Weight& w, int32_t n, float threshold) {
  int32_t low = 1, high = n;  // w(j) >= threshold for j < low; the answer is in [low, high]
  while (low < high) {
    const int32_t mid = low + (high - low) / 2;
    if (w(mid) >= threshold) {
      low = mid + 1;
    } else {
      high = mid;
    }
  }
  return low;
}

}  // namespace ls::ops
