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

// Floats of workspace that `tokens` tokens need in one launch.
size_t attention_workspace_floats(const AttentionShape& shape, int32_t tokens);

// q [tokens, query_heads·head_dim] fp32 (already rotated); k_cache/v_cache [slots, kv_size] T
// (bf16, or float in the fp32 mode) of one layer; positions/token_pool_rows [tokens]; table
// [pool rows, table_width]. out [tokens, query_heads·head_dim] T. Tokens are processed in chunks
// that fit `workspace`. Needs head_dim % 8 == 0 (vector loads of key rows) and
// (query_heads / kv_heads) · head_dim <= 1024 (one block's queries in shared memory).
template <typename T>
cudaError_t launch_paged_attention(const AttentionShape& shape, const float* q, const T* k_cache,
                                   const T* v_cache, const int32_t* positions,
                                   const int32_t* token_pool_rows, const int32_t* table,
                                   int32_t tokens_count, float* workspace,
                                   size_t workspace_floats, T* out, LaunchStream stream);

}  // namespace ls::kernels
