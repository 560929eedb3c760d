// lockstep's tensor-core linear layer for steps of 1 to kSmallMGemmTokensMax tokens (decode
// batches): y[tokens, out] (fp32) = x[tokens, in] (bf16) · w[out, in]ᵀ (bf16) + beta · y, fp32
// accumulation, beta 0 or 1 (the residual add fused), the contract of kernels/gemm.h.
//
// At small M a step is a stream of the weights: the kernel reads each weight once, through a
// multi-stage cp.async pipeline, and uses the tokens only as the MMA's narrow N side ("swap AB":
// the weights are wgmma's A operand, 64 output rows × 16 k; 8 tokens make an n-tile).
// kernels/gemm_small_m.cu says how a block is laid out and which fragment layouts it relies on.
//
// Batch invariance: a token's outputs depend only on its own row of x. The k order of every sum —
// the pipeline's 64-wide chunks, their four k16 steps in order, the split of `in` into K ranges
// and their reduction in split-index order — is a function of (out, in) alone, never of `tokens`;
// tests/gpu/gemm_small_m_gpu_test.cpp compares the bits of one row computed at several token
// counts (each count's MMA has its own N, 8 · n-tiles).
//
// Split K: a shape with at most 132 128-row tiles splits `in` into a fixed number of ranges
// (gemm_small_m_splits, from out and in only: a power of two, up to two blocks for each of the
// H200's 132 SMs, no range under 4 chunks) so that enough blocks stream at once; each
// block of a tile writes its partial sums to the workspace, and a second kernel, launched after
// the product on the same stream, adds every tile's partials in split order and writes y
// (kernels/gemm_small_m_reduce.cuh). A split launch is two kernels; the workspace needs no
// initialisation and holds nothing between launches. At one n-tile (≤ 8 tokens) in two splits a
// tile's two blocks are one thread block cluster and add their partials in shared memory instead,
// in the same order (one kernel; the workspace unused).
#pragma once

#include "kernels/decode_gemv.h"
#include "kernels/launch.h"

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

namespace ls::kernels {

constexpr int32_t kSmallMGemmTokensMax = 64;

// A product's x computed in the kernel from the residual stream, for one token:
// rms_norm(residual) as launch_rms_norm(residual, nullptr, 1, in, weight, eps, x) writes it
// (kernels/gemm_small_m_norm.cuh). Needs small_m_norm_fits(in), residual and weight [in] fp32,
// 16-byte aligned, eps > 0.
struct SmallMNorm {
  const float* residual = nullptr;
  const float* weight = nullptr;
  float eps = 0.0f;
};

// Whether the folded norm covers rows of `in` elements (the vectorised norm's, in % 8 == 0).
bool small_m_norm_fits(int32_t in);

// The K ranges a product of shape (out, in) is split into (1: none). Depends on out and in only.
int32_t gemm_small_m_splits(int32_t out, int32_t in);

// Block slots of one wave of the GEMM: two on each of the H200's 132 SMs (a constant, not the SM
// count, so that a shape sums in the same order on every GPU: gemm_small_m.cu's split rule).
constexpr int32_t kSmallMGemmBlockSlots = 264;

// Whether the blocks of a product of shape (out, in) (tiles × splits) fit one wave of
// kSmallMGemmBlockSlots or fill at least four fifths of the waves they take. One that does neither
// streams its last blocks on a few SMs while the rest idle: qwen2.5-7b's gate/up, 296 blocks in
// 1.12 waves, took 109.2 µs at 16 tokens and 118.2 at 64 against cuBLAS's 98.4 and 105.2 (H100,
// `lockstep_gpu_bench --small-m --shapes qwen2.5-7b` of 5f053f7), and the backend runs such a
// product on cuBLAS at every token count (small_m_gemm_tokens_max_for) but in batch-invariant mode.
bool gemm_small_m_fills_its_waves(int32_t out, int32_t in);

// Workspace bytes a product of shape (out, in) needs at up to `tokens_max` tokens: 0 when it
// does not split; otherwise every block's partial sums.
size_t gemm_small_m_workspace_bytes(int32_t out, int32_t in, int32_t tokens_max);

// Needs 1 <= tokens <= kSmallMGemmTokensMax, in % 8 == 0, x and w 16-byte aligned, and (when the
// shape splits) `workspace_bytes` >= gemm_small_m_workspace_bytes(out, in, tokens);
// cudaErrorInvalidValue otherwise, nothing launched. Allocates nothing; the first launch
// on a device raises the kernels' shared-memory limit (cudaFuncSetAttribute, a host call that a
// graph capture allows).
cudaError_t launch_gemm_small_m_bf16(const __nv_bfloat16* x, const __nv_bfloat16* w, float* y,
                                     int32_t tokens, int32_t out, int32_t in, float beta,
                                     void* workspace, size_t workspace_bytes,
                                     LaunchStream stream);

// act[t, j] = bf16(silu(g) · u), g, u = rows j and ffn + j of x · w_gate_upᵀ (w_gate_up
// [2·ffn, in]): bit for bit launch_gemm_small_m_bf16 into a [tokens, 2·ffn] buffer (beta 0) then
// launch_swiglu, with no such buffer written (kernels/gemm_small_m_layout.h says how a tile
// pairs the rows). The limits and the workspace are those of the (2·ffn, in) product.
cudaError_t launch_gemm_small_m_swiglu_bf16(const __nv_bfloat16* x,
                                            const __nv_bfloat16* w_gate_up, __nv_bfloat16* act,
                                            int32_t tokens, int32_t ffn, int32_t in,
                                            void* workspace, size_t workspace_bytes,
                                            LaunchStream stream);
// The same for one token with x = rms_norm(residual) folded in (SmallMNorm): bit for bit
// launch_rms_norm then launch_gemm_small_m_swiglu_bf16.
cudaError_t launch_gemm_small_m_norm_swiglu_bf16(const SmallMNorm& norm,
                                                 const __nv_bfloat16* w_gate_up,
                                                 __nv_bfloat16* act, int32_t ffn, int32_t in,
                                                 void* workspace, size_t workspace_bytes,
                                                 LaunchStream stream);

// x · w_qkvᵀ rotated and written as launch_rope_qkv writes it with rotary_dim = head_dim (Q to
// target.q_out, K rotated and V to the caches at each token's slot), bit for bit
// launch_gemm_small_m_bf16 into a qkv buffer (beta 0) then launch_rope_qkv, with no such buffer
// written: each head's elements i and i + head_dim/2 pair as SwiGLU's rows do.
// w_qkv [(query_heads + 2·kv_heads)·head_dim, in]; the limits and the workspace are those of that
// product; every pointer of `target` set.
cudaError_t launch_gemm_small_m_rope_kv_bf16(const __nv_bfloat16* x, const __nv_bfloat16* w_qkv,
                                             const RopeKvTarget& target, int32_t tokens,
                                             int32_t in, void* workspace, size_t workspace_bytes,
                                             LaunchStream stream);
// The same for one token with x = rms_norm(residual) folded in (SmallMNorm): bit for bit
// launch_rms_norm then launch_gemm_small_m_rope_kv_bf16.
cudaError_t launch_gemm_small_m_norm_rope_kv_bf16(const SmallMNorm& norm,
                                                  const __nv_bfloat16* w_qkv,
                                                  const RopeKvTarget& target, int32_t in,
                                                  void* workspace, size_t workspace_bytes,
                                                  LaunchStream stream);

}  // namespace ls::kernels
