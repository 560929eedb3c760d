// The chunked scan's SSD stages (kernels/mamba_scan.h launch_mamba_ssd). For a complete block of
// Q = kMambaScanChunk tokens t = 0 .. Q − 1 of a row, one head, with step sizes Δ_t,
// A = −exp(A_log), the log decays a_t = Δ_t·A, their sums R(s, t) = Σ_{s < u ≤ t} a_u and
// S_t = Σ_{u ≤ t} a_u, and the state h⁰ at the block's start:
//
//   y_t[p]    = Σ_{s ≤ t} (C_t·B_s) · e^{R(s, t)} · Δ_s · x_s[p]  +  e^{S_t} · (C_t · h⁰[p, :])
//               + D · x_t[p]
//   h^Q[p, n] = e^{S_{Q−1}} · h⁰[p, n]  +  Σ_s e^{R(s, Q−1)} · Δ_s · x_s[p] · B_s[n]
//
// — the sequential recurrence h ← h·e^{Δ_t·A} + Δ_t·B_t·x_t, y_t = C_t·h + D·x_t unrolled over the
// block. R(s, t) is summed over its own terms (not S_t − S_s, which would carry the rounding of
// S_t's whole magnitude into every short decay). The block-local terms are independent across
// blocks (kernels 1–3); only the short pass of h⁰ from block to block is sequential (kernel 4);
// the outputs follow (kernel 5). Each kernel computes a 64 × 64 tile per block of 256 threads,
// thread (tx, ty) = (tid % 16, tid / 16) owning rows 4ty + a and columns 4tx + b (a, b < 4; both
// operands of a step are one 16-byte shared load), every sum over its reduction index ascending
// — one order fixed by the shape, so the same bits whatever the launch holds.
#include "kernels/mamba_scan.h"

#include "core/ops/mamba_math.h"
#include "kernels/launch.cuh"
#include "kernels/mamba_rows.cuh"

