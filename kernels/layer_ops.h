// Per-token layer ops of the CUDA backend: embedding gather, RMSNorm, RoPE with the KV write,
// SwiGLU, residual add (the logits' one pass, NaN guard and record, is kernels/logits_ops.h).
// Launchers take raw device pointers, sizes and a stream, validate their arguments, and return the
// launch status (STYLE.md §2–3). Those a decode step's layer loop calls take a LaunchStream
// (kernels/launch.h): they may overlap their predecessor. Each op's CPU reference is the matching loop of core/cpu_model.cpp or core/cpu_backend.cpp; tests/gpu/
// compares them on odd sizes.
#pragma once

#include "kernels/launch.h"

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

namespace ls::kernels {

using bf16 = __nv_bfloat16;

// Storage type T of weights, KV and GEMM inputs: bf16 (production) or float (the fp32 mode, whose
// only difference from the CPU reference is the order of sums). Both are instantiated.

// out[t, :] = table[ids[t], :] as fp32. table [vocab, hidden] T, out [tokens, hidden].
template <typename T>
cudaError_t launch_embedding(const T* table, const int32_t* ids, int32_t tokens_count,
                             int32_t hidden, float* out, LaunchStream stream);

// out[r, :] = x[s, :] · rsqrt(mean(x[s, :]²) + eps) · weight, s = row_index ? row_index[r] : r.
// x [*, n] fp32, weight [n] fp32, out [rows, n] T (the next GEMM's input).
template <typename T>
cudaError_t launch_rms_norm(const float* x, const int32_t* row_index, int32_t rows_count,
                            int32_t n, const float* weight, float eps, T* out,
                            LaunchStream stream);

// The QKV epilogue: qkv [tokens, q_size + 2·kv_size] fp32 (Q, K, V of each token side by side).
// Rotates the first rotary_dim dims of each Q and K head by the RoPE table at
// min(position, positions_count − 1) (HF rotate-half within them; the dims past rotary_dim pass
// through, Bamba's partial rotary), writes Q to q_out [tokens, q_size] fp32 and K, V as T to
// k_cache/v_cache [slots, kv_size] at each token's slot. cos/sin [positions_count, rotary_dim/2]
// fp32. rotary_dim: even, in [2, head_dim].
template <typename T>
cudaError_t launch_rope_qkv(const float* qkv, const int32_t* positions, const int64_t* slots,
                            int32_t tokens_count, int32_t query_heads, int32_t kv_heads,
                            int32_t head_dim, int32_t rotary_dim, const float* cos,
                            const float* sin, int32_t positions_count, float* q_out, T* k_cache,
                            T* v_cache, LaunchStream stream);

// The QKV epilogue of Qwen2/Qwen3, in place on qkv [tokens, q_size + 2·kv_size] fp32 before
// RoPE: adds bias [q_size + 2·kv_size] fp32 (when not null; Qwen2's q/k/v biases side by side),
// then RMSNorm over each q head's and each k head's head_dim with the shared weights q_norm and
// k_norm [head_dim] fp32 (both or neither; Qwen3), eps as the layer norms'. V is not normed. The
// CPU reference is the bias and head-norm loop of CpuModel::attention_layer_qkv.
cudaError_t launch_qkv_bias_head_norm(float* qkv, int32_t tokens_count, int32_t query_heads,
                                      int32_t kv_heads, int32_t head_dim, const float* bias,
                                      const float* q_norm, const float* k_norm, float eps,
                                      LaunchStream stream);

// What Qwen2/Qwen3 do to a qkv row between the product and RoPE (launch_qkv_bias_head_norm).
struct QkvHeadPrep {
  const float* bias = nullptr;    // [q_size + 2·kv_size], or none
  const float* q_norm = nullptr;  // [head_dim], both norms or neither
  const float* k_norm = nullptr;
  float eps = 0.0f;
};

// launch_qkv_bias_head_norm then launch_rope_qkv, in one launch (a block a token prepares its row
// in place, then rotates and writes it): the same values in qkv, q_out and the caches, one launch
// a layer less. With nothing to prepare (no bias, no norms) it is launch_rope_qkv.
template <typename T>
cudaError_t launch_qkv_prep_rope(float* qkv, const QkvHeadPrep& prep, const int32_t* positions,
                                 const int64_t* slots, int32_t tokens_count, int32_t query_heads,
                                 int32_t kv_heads, int32_t head_dim, int32_t rotary_dim,
                                 const float* cos, const float* sin, int32_t positions_count,
                                 float* q_out, T* k_cache, T* v_cache, LaunchStream stream);

// out[t, i] = silu(g) · u with g = gate_up[t, i], u = gate_up[t, ffn + i]; silu(g) = g/(1+e^−g).
// gate_up [tokens, 2·ffn] fp32, out [tokens, ffn] T.
template <typename T>
cudaError_t launch_swiglu(const float* gate_up, int32_t tokens_count, int32_t ffn, T* out,
                          LaunchStream stream);

// residual[i] += delta[i] for i < count (fp32). The backend fuses this add into its GEMMs
// (beta = 1); the kernel is the plain form, for tests and non-GEMM paths.
cudaError_t launch_residual_add(float* residual, const float* delta, int64_t count,
                                cudaStream_t stream);

// Fills count floats with value (the poison fault site; NaN and ±inf included).
cudaError_t launch_fill_float(float* out, int64_t count, float value, cudaStream_t stream);

}  // namespace ls::kernels
