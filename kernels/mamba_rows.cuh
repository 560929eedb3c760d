// A row of a mixer launch cut on the chunked scan's block grid (kernels/mamba_scan.h): the head
// [first, head_end), `blocks` complete blocks of kMambaScanChunk tokens from head_end, the tail
// up to end. Included by mamba_ops.cu, mamba_scan.cu and mamba_ssd.cu.
#pragma once

#include "kernels/mamba_scan.h"

namespace ls::kernels {
namespace {

// Row r's first verify-state slot, or −1: not a verified row (MambaRows::verify_base).
__device__ __forceinline__ int32_t verify_base_of(const MambaRows& rows, int32_t row) {
  return rows.verify_base != nullptr ? rows.verify_base[row] : -1;
}

struct MambaRowCut {
  int32_t first = 0;     // the row's first token (launch index)
  int32_t end = 0;       // one past its last
  int32_t head_end = 0;  // the first complete block's first token; `end` when there is none
  int32_t blocks = 0;    // complete blocks (0 for a padded row)
  int32_t slot = -1;

  __device__ int32_t tail_begin() const { return head_end + blocks * kMambaScanChunk; }
  // Block k's first token, and its index in the SSD workspace: blocks are disjoint runs of
  // kMambaScanChunk launch tokens, so their first tokens divided by the block size are distinct
  // and below tokens_count / kMambaScanChunk.
  __device__ int32_t block_first(int32_t k) const { return head_end + k * kMambaScanChunk; }
  __device__ int32_t block_index(int32_t k) const { return block_first(k) / kMambaScanChunk; }
};

// positions may be null only for a whole-row cut (no blocks read). A verified row is never cut:
// the sequential scan leaves the state after each of its tokens in its verify slots (its
// verify_width <= 16 tokens hold no complete block anyway, so it keeps the sequential bits).
__device__ __forceinline__ MambaRowCut cut_row(const MambaRows& rows, const int32_t* positions,
                                               int32_t row, bool with_blocks) {
  MambaRowCut cut;
  cut.first = rows.token_offsets[row];
  cut.end = cut.first + rows.token_counts[row];
  cut.slot = rows.slots[row];
  cut.head_end = cut.end;
  if (!with_blocks || cut.slot < 0 || cut.end <= cut.first || verify_base_of(rows, row) >= 0) {
    return cut;
  }
  int32_t offset = positions[cut.first] % kMambaScanChunk;  // C++ keeps the sign
  if (offset < 0) offset += kMambaScanChunk;
  const int32_t lead = offset == 0 ? 0 : kMambaScanChunk - offset;
  const int32_t count = cut.end - cut.first;
  if (lead >= count) return cut;
  cut.blocks = (count - lead) / kMambaScanChunk;
  if (cut.blocks > 0) cut.head_end = cut.first + lead;
  return cut;
}

}  // namespace
}  // namespace ls::kernels
