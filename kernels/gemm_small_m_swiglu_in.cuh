// The small-M GEMM's x computed from a split gate/up product's partials, for a product of one
// token (kernels/gemm_small_m.h launch_gemm_small_m_swiglu_partials_bf16: the down projection at
// batch 1): the gate/up launch stops before its reduction kernel, and each block of the down
// product adds the partials of its own K range of activations in split order and applies SwiGLU
// as that reduction does (gemm_small_m_reduce_kernel, then store_fragment's SwiGLU), into the
// folded region that the folded norm uses (kernels/gemm_small_m_norm.cuh). The same bits as the
// reduction's act; one kernel boundary fewer a layer, and the activations read once from L2
// instead of written and read back.
#pragma once

#include "core/ops/layer_math.h"
#include "kernels/gemm_small_m_layout.h"

#include <cuda_bf16.h>

#include <cstdint>

namespace ls::kernels::small_m {

// Activations k0 .. k0 + count − 1 of the token (zeros past `in`) into region[0 .. count).
__device__ __forceinline__ void swiglu_from_partials_into(const Params& p, int32_t k0,
                                                          int32_t count, bf16* region) {
  for (int32_t i = static_cast<int32_t>(threadIdx.x); i < count; i += kThreads) {
    const int32_t k = k0 + i;
    if (k >= p.in) {
      region[i] = __float2bfloat16_rn(0.0f);
      continue;
    }
    const SwigluSource at = swiglu_source(k);
    const float4* partial =
        p.swiglu_partials + int64_t{at.tile} * p.swiglu_splits * kThreads + at.tid;
    float gate = 0.0f, up = 0.0f;
    for (int32_t s = 0; s < p.swiglu_splits; ++s) {
      const float4 v = __ldcg(partial + int64_t{s} * kThreads);
      gate = s == 0 ? v.x : gate + v.x;
      up = s == 0 ? v.z : up + v.z;
    }
    region[i] = __float2bfloat16_rn(ops::swiglu(gate, up));
  }
}

}  // namespace ls::kernels::small_m
