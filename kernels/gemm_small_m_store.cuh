// The small-M GEMM's stores (an element of y, a fragment through its epilogue), shared by its
// product kernel (kernels/gemm_small_m.cu) and its split reduction
// (kernels/gemm_small_m_reduce.cuh); the layout they follow is kernels/gemm_small_m_layout.h.
#pragma once

#include "core/ops/layer_math.h"
#include "kernels/gemm_small_m_layout.h"

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

namespace ls::kernels::small_m {

// One element of y: the sum, plus beta · y (the residual) when beta is not 0.
__device__ __forceinline__ void store_one(const Params& p, int32_t row, int32_t token, float sum) {
  if (row < p.out && token < p.tokens) {
    float* y = p.y + int64_t{token} * p.out + row;
    *y = p.beta == 0.0f ? sum : sum + p.beta * *y;
  }
}

// Row `row` (a pair's first, x1) and row + half (x2) of token t through RoPE and the KV write,
// as rope_qkv_kernel computes and stores them (kernels/layer_ops.cu).
__device__ __forceinline__ void store_rope_kv(const RopeKvTarget& r, int32_t t, int32_t row,
                                              float x1, float x2) {
  const int32_t d = r.head_dim, half = d / 2;
  const int32_t head = row / d, i = row % d;
  const int32_t q_size = r.query_heads * d, kv_size = r.kv_heads * d;
  if (head >= r.query_heads + r.kv_heads) {  // V: as it is
    bf16* v = r.v_cache + r.slots[t] * kv_size + (head - r.query_heads - r.kv_heads) * d;
    v[i] = __float2bfloat16_rn(x1);
    v[i + half] = __float2bfloat16_rn(x2);
    return;
  }
  const int32_t position = min(r.positions[t], r.positions_count - 1);
  const ops::RotatedPair y = ops::rope_rotate(x1, x2, r.cos[int64_t{position} * half + i],
                                              r.sin[int64_t{position} * half + i]);
  if (head < r.query_heads) {
    float* q = r.q_out + int64_t{t} * q_size + head * d;
    q[i] = y.first;
    q[i + half] = y.second;
  } else {
    bf16* k = r.k_cache + r.slots[t] * kv_size + (head - r.query_heads) * d;
    k[i] = __float2bfloat16_rn(y.first);
    k[i + half] = __float2bfloat16_rn(y.second);
  }
}

// The four sums of n-tile j of thread tid (elements e = 0..3 of its fragment) of tile `tile`:
// into y, or through a paired epilogue (a pair's first rows in e = 0, 1 and their partners in
// e = 2, 3, for the same two tokens): SwiGLU into act as launch_swiglu writes it, or RoPE and the
// KV write as launch_rope_qkv.
__device__ __forceinline__ void store_fragment(const Params& p, int32_t tile, int32_t tid,
                                               int32_t j, const float (&sum)[4]) {
  if (p.epilogue == Epilogue::kPlain) {
#pragma unroll
    for (int32_t e = 0; e < 4; ++e) {
      store_one(p, tile * kTileRows + fragment_row(tid, e), fragment_token(tid, j, e), sum[e]);
    }
    return;
  }
  const int32_t row = tile_row_weight(p, tile, fragment_row(tid, 0));  // a first row, or -1
#pragma unroll
  for (int32_t e = 0; e < 2; ++e) {
    const int32_t token = fragment_token(tid, j, e);
    if (row < 0 || token >= p.tokens) continue;
    if (p.epilogue == Epilogue::kSwiglu) {
      p.act[int64_t{token} * (p.out / 2) + row] =
          __float2bfloat16_rn(ops::swiglu(sum[e], sum[e + 2]));
    } else {
      store_rope_kv(p.rope, token, row, sum[e], sum[e + 2]);
    }
  }
}

}  // namespace ls::kernels::small_m
