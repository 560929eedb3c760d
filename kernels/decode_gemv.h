// The decode GEMV (kernels/gemm.h launch_gemv_bf16) with the kernels around it folded in, for
// steps of at most kGemvTokensMax tokens: a decode step at small batch streams its weights, and
// every separate kernel that only moves activations (RMSNorm, RoPE with the KV write, SwiGLU) is a
// launch and a round trip through memory between two weight streams.
//   - The norm: the GEMV block computes each token's inverse RMS itself from the fp32 residual
//     (hidden wide) and the norm weight, in the vectorised norm kernel's order
//     (kernels/rms_norm.cuh), and rounds the normalised row to bf16 into shared memory exactly as
//     launch_rms_norm writes it to `normed`.
//   - The epilogues: a warp computes two rows that an epilogue needs together (gate row j and up
//     row j; a head's elements i and i + head_dim/2 for RoPE), each row's sum in the order of
//     launch_gemv_bf16, and writes what the separate kernel would have written.
// So every output is bit-identical to the unfused sequence (norm, GEMV, epilogue kernel), which
// tests/gpu/decode_fusion_gpu_test.cpp checks; a token's result depends only on its own row.
#pragma once

#include "kernels/launch.h"

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

namespace ls::kernels {

// x = rms_norm(residual) as launch_rms_norm(residual, nullptr, tokens, n, weight, eps, x) writes
// it, with n the GEMV's `in`. residual [tokens, n] fp32, weight [n] fp32, both 16-byte aligned.
struct GemvNorm {
  const float* residual = nullptr;
  const float* weight = nullptr;
  float eps = 0.0f;
  // The grid (the same bits either way: only which block takes a task moves). false: one wave of
  // the blocks that fit the GPU at once, each running the fewest groups of kGemvWarps tasks that
  // cover them (the norm computed once a block); true: one group a block, in as many waves as
  // that takes (every block's first weight round issued at its start).
  bool block_per_group = false;
};

// Whether the folded norm covers rows of n elements (the vectorised norm's order, n % 8 == 0).
bool gemv_norm_fits(int32_t n);

// y[tokens, out] = rms_norm(residual) · wᵀ, fp32 (launch_rms_norm, then launch_gemv_bf16 with
// beta 0). Needs 1 <= tokens <= kGemvTokensMax, gemv_norm_fits(in), w 16-byte aligned.
cudaError_t launch_gemv_norm_bf16(GemvNorm norm, const __nv_bfloat16* w, float* y,
                                  int32_t tokens, int32_t out, int32_t in, LaunchStream stream);

// act[t, j] = bf16(silu(g) · u), g, u = rows j and ffn + j of rms_norm(residual) · w_gate_upᵀ
// (launch_rms_norm, launch_gemv_bf16 into gate_up, launch_swiglu). w_gate_up [2·ffn, in].
cudaError_t launch_gemv_norm_swiglu_bf16(GemvNorm norm, const __nv_bfloat16* w_gate_up,
                                         __nv_bfloat16* act, int32_t tokens, int32_t ffn,
                                         int32_t in, LaunchStream stream);

// Where the QKV product's RoPE epilogue writes: launch_rope_qkv's arguments, for models that
// rotate whole heads (rotary_dim == head_dim) and have no q/k/v bias or head norm between the
// product and RoPE.
struct RopeKvTarget {
  const int32_t* positions = nullptr;  // [tokens]
  const int64_t* slots = nullptr;      // [tokens]
  int32_t query_heads = 0;
  int32_t kv_heads = 0;
  int32_t head_dim = 0;  // even
  const float* cos = nullptr;  // [positions_count, head_dim/2]
  const float* sin = nullptr;
  int32_t positions_count = 0;
  float* q_out = nullptr;                // [tokens, query_heads·head_dim] fp32
  __nv_bfloat16* k_cache = nullptr;      // [slots, kv_heads·head_dim]
  __nv_bfloat16* v_cache = nullptr;
};

// rms_norm(residual) · w_qkvᵀ, rotated and written as launch_rope_qkv writes it (Q to q_out, K and
// V to the caches at each token's slot), with nothing written to a qkv buffer.
// w_qkv [(query_heads + 2·kv_heads)·head_dim, in].
cudaError_t launch_gemv_norm_rope_kv_bf16(GemvNorm norm, const __nv_bfloat16* w_qkv,
                                          const RopeKvTarget& target, int32_t tokens, int32_t in,
                                          LaunchStream stream);

}  // namespace ls::kernels
