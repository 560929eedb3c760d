// The small-M GEMM's launch arguments, as kernels/gemm_small_m.cu checks them: what a product
// reads (x, the residual through the folded norm, or a gate/up product's partials through SwiGLU)
// and where it goes (y, an epilogue, or its split partials left for the next product).
// Host code.
#pragma once

#include "kernels/decode_gemv.h"
#include "kernels/gemm_small_m.h"
#include "kernels/gemm_small_m_layout.h"

#include <cstdint>

namespace ls::kernels::small_m {

inline bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

// Where a product goes: y (fp32, plus beta · y), or through an epilogue; partials_only: a split
// SwiGLU product's partials stay in the workspace, unreduced, for the next product to read.
struct Output {
  float* y = nullptr;
  float beta = 0.0f;
  Epilogue epilogue = Epilogue::kPlain;
  bf16* act = nullptr;
  RopeKvTarget rope{};
  bool partials_only = false;
};
inline Output into_y(float* y, float beta) {
  return Output{y, beta, Epilogue::kPlain, nullptr, {}, false};
}
inline Output through_swiglu(bf16* act) {
  return Output{nullptr, 0.0f, Epilogue::kSwiglu, act, {}, false};
}
inline Output swiglu_partials_only() {
  return Output{nullptr, 0.0f, Epilogue::kSwiglu, nullptr, {}, true};
}
inline Output through_rope_kv(const RopeKvTarget& rope) {
  return Output{nullptr, 0.0f, Epilogue::kRopeKv, nullptr, rope, false};
}

// Whether `to` names somewhere to write a product of `out` rows.
inline bool writable(const Output& to, int32_t out) {
  switch (to.epilogue) {
    case Epilogue::kPlain: return to.y != nullptr;
    case Epilogue::kSwiglu: return (to.act != nullptr || to.partials_only) && out % 2 == 0;
    case Epilogue::kRopeKv: {
      const RopeKvTarget& r = to.rope;
      return r.positions != nullptr && r.slots != nullptr && r.cos != nullptr &&
             r.sin != nullptr && r.q_out != nullptr && r.k_cache != nullptr &&
             r.v_cache != nullptr && r.query_heads >= 1 && r.kv_heads >= 1 && r.head_dim >= 2 &&
             r.head_dim % 2 == 0 && r.positions_count >= 1 &&
             (int64_t{r.query_heads} + 2 * int64_t{r.kv_heads}) * r.head_dim == out;
    }
  }
  return false;
}

// What a product reads: x [tokens, in] bf16, or (one token) the residual through the folded norm,
// or a split gate/up product's partials through SwiGLU.
struct Input {
  const bf16* x = nullptr;
  SmallMNorm norm{};
  SmallMSwigluPartials swiglu{};
};
inline Input from_x(const bf16* x) { return Input{x, {}, {}}; }
inline Input through_norm(const SmallMNorm& norm) { return Input{nullptr, norm, {}}; }
inline Input through_swiglu_partials(const SmallMSwigluPartials& swiglu) {
  return Input{nullptr, {}, swiglu};
}

// The partials' own shape (their split, against `in`) is the caller's to check.
inline bool readable(const Input& from, int32_t tokens, int32_t in) {
  if (from.swiglu.partials != nullptr) return tokens == 1 && aligned16(from.swiglu.partials);
  if (from.norm.residual == nullptr) return from.x != nullptr && aligned16(from.x);
  return tokens == 1 && small_m_norm_fits(in) && from.norm.weight != nullptr &&
         aligned16(from.norm.residual) && aligned16(from.norm.weight) && from.norm.eps > 0.0f;
}

}  // namespace ls::kernels::small_m
