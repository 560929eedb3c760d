// Paged causal attention with GQA, for prefill (with a cached prefix; causal inside the chunk) and
// decode alike: token t of the step attends to positions 0 .. min(position_t, positions_count − 1)
// of its own request, found through the block table, exactly as CpuModel::attend does.
//
// Split-KV with a FIXED split size (kAttentionSplitKeys): a token's keys are cut into splits at
// fixed positions, each split's partial softmax is computed independently, and the partials are
// combined in split order. How a token is split depends only on its own position, never on the
// batch, so the result does not depend on what else is in the step.
//
// Two split kernels compute a split: bf16 KV with head_dim 64 or 128 (the production models) on
// the tensor cores (attention_mma.cuh: bf16 Q and probabilities, fp32 accumulation), everything
// else (the fp32 mode, other head dims) on the CUDA cores with fp32 Q and probabilities. How many
// blocks a launch spreads a token's splits over depends on the batch (to fill the GPU), never how
// a split is computed.
//
// Prefill chunks may instead take the tile kernel (attention_tiles.cuh, AttentionPrefill::kTiles:
// bf16 KV, head_dim 64 or 128): tiles of consecutive tokens of one sequence, so a split's K/V is
// read once per tile rather than once per token. Its tokens have the same bits in any tile,
// launch or batch, but not the bits the decode kernel gives them: batch-invariant mode, where a
// token must have the same bits in a chunk as at decode, asks for AttentionPrefill::kDecodeKernel.
#pragma once

#include "kernels/launch.h"

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

namespace ls::kernels {

constexpr int32_t kAttentionSplitKeys = 128;

struct AttentionShape {
  int32_t query_heads = 0;
  int32_t kv_heads = 0;
  int32_t head_dim = 0;
  int32_t table_width = 0;
  int32_t page_size = 0;
  int32_t positions_count = 0;  // table_width · page_size: the RoPE table's length
};

// Parts of the decode kernels a launch can leave out, for the benchmark's profile of what each
// adds to a step (CudaBackendOptions::leave_out); the output is then wrong. The split kernel's
// parts exist on the tensor-core kernel (bf16 KV, head_dim 64 or 128) at a group of
// kAttentionLeaveOutGroup query heads a KV head (llama's), one at a time: another launch that asks
// for them gets cudaErrorInvalidValue.
enum AttentionLeaveOut : uint32_t {
  kAttentionCombine = 1u << 0,    // the combine of split partials (out then holds only what
                                  // single-split tokens wrote)
  kAttentionSplitBody = 1u << 1,  // the split kernel returns as soon as its wait ends (its reads
                                  // ahead of the wait, unused, compiled away): what remains is
                                  // its launch and its kernel boundaries
  kAttentionKvReads = 1u << 2,    // the split kernel reads no K/V rows (its arithmetic, shared
                                  // memory and partials as before, on whatever the tiles held)
  kAttentionArithmetic = 1u << 3,  // the split kernel's scores (and its loads of Q), softmax,
                                   // P·V and partial writes: its reads of the K/V rows stay, in
                                   // their order, pipeline and barriers (with no partials
                                   // written, the combine goes too)
};
constexpr uint32_t kAttentionSplitParts =
    kAttentionSplitBody | kAttentionKvReads | kAttentionArithmetic;
constexpr uint32_t kAttentionLeaveOutAll = kAttentionCombine | kAttentionSplitParts;
constexpr int32_t kAttentionLeaveOutGroup = 4;
// Whether bf16 KV of this head_dim takes the tensor-core kernels (the split kernel's MMA form and
// the prefill tile kernel).
constexpr bool attention_on_tensor_cores(int32_t head_dim) {
  return head_dim == 64 || head_dim == 128;
}
// Whether a model's attention (head_dim, query heads a KV head) has the split kernel's parts.
constexpr bool attention_split_parts_exist(int32_t head_dim, int32_t group) {
  return attention_on_tensor_cores(head_dim) && group == kAttentionLeaveOutGroup;
}

// Which kernel computes a launch's prefill tokens.
enum class AttentionPrefill {
  // The tile kernel where it applies (bf16 KV, head_dim 64 or 128, at least
  // kAttentionTilePrefillTokensMin prefill tokens; otherwise the decode kernel): the default mode.
  kTiles,
  // The decode kernel for every token, so a token of a prefill chunk has the bits it has alone at
  // decode: batch-invariant mode (CudaBackendOptions::batch_invariant, issue 15).
  kDecodeKernel,
};

// Fewer prefill tokens than this in a launch take the decode kernel even under kTiles: a short
// chunk makes few tiles, each walking all its splits in one block, where the decode kernel spreads
// a token's splits over several blocks. (attention7's threshold for launches; TODO(perf): measure
// where the tile kernel starts to win on the H200.)
constexpr int32_t kAttentionTilePrefillTokensMin = 256;

// How many of a launch's first tokens the tile kernel takes: its prefill tokens under kTiles where
// the tile kernel exists (bf16 KV, head_dim 64 or 128) and the chunks are long enough; 0 (the
// decode kernel takes every token) otherwise. Sizes and the mode alone decide, never timing.
int32_t attention_tiled_tokens(const AttentionShape& shape, bool bf16_kv, int32_t prefill_tokens,
                               AttentionPrefill prefill);

// Floats of workspace that `tokens` tokens need in one launch, whichever kernel takes them (the
// decode kernel's partials; the tile kernel's list of tiles, one int a token, is far smaller and
// shares the same floats, stream-ordered).
size_t attention_workspace_floats(const AttentionShape& shape, int32_t tokens);

// The most positions (table_width · page_size) the decode kernel serves on the current device:
// its combine merges a token's splits holding two floats a split in shared memory, at most the
// device's opt-in limit for a block (an H200: ~3.7 M positions). Asked at the backend's start.
cudaError_t attention_positions_max(int64_t* positions);

// q [tokens, query_heads·head_dim] fp32 (already rotated); k_cache/v_cache [slots, kv_size] T
// (bf16, or float in the fp32 mode) of one layer; positions/token_pool_rows [tokens]; table
// [pool rows, table_width]. out [tokens, query_heads·head_dim] T. The first prefill_tokens_count
// tokens are the step's prefill chunks (each chunk's tokens consecutive, as the step lays them
// out); `prefill` says which kernel takes them, the decode kernel takes the rest. Any count in
// [0, tokens_count] gives correct attention (a tile is cut wherever the pool row changes): it
// only picks the kernel. Tokens are processed in launches that fit `workspace` (at least one
// token's: attention_workspace_floats(shape, 1)). Needs head_dim % 8 == 0 (vector loads of key
// rows) and (query_heads / kv_heads) · head_dim <= 1024 (one block's queries in shared memory).
// leave_out (bits of AttentionLeaveOut, 0 by default) leaves parts of the decode kernels out: the
// benchmark's profile (ls::LeaveOut), never a forward that counts. Overlapped (stream.overlap),
// the decode kernels read positions, token_pool_rows and table before waiting for their
// predecessor: those must be final before the predecessor started (a step's inputs are,
// kernels/launch.cuh); q and the caches only after.
template <typename T>
cudaError_t launch_paged_attention(const AttentionShape& shape, const float* q, const T* k_cache,
                                   const T* v_cache, const int32_t* positions,
                                   const int32_t* token_pool_rows, const int32_t* table,
                                   int32_t tokens_count, int32_t prefill_tokens_count,
                                   AttentionPrefill prefill, float* workspace,
                                   size_t workspace_floats, T* out, LaunchStream stream,
                                   uint32_t leave_out = 0);

}  // namespace ls::kernels