namespace ls::kernels {

namespace {

constexpr int32_t kQ = kMambaScanChunk;
constexpr int32_t kThreads = 256;
constexpr int32_t kTile = 64;   // head elements (p) or state elements (n) a tile covers
constexpr int32_t kSlice = 32;  // state elements a shared-memory slice holds (C·Bᵀ, C·h)
// A slice's pitch: it is stored state element major, [n, 64 rows], 16-byte rows of 4 floats, and
// a warp storing 32 consecutive n of one row hits 8 banks, not 1.
constexpr int32_t kPitch = kQ + 4;
constexpr int32_t kPrepareThreads = 128;
static_assert(kQ == 4 * 16 && kTile == 4 * 16, "a 16 × 16 thread grid of 4 × 4 tiles");

// acc[a][b] += u[a] · v[b]: a thread's 4 × 4 outer product of the 4 floats at `u` (its rows) and
// at `v` (its columns), both 16-byte aligned shared memory.
__device__ __forceinline__ void outer_4x4(float (&acc)[4][4], const float* u, const float* v) {
  const float4 u4 = *reinterpret_cast<const float4*>(u);
  const float4 v4 = *reinterpret_cast<const float4*>(v);
  const float us[4] = {u4.x, u4.y, u4.z, u4.w};
  const float vs[4] = {v4.x, v4.y, v4.z, v4.w};
#pragma unroll
  for (int32_t a = 0; a < 4; ++a) {
#pragma unroll
    for (int32_t b = 0; b < 4; ++b) acc[a][b] = fmaf(us[a], vs[b], acc[a][b]);
  }
}

// The block this CUDA block serves: block k = blockIdx.x of row `row`, or none (k past the row's
// complete blocks: the grid covers the launch's most).
struct SsdBlock {
  MambaRowCut cut;
  int32_t first = 0;  // its first token (launch index)
  int32_t index = 0;  // its index in the workspace
};

__device__ __forceinline__ bool ssd_block(const MambaRows& rows, const int32_t* positions,
                                          int32_t row, SsdBlock* out) {
  out->cut = cut_row(rows, positions, row, true);
  const int32_t k = static_cast<int32_t>(blockIdx.x);
  if (k >= out->cut.blocks) return false;
  out->first = out->cut.block_first(k);
  out->index = out->cut.block_index(k);
  return true;
}

__device__ __forceinline__ int32_t group_of(const MambaShape& s, int32_t head) {
  return head / (s.heads_count / s.groups_count);
}

// Columns [c0, c0 + kTile) of the block's tokens' conv outputs from column `offset` into
// tile [s, c] (kQ × kTile), zeros from column `count` on. The whole CUDA block loads it.
__device__ __forceinline__ void load_token_tile(float* tile, const float* tokens,
                                                int32_t conv_dim, int32_t offset, int32_t c0,
                                                int32_t count) {
  for (int32_t e = threadIdx.x; e < kQ * kTile; e += kThreads) {
    const int32_t s = e / kTile, c = c0 + e % kTile;
    tile[e] = c < count ? tokens[int64_t{s} * conv_dim + offset + c] : 0.0f;
  }
}

// Kernel 1: the block's step sizes Δ_t (the sequential scan's, ops::mamba_step_size), log decays
// a_t = Δ_t·A and sums S_t in ascending t, per head. grid (blocks, rows).
__global__ void __launch_bounds__(kPrepareThreads)
ssd_prepare_kernel(MambaShape shape, MambaLayerParams params, MambaRows rows,
                   const int32_t* positions, const float* proj, MambaSsdWorkspace ssd) {
  allow_successor();
  wait_for_predecessor();
  SsdBlock blk;
  if (!ssd_block(rows, positions, static_cast<int32_t>(blockIdx.y), &blk)) return;
  const int32_t dt_offset = shape.inner_size() + shape.conv_dim();
  for (int32_t head = threadIdx.x; head < shape.heads_count; head += kPrepareThreads) {
    const float a = -ops::exp_f(params.a_log[head]);
    const float dt_bias = params.dt_bias[head];
    const int64_t at = (int64_t{blk.index} * shape.heads_count + head) * kQ;
    float dt[kQ];  // every load in flight before the first store
#pragma unroll
    for (int32_t t = 0; t < kQ; ++t) {
      dt[t] = proj[int64_t{blk.first + t} * shape.in_proj_size() + dt_offset + head];
    }
    float sum = 0.0f;
#pragma unroll
    for (int32_t t = 0; t < kQ; ++t) {
      const float step = ops::mamba_step_size(dt[t], dt_bias, shape.dt_min, shape.dt_max);
      const float rate = step * a;
      sum += rate;
      ssd.steps[at + t] = step;
      ssd.rates[at + t] = rate;
      ssd.sums[at + t] = sum;
    }
  }
}

// Kernel 2: C·Bᵀ of the block for one group (shared by its heads), over n ascending in slices of
// kSlice, stored [s, t]. grid (blocks, rows, groups).
__global__ void __launch_bounds__(kThreads)
ssd_cb_kernel(MambaShape shape, MambaRows rows, const int32_t* positions, const float* conv_out,
              MambaSsdWorkspace ssd) {
  allow_successor();
  wait_for_predecessor();
  __shared__ __align__(16) float cs[kSlice * kPitch];  // [n, t]
  __shared__ __align__(16) float bs[kSlice * kPitch];  // [n, s]
  SsdBlock blk;
  if (!ssd_block(rows, positions, static_cast<int32_t>(blockIdx.y), &blk)) return;
  const int32_t group = static_cast<int32_t>(blockIdx.z);
  const int32_t n_state = shape.state_size;
  const int32_t conv_dim = shape.conv_dim();
  const float* tokens = conv_out + int64_t{blk.first} * conv_dim + shape.inner_size();
  const int32_t b_offset = group * n_state;
  const int32_t c_offset = (shape.groups_count + group) * n_state;
  const int32_t tx = threadIdx.x % 16, ty = threadIdx.x / 16;
  float acc[4][4] = {};
  for (int32_t n0 = 0; n0 < n_state; n0 += kSlice) {
    __syncthreads();  // the previous slice consumed
    for (int32_t e = threadIdx.x; e < kQ * kSlice; e += kThreads) {
      const int32_t t = e / kSlice, nn = e % kSlice, n = n0 + nn;
      const float* token = tokens + int64_t{t} * conv_dim;
      cs[nn * kPitch + t] = n < n_state ? token[c_offset + n] : 0.0f;
      bs[nn * kPitch + t] = n < n_state ? token[b_offset + n] : 0.0f;
    }
    __syncthreads();
    for (int32_t n = 0; n < kSlice; ++n) {
      outer_4x4(acc, cs + n * kPitch + 4 * ty, bs + n * kPitch + 4 * tx);
    }
  }
  float* cb = ssd.cb + (int64_t{blk.index} * shape.groups_count + group) * kQ * kQ;
#pragma unroll
  for (int32_t a = 0; a < 4; ++a) {
#pragma unroll
    for (int32_t b = 0; b < 4; ++b) cb[(4 * tx + b) * kQ + 4 * ty + a] = acc[a][b];
  }
}

// Kernel 3: the block's own state contribution for one head,
// H[p, n] = Σ_s (e^{R(s, Q−1)}·Δ_s·x_s[p]) · B_s[n] over s ascending, into ssd.states.
// grid (blocks, rows, heads).
__global__ void __launch_bounds__(kThreads)
ssd_block_state_kernel(MambaShape shape, MambaRows rows, const int32_t* positions,
                       const float* conv_out, MambaSsdWorkspace ssd) {
  allow_successor();
  wait_for_predecessor();
  __shared__ __align__(16) float xw[kQ * kTile];  // [s, p] decayed inputs
  __shared__ __align__(16) float bs[kQ * kTile];  // [s, n]
  __shared__ float weight[kQ];
  __shared__ float rates[kQ];
  SsdBlock blk;
  if (!ssd_block(rows, positions, static_cast<int32_t>(blockIdx.y), &blk)) return;
  const int32_t head = static_cast<int32_t>(blockIdx.z);
  const int32_t p_count = shape.head_dim, n_state = shape.state_size;
  const int32_t conv_dim = shape.conv_dim();
  const int64_t at = (int64_t{blk.index} * shape.heads_count + head) * kQ;
  if (threadIdx.x < kQ) rates[threadIdx.x] = ssd.rates[at + threadIdx.x];
  __syncthreads();
  if (threadIdx.x < kQ) {
    const int32_t s = static_cast<int32_t>(threadIdx.x);
    float rate = 0.0f;  // R(s, Q − 1), u ascending
    for (int32_t u = s + 1; u < kQ; ++u) rate += rates[u];
    weight[s] = ops::exp_f(rate) * ssd.steps[at + s];
  }
  const float* tokens = conv_out + int64_t{blk.first} * conv_dim;
  const int32_t x_offset = head * p_count;
  const int32_t b_offset = shape.inner_size() + group_of(shape, head) * n_state;
  float* out = ssd.states + (int64_t{blk.index} * shape.heads_count + head) * p_count * n_state;
  const int32_t tx = threadIdx.x % 16, ty = threadIdx.x / 16;
  for (int32_t p0 = 0; p0 < p_count; p0 += kTile) {
    __syncthreads();  // weight written; the previous tile's xw consumed
    for (int32_t e = threadIdx.x; e < kQ * kTile; e += kThreads) {
      const int32_t s = e / kTile, p = p0 + e % kTile;
      xw[e] = p < p_count ? weight[s] * tokens[int64_t{s} * conv_dim + x_offset + p] : 0.0f;
    }
    for (int32_t n0 = 0; n0 < n_state; n0 += kTile) {
      __syncthreads();  // xw written; the previous bs consumed
      load_token_tile(bs, tokens, conv_dim, b_offset, n0, n_state);
      __syncthreads();
      float acc[4][4] = {};
      for (int32_t s = 0; s < kQ; ++s) {
        outer_4x4(acc, xw + s * kTile + 4 * ty, bs + s * kTile + 4 * tx);
      }
#pragma unroll
      for (int32_t a = 0; a < 4; ++a) {
        const int32_t p = p0 + 4 * ty + a;
#pragma unroll
        for (int32_t b = 0; b < 4; ++b) {
          const int32_t n = n0 + 4 * tx + b;
          if (p < p_count && n < n_state) out[int64_t{p} * n_state + n] = acc[a][b];
        }
      }
    }
  }
}

// Kernel 4: the states through the row's blocks in ascending order, one state element a thread:
// from the slot's state (the head's sequential scan left it at the first block's start),
// h⁰_k is written over block k's contribution H_k and h ← h·e^{S_{Q−1}} + H_k; the slot keeps the
// last block's end state (the tail's sequential scan starts there). grid (elements, heads, rows).
__global__ void __launch_bounds__(kThreads)
ssd_state_pass_kernel(MambaShape shape, MambaStateView state, MambaRows rows,
                      const int32_t* positions, MambaSsdWorkspace ssd) {
  allow_successor();
  wait_for_predecessor();
  const MambaRowCut cut = cut_row(rows, positions, static_cast<int32_t>(blockIdx.z), true);
  const int64_t head_floats = int64_t{shape.head_dim} * shape.state_size;
  const int64_t e = int64_t{blockIdx.x} * kThreads + threadIdx.x;
  if (cut.blocks == 0 || e >= head_floats) return;
  const int32_t head = static_cast<int32_t>(blockIdx.y);
  float* stored = state.ssm + cut.slot * state.slot_stride_floats + head * head_floats + e;
  float h = *stored;
  // kPassGroup blocks' loads in flight before their stores (the pass itself stays in order).
  constexpr int32_t kPassGroup = 8;
  for (int32_t k0 = 0; k0 < cut.blocks; k0 += kPassGroup) {
    float contribution[kPassGroup];
    float decay[kPassGroup];
#pragma unroll
    for (int32_t i = 0; i < kPassGroup; ++i) {
      if (k0 + i >= cut.blocks) break;
      const int64_t at = int64_t{cut.block_index(k0 + i)} * shape.heads_count + head;
      contribution[i] = ssd.states[at * head_floats + e];
      decay[i] = ops::exp_f(ssd.sums[at * kQ + kQ - 1]);
    }
#pragma unroll
    for (int32_t i = 0; i < kPassGroup; ++i) {
      if (k0 + i >= cut.blocks) break;
      const int64_t at = int64_t{cut.block_index(k0 + i)} * shape.heads_count + head;
      ssd.states[at * head_floats + e] = h;
      h = fmaf(h, decay[i], contribution[i]);
    }
  }
  *stored = h;
}

// Kernel 5: the block's outputs for one head, y_t[p] = (intra + e^{S_t}·inter) + D·x_t[p], with
// intra = Σ_s L[t, s]·x_s[p] (L = C·Bᵀ ∘ e^{R(s, t)}·Δ_s on and below the diagonal, 0 above;
// R(s, t) summed as s descends from t) over s ascending and inter = Σ_n C_t[n]·h⁰[p, n] over n
// ascending. grid (blocks, rows, heads).
__global__ void __launch_bounds__(kThreads)
ssd_output_kernel(MambaShape shape, MambaLayerParams params, MambaRows rows,
                  const int32_t* positions, const float* conv_out, MambaSsdWorkspace ssd,
                  float* y) {
  allow_successor();
  wait_for_predecessor();
  __shared__ __align__(16) float mask[kQ * kQ];  // L, stored [s, t]
  __shared__ float start_decay[kQ];              // e^{S_t}
  __shared__ float steps[kQ];
  __shared__ float rates[kQ];
  // x [s, p] (kQ × kTile), then the slices C [n, t] and h⁰ [n, p] (kSlice × kPitch each).
  __shared__ __align__(16) float tile[2 * kSlice * kPitch];
  static_assert(kQ * kTile <= 2 * kSlice * kPitch, "x fits the tile");
  SsdBlock blk;
  if (!ssd_block(rows, positions, static_cast<int32_t>(blockIdx.y), &blk)) return;
  const int32_t head = static_cast<int32_t>(blockIdx.z);
  const int32_t group = group_of(shape, head);
  const int32_t p_count = shape.head_dim, n_state = shape.state_size;
  const int32_t conv_dim = shape.conv_dim(), inner = shape.inner_size();
  const int64_t at = (int64_t{blk.index} * shape.heads_count + head) * kQ;
  const float* cb = ssd.cb + (int64_t{blk.index} * shape.groups_count + group) * kQ * kQ;
  for (int32_t e = threadIdx.x; e < kQ * kQ; e += kThreads) mask[e] = cb[e];  // weighted below
  if (threadIdx.x < kQ) {
    steps[threadIdx.x] = ssd.steps[at + threadIdx.x];
    rates[threadIdx.x] = ssd.rates[at + threadIdx.x];
    start_decay[threadIdx.x] = ops::exp_f(ssd.sums[at + threadIdx.x]);
  }
  __syncthreads();
  if (threadIdx.x < kQ) {
    const int32_t t = static_cast<int32_t>(threadIdx.x);
    float rate = 0.0f;  // R(s, t)
    for (int32_t s = t; s >= 0; --s) {
      mask[s * kQ + t] = mask[s * kQ + t] * ops::exp_f(rate) * steps[s];
      rate += rates[s];
    }
    for (int32_t s = t + 1; s < kQ; ++s) mask[s * kQ + t] = 0.0f;
  }
  const float* tokens = conv_out + int64_t{blk.first} * conv_dim;
  const int32_t x_offset = head * p_count;
  const int32_t c_offset = inner + (shape.groups_count + group) * n_state;
  const float* start =
      ssd.states + (int64_t{blk.index} * shape.heads_count + head) * p_count * n_state;
  const float d_skip = params.d_skip[head];
  const int32_t tx = threadIdx.x % 16, ty = threadIdx.x / 16;
  float* cs = tile;
  float* hs = tile + kSlice * kPitch;
  for (int32_t p0 = 0; p0 < p_count; p0 += kTile) {
    __syncthreads();  // mask written; the previous tile's slices consumed
    load_token_tile(tile, tokens, conv_dim, x_offset, p0, p_count);
    __syncthreads();
    float intra[4][4] = {};
    for (int32_t s = 0; s < kQ; ++s) {
      outer_4x4(intra, mask + s * kQ + 4 * ty, tile + s * kTile + 4 * tx);
    }
    float x[4][4];
#pragma unroll
    for (int32_t a = 0; a < 4; ++a) {
      const float4 v = *reinterpret_cast<const float4*>(tile + (4 * ty + a) * kTile + 4 * tx);
      x[a][0] = v.x, x[a][1] = v.y, x[a][2] = v.z, x[a][3] = v.w;
    }
    float inter[4][4] = {};
    for (int32_t n0 = 0; n0 < n_state; n0 += kSlice) {
      __syncthreads();  // x (or the previous slices) consumed
      for (int32_t e = threadIdx.x; e < kQ * kSlice; e += kThreads) {
        const int32_t r = e / kSlice, nn = e % kSlice, n = n0 + nn, p = p0 + r;
        cs[nn * kPitch + r] = n < n_state ? tokens[int64_t{r} * conv_dim + c_offset + n] : 0.0f;
        hs[nn * kPitch + r] = n < n_state && p < p_count ? start[int64_t{p} * n_state + n] : 0.0f;
      }
      __syncthreads();
      for (int32_t n = 0; n < kSlice; ++n) {
        outer_4x4(inter, cs + n * kPitch + 4 * ty, hs + n * kPitch + 4 * tx);
      }
    }
#pragma unroll
    for (int32_t a = 0; a < 4; ++a) {
      const int32_t t = 4 * ty + a;
#pragma unroll
      for (int32_t b = 0; b < 4; ++b) {
        const int32_t p = p0 + 4 * tx + b;
        if (p < p_count) {
          y[int64_t{blk.first + t} * inner + x_offset + p] =
              ops::mamba_output(fmaf(start_decay[t], inter[a][b], intra[a][b]), x[a][b], d_skip);
        }
      }
    }
  }
}

}  // namespace

cudaError_t launch_mamba_ssd(const MambaShape& shape, const MambaLayerParams& params,
                             const MambaStateView& state, const MambaRows& rows,
                             const int32_t* positions, const float* proj, const float* conv_out,
                             const MambaSsdWorkspace& ssd, float* y, LaunchStream stream) {
  if (ssd.blocks < 1 || shape.heads_count > 65535 || shape.groups_count > 65535) {
    return cudaErrorInvalidValue;
  }
  const int32_t grid_rows = rows.rows_grid;
  cudaError_t status = launch_kernel(ssd_prepare_kernel, dim3(ssd.blocks, grid_rows),
                                     kPrepareThreads, 0, stream, shape, params, rows, positions,
                                     proj, ssd);
  if (status != cudaSuccess) return status;
  status = launch_kernel(ssd_cb_kernel, dim3(ssd.blocks, grid_rows, shape.groups_count), kThreads,
                         0, stream, shape, rows, positions, conv_out, ssd);
  if (status != cudaSuccess) return status;
  const dim3 per_head(ssd.blocks, grid_rows, shape.heads_count);
  status = launch_kernel(ssd_block_state_kernel, per_head, kThreads, 0, stream, shape, rows,
                         positions, conv_out, ssd);
  if (status != cudaSuccess) return status;
  const int64_t head_floats = int64_t{shape.head_dim} * shape.state_size;
  const dim3 pass_grid(static_cast<uint32_t>((head_floats + kThreads - 1) / kThreads),
                       shape.heads_count, grid_rows);
  status = launch_kernel(ssd_state_pass_kernel, pass_grid, kThreads, 0, stream, shape, state, rows,
                         positions, ssd);
  if (status != cudaSuccess) return status;
  return launch_kernel(ssd_output_kernel, per_head, kThreads, 0, stream, shape, params, rows,
                       positions, conv_out, ssd, y);
}

}  // namespace ls::kernels
