#include "kernels/gemm.h"

#include "kernels/launch.cuh"
#include "kernels/reduce.cuh"

namespace ls::kernels {

namespace {

using bf16 = __nv_bfloat16;

constexpr int32_t kGemvWarps = 4;  // output rows per block
constexpr int32_t kGemvThreads = 32 * kGemvWarps;
constexpr int32_t kGemvUnroll = 8;  // 16-byte weight loads a lane has in flight

__device__ __forceinline__ void unpack8(const uint4& raw, float* out) {
  const __nv_bfloat162* pairs = reinterpret_cast<const __nv_bfloat162*>(&raw);
#pragma unroll
  for (int32_t k = 0; k < 4; ++k) {
    const float2 f = __bfloat1622float2(pairs[k]);
    out[2 * k] = f.x;
    out[2 * k + 1] = f.y;
  }
}

// One chunk (8 elements) of weight row against the same chunk of every token's input.
template <int32_t kTokens>
__device__ __forceinline__ void accumulate(const uint4& w_raw, const uint4* x, int32_t x_pitch,
                                           int32_t chunk, int32_t tokens, float* acc) {
  float wf[8];
  unpack8(w_raw, wf);
#pragma unroll
  for (int32_t t = 0; t < kTokens; ++t) {
    if (t < tokens) {
      float xf[8];
      unpack8(__ldg(x + int64_t{t} * x_pitch + chunk), xf);
#pragma unroll
      for (int32_t e = 0; e < 8; ++e) acc[t] += wf[e] * xf[e];
    }
  }
}

// grid: ⌈out / 4⌉ blocks of 4 warps; warp → output row. Lane l takes the 8-element chunks l,
// l + 32, l + 64, ... of the row in ascending order (the unrolled and the tail loop keep that
// order), then a butterfly sum across lanes: the order depends on `in` only. The first unrolled
// round of weight loads is issued before waiting for the predecessor kernel (kernels/launch.h):
// the weights depend on nothing earlier, and at hidden 2048 that round is the whole row.
template <int32_t kTokens>
__global__ void __launch_bounds__(kGemvThreads)
gemv_kernel(const bf16* __restrict__ x, const bf16* __restrict__ w, float* __restrict__ y,
            int32_t tokens, int32_t out, int32_t in, float beta) {
  allow_successor();
  const int32_t row = blockIdx.x * kGemvWarps + threadIdx.x / 32;
  if (row >= out) return;
  const int32_t lane = threadIdx.x % 32;
  const int32_t chunks = in / 8;
  const uint4* wr = reinterpret_cast<const uint4*>(w + int64_t{row} * in);
  const uint4* xr = reinterpret_cast<const uint4*>(x);
  float acc[kTokens];
#pragma unroll
  for (int32_t t = 0; t < kTokens; ++t) acc[t] = 0.0f;
  int32_t c = lane;
  uint4 raw[kGemvUnroll];
  const auto round_fits = [&] { return c + 32 * (kGemvUnroll - 1) < chunks; };
  const auto load_round = [&] {
#pragma unroll
    for (int32_t u = 0; u < kGemvUnroll; ++u) raw[u] = __ldcs(wr + c + 32 * u);
  };
  if (round_fits()) load_round();
  wait_for_predecessor();
  while (round_fits()) {
#pragma unroll
    for (int32_t u = 0; u < kGemvUnroll; ++u) {
      accumulate<kTokens>(raw[u], xr, chunks, c + 32 * u, tokens, acc);
    }
    c += 32 * kGemvUnroll;
    if (round_fits()) load_round();
  }
  for (; c < chunks; c += 32) accumulate<kTokens>(__ldcs(wr + c), xr, chunks, c, tokens, acc);
#pragma unroll
  for (int32_t t = 0; t < kTokens; ++t) acc[t] = warp_sum(acc[t]);
  if (lane != 0) return;
#pragma unroll
  for (int32_t t = 0; t < kTokens; ++t) {
    if (t < tokens) {
      float* out_at = y + int64_t{t} * out + row;
      *out_at = beta == 0.0f ? acc[t] : acc[t] + beta * *out_at;
    }
  }
}

template <int32_t kTokens>
cudaError_t launch(const bf16* x, const bf16* w, float* y, int32_t tokens, int32_t out, int32_t in,
                   float beta, LaunchStream stream) {
  const int32_t blocks = (out + kGemvWarps - 1) / kGemvWarps;
  return launch_kernel(gemv_kernel<kTokens>, blocks, kGemvThreads, 0, stream, x, w, y, tokens, out,
                       in, beta);
}

}  // namespace

cudaError_t launch_gemv_bf16(const bf16* x, const bf16* w, float* y, int32_t tokens, int32_t out,
                             int32_t in, float beta, LaunchStream stream) {
  if (tokens < 1 || tokens > kGemvTokensMax || out < 1 || in < 8 || in % 8 != 0 ||
      x == nullptr || w == nullptr || y == nullptr ||
      reinterpret_cast<uintptr_t>(x) % 16 != 0 || reinterpret_cast<uintptr_t>(w) % 16 != 0) {
    return cudaErrorInvalidValue;
  }
  // Instantiated at 1, 2, 4 and 8 tokens: a token's arithmetic is the same in each.
  if (tokens == 1) return launch<1>(x, w, y, tokens, out, in, beta, stream);
  if (tokens == 2) return launch<2>(x, w, y, tokens, out, in, beta, stream);
  if (tokens <= 4) return launch<4>(x, w, y, tokens, out, in, beta, stream);
  return launch<8>(x, w, y, tokens, out, in, beta, stream);
}

}  // namespace ls::kernels
