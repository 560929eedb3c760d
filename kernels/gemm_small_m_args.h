// The small-M GEMM's launch arguments, as kernels/gemm_small_m.cu checks them: what a product
// reads (x, or the residual through the folded norm) and where it goes (y, or an epilogue).
// Host code.
#pragma once

#include "kernels/decode_gemv.h"
#include "kernels/gemm_small_m.h"
#include "kernels/gemm_small_m_layout.h"

#include <cstdint>

namespace ls::kernels::small_m {

inline bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

// Where a product goes: y (fp32, plus beta · y), or through an epilogue.
struct Output {
  float* y = nullptr;
  float beta = 0.0f;
  Epilogue epilogue = Epilogue::kPlain;
  bf16* act = nullptr;
  RopeKvTarget rope{};
};
inline Output into_y(float* y, float beta) {
  return Output{y, beta, Epilogue::kPlain, nullptr, {}};
}
inline Output through_swiglu(bf16* act) {
  return Output{nullptr, 0.0f, Epilogue::kSwiglu, act, {}};
}
inline Output through_rope_kv(const RopeKvTarget& rope) {
  return Output{nullptr, 0.0f, Epilogue::kRopeKv, nullptr, rope};
}

// Whether `to` names somewhere to write a product of `out` rows.
inline bool writable(const Output& to, int32_t out) {
  switch (to.epilogue) {
    case Epilogue::kPlain: return to.y != nullptr;
    case Epilogue::kSwiglu: return to.act != nullptr && out % 2 == 0;
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

// What a product reads: x [tokens, in] bf16, or (one token) the residual through the folded norm.
struct Input {
  const bf16* x = nullptr;
  SmallMNorm norm{};
};
inline Input from_x(const bf16* x) { return Input{x, {}}; }
inline Input through_norm(const SmallMNorm& norm) { return Input{nullptr, norm}; }

inline bool readable(const Input& from, int32_t tokens, int32_t in) {
  if (from.norm.residual == nullptr) return from.x != nullptr && aligned16(from.x);
  return tokens == 1 && small_m_norm_fits(in) && from.norm.weight != nullptr &&
         aligned16(from.norm.residual) && aligned16(from.norm.weight) && from.norm.eps > 0.0f;
}

}  // namespace ls::kernels::small_m
