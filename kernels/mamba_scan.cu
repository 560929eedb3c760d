#include "kernels/mamba_scan.h"

#include "core/ops/layer_math.h"
#include "core/ops/mamba_math.h"
#include "kernels/launch.cuh"
#include "kernels/mamba_conv.cuh"
#include "kernels/mamba_rows.cuh"
#include "kernels/reduce.cuh"

namespace ls::kernels {

namespace {

constexpr int32_t kScanWarps = 4;
// State rows (head elements p) per warp: their loads are all in flight at once, and the token's
// B, C, step and decay are loaded and computed once for all of them.
constexpr int32_t kScanRowsPerWarp = 8;
constexpr int32_t kScanRowsPerBlock = kScanWarps * kScanRowsPerWarp;
constexpr int32_t kConvThreads = 128;
constexpr int32_t kConvTokens = 64;      // tokens per block of the chunked launch's conv
constexpr int32_t kGridYZMax = 65535;

// The sequential scan: warp w of block (head, y, row) owns the state rows
// p = (y · kScanWarps + w) · kScanRowsPerWarp + r of `head`, r < kScanRowsPerWarp; lane l holds
// their elements n = l, l + 32, ... (kLanes of them: state_size <= 32 · kLanes) in registers while
// the span's tokens are walked in order. Per token and state row, every lane updates its elements
// and sums their products with C in ascending n, the butterfly combines the lanes (one order for a
// given state size, the one the CPU comparison's tolerance covers), and lane 0 writes
// y = C·h + D·x. A state row's arithmetic does not depend on how many rows a warp owns, so
// decode and prefill, and every span, give it the same bits.
template <int32_t kLanes>
__global__ void __launch_bounds__(kScanWarps * 32)
mamba_scan_rows_kernel(MambaShape shape, MambaLayerParams params, MambaStateView state,
                       MambaRows rows, const int32_t* positions, MambaScanSpan span,
                       const float* proj, const float* conv_out, float* y) {
  allow_successor();
  wait_for_predecessor();
  const int32_t head = static_cast<int32_t>(blockIdx.x);
  const int32_t lane = static_cast<int32_t>(threadIdx.x) % 32;
  const int32_t p0 = static_cast<int32_t>(blockIdx.y) * kScanRowsPerBlock +
                     static_cast<int32_t>(threadIdx.x) / 32 * kScanRowsPerWarp;
  if (p0 >= shape.head_dim) return;  // a whole warp: nothing below synchronises the block
  const MambaRowCut cut = cut_row(rows, positions, static_cast<int32_t>(blockIdx.z),
                                  span != MambaScanSpan::kWhole);
  const int32_t begin = span == MambaScanSpan::kTail ? cut.tail_begin() : cut.first;
  const int32_t end = span == MambaScanSpan::kHead ? cut.head_end : cut.end;
  const int32_t inner = shape.inner_size();
  const int32_t owned = min(kScanRowsPerWarp, shape.head_dim - p0);
  const int32_t i0 = head * shape.head_dim + p0;  // the first owned element of inner
  if (cut.slot < 0) {
    if (span == MambaScanSpan::kTail) return;
    for (int32_t t = begin + lane; t < end; t += 32) {
      for (int32_t r = 0; r < owned; ++r) y[int64_t{t} * inner + i0 + r] = 0.0f;
    }
    return;
  }
  if (begin >= end) return;
  const int32_t n_state = shape.state_size;
  const int32_t conv_dim = shape.conv_dim();
  const int32_t group = head / (shape.heads_count / shape.groups_count);
  float* stored = state.ssm + cut.slot * state.slot_stride_floats + int64_t{i0} * n_state;
  float h[kScanRowsPerWarp][kLanes];
#pragma unroll
  for (int32_t r = 0; r < kScanRowsPerWarp; ++r) {
#pragma unroll
    for (int32_t j = 0; j < kLanes; ++j) {
      const int32_t n = lane + 32 * j;
      h[r][j] = r < owned && n < n_state ? stored[r * n_state + n] : 0.0f;
    }
  }
  const float dt_bias = params.dt_bias[head];
  const float a_log = params.a_log[head];
  const float d_skip = params.d_skip[head];
  const int32_t dt_offset = inner + conv_dim + head;
  // A verified decode row (MambaRows::verify_base): the state after each verify token into its
  // verify slot, the working slot left for the commit. The chunked launch cuts no block from
  // such a row (cut_row), so its kHead span is the whole row, as in the sequential launch.
  const int32_t verify_base = verify_base_of(rows, static_cast<int32_t>(blockIdx.z));
  for (int32_t t = begin; t < end; ++t) {
    const float* token = conv_out + int64_t{t} * conv_dim;
    const float* b = token + inner + group * n_state;
    const float* c = token + inner + (shape.groups_count + group) * n_state;
    float bn[kLanes];
    float cn[kLanes];
#pragma unroll
    for (int32_t j = 0; j < kLanes; ++j) {
      const int32_t n = lane + 32 * j;
      bn[j] = n < n_state ? b[n] : 0.0f;
      cn[j] = n < n_state ? c[n] : 0.0f;
    }
    const float step = ops::mamba_step_size(proj[int64_t{t} * shape.in_proj_size() + dt_offset],
                                            dt_bias, shape.dt_min, shape.dt_max);
    const float decay = ops::mamba_decay(step, a_log);
#pragma unroll
    for (int32_t r = 0; r < kScanRowsPerWarp; ++r) {
      if (r >= owned) break;  // warp-uniform
      const float x = token[i0 + r];
      float partial = 0.0f;
#pragma unroll
      for (int32_t j = 0; j < kLanes; ++j) {
        if (lane + 32 * j < n_state) {
          h[r][j] = ops::mamba_state_update(h[r][j], decay, step, bn[j], x);
          partial += h[r][j] * cn[j];
        }
      }
      const float c_dot_h = warp_sum(partial);
      if (lane == 0) y[int64_t{t} * inner + i0 + r] = ops::mamba_output(c_dot_h, x, d_skip);
    }
    if (verify_base >= 0) {  // the state rows after verify token t − first
      float* after = state.ssm + (verify_base + (t - cut.first)) * state.slot_stride_floats +
                     int64_t{i0} * n_state;
#pragma unroll
      for (int32_t r = 0; r < kScanRowsPerWarp; ++r) {
#pragma unroll
        for (int32_t j = 0; j < kLanes; ++j) {
          const int32_t n = lane + 32 * j;
          if (r < owned && n < n_state) after[r * n_state + n] = h[r][j];
        }
      }
    }
  }
  if (verify_base >= 0) return;  // the working slot waits for the commit
#pragma unroll
  for (int32_t r = 0; r < kScanRowsPerWarp; ++r) {
#pragma unroll
    for (int32_t j = 0; j < kLanes; ++j) {
      const int32_t n = lane + 32 * j;
      if (r < owned && n < n_state) stored[r * n_state + n] = h[r][j];
    }
  }
}

// Input j of channel c of a row (j relative to the row's first token): the token's xBC for
// j >= 0, else the slot's stored window (oldest first), whose last entry is j = −1.
__device__ __forceinline__ float conv_input(const MambaShape& shape, const float* proj,
                                            const float* stored, int32_t first, int32_t c,
                                            int32_t j) {
  return j >= 0 ? proj[int64_t{first + j} * shape.in_proj_size() + shape.inner_size() + c]
                : stored[shape.conv_kernel + j];
}

// The causal conv of the chunked launch, parallel over tokens: block (channels, tile, row) walks
// the tile's kConvTokens tokens of the row with a register window started from the inputs just
// before the tile — each token through the sequential conv's step (kernels/mamba_conv.cuh), so
// the same bits; a verified row's window after each token goes to its verify slot, as the
// sequential conv's does. The working slot's window is only read here;
// mamba_conv_window_kernel writes it once every tile has read it.
__global__ void __launch_bounds__(kConvThreads)
mamba_conv_tokens_kernel(MambaShape shape, MambaLayerParams params, MambaStateView state,
                         MambaRows rows, const float* proj, float* conv_out) {
  allow_successor();
  wait_for_predecessor();
  const int32_t conv_dim = shape.conv_dim();
  const int32_t c = static_cast<int32_t>(blockIdx.x * blockDim.x + threadIdx.x);
  const int32_t row = static_cast<int32_t>(blockIdx.z);
  const int32_t slot = rows.slots[row];
  const int32_t count = rows.token_counts[row];
  const int32_t begin = static_cast<int32_t>(blockIdx.y) * kConvTokens;
  if (c >= conv_dim || slot < 0 || begin >= count) return;
  const int32_t stop = min(count, begin + kConvTokens);
  const int32_t first = rows.token_offsets[row];
  const int32_t k = shape.conv_kernel;
  const float* stored = conv_window_of(state, slot, c, k);
  float window[kMambaConvKernelMax];
  float taps[kMambaConvKernelMax];
#pragma unroll
  for (int32_t i = 0; i < kMambaConvKernelMax; ++i) {
    window[i] = i < k ? conv_input(shape, proj, stored, first, c, begin - k + i) : 0.0f;
    taps[i] = i < k ? params.conv_weight[int64_t{c} * k + i] : 0.0f;
  }
  const bool has_bias = params.conv_bias != nullptr;
  const float bias = has_bias ? params.conv_bias[c] : 0.0f;
  const int32_t verify_base = verify_base_of(rows, row);
  for (int32_t j = begin; j < stop; ++j) {
    const float input = conv_input(shape, proj, stored, first, c, j);
    conv_out[int64_t{first + j} * conv_dim + c] =
        conv_step(window, taps, k, input, has_bias, bias);
    if (verify_base >= 0) store_verify_window(state, verify_base, j, c, window, k);
  }
}

// The slot's window after the row: its last conv_kernel inputs (the old window's newest entries
// when the row has fewer tokens); a verified row's working slot waits for the commit.
// grid (channel blocks, rows).
__global__ void __launch_bounds__(kConvThreads)
mamba_conv_window_kernel(MambaShape shape, MambaStateView state, MambaRows rows,
                         const float* proj) {
  allow_successor();
  wait_for_predecessor();
  const int32_t c = static_cast<int32_t>(blockIdx.x * blockDim.x + threadIdx.x);
  const int32_t row = static_cast<int32_t>(blockIdx.y);
  const int32_t slot = rows.slots[row];
  const int32_t count = rows.token_counts[row];
  if (c >= shape.conv_dim() || slot < 0 || count == 0 || verify_base_of(rows, row) >= 0) return;
  const int32_t k = shape.conv_kernel;
  float* stored = conv_window_of(state, slot, c, k);
  float next[kMambaConvKernelMax];
#pragma unroll
  for (int32_t i = 0; i < kMambaConvKernelMax; ++i) {
    if (i < k) next[i] = conv_input(shape, proj, stored, rows.token_offsets[row], c, count - k + i);
  }
  store_window(stored, next, k);
}

template <int32_t kLanes>
cudaError_t launch_scan_rows(const MambaShape& shape, const MambaLayerParams& params,
                             const MambaStateView& state, const MambaRows& rows,
                             const int32_t* positions, MambaScanSpan span, const float* proj,
                             const float* conv_out, float* y, LaunchStream stream) {
  const dim3 grid(shape.heads_count,
                  (shape.head_dim + kScanRowsPerBlock - 1) / kScanRowsPerBlock, rows.rows_grid);
  return launch_kernel(mamba_scan_rows_kernel<kLanes>, grid, kScanWarps * 32, 0, stream, shape,
                       params, state, rows, positions, span, proj, conv_out, y);
}

MambaSsdWorkspace ssd_workspace(const MambaShape& s, int32_t tokens_count, float* base) {
  MambaSsdWorkspace w;
  w.blocks = tokens_count / kMambaScanChunk;
  const size_t blocks = static_cast<size_t>(w.blocks);
  const size_t heads = static_cast<size_t>(s.heads_count);
  w.states = base;
  w.steps = w.states + blocks * static_cast<size_t>(s.ssm_state_floats());
  w.rates = w.steps + blocks * heads * kMambaScanChunk;
  w.sums = w.rates + blocks * heads * kMambaScanChunk;
  w.cb = w.sums + blocks * heads * kMambaScanChunk;
  return w;
}

}  // namespace

cudaError_t launch_mamba_scan_rows(const MambaShape& shape, const MambaLayerParams& params,
                                   const MambaStateView& state, const MambaRows& rows,
                                   const int32_t* positions, MambaScanSpan span, const float* proj,
                                   const float* conv_out, float* y, LaunchStream stream) {
  if (shape.state_size <= 32) {
    return launch_scan_rows<1>(shape, params, state, rows, positions, span, proj, conv_out, y,
                               stream);
  }
  if (shape.state_size <= 64) {
    return launch_scan_rows<2>(shape, params, state, rows, positions, span, proj, conv_out, y,
                               stream);
  }
  if (shape.state_size <= 128) {
    return launch_scan_rows<4>(shape, params, state, rows, positions, span, proj, conv_out, y,
                               stream);
  }
  static_assert(kMambaStateSizeMax == 32 * 8, "eight state elements a lane at most");
  return launch_scan_rows<8>(shape, params, state, rows, positions, span, proj, conv_out, y,
                             stream);
}

size_t mamba_chunked_workspace_floats(const MambaShape& shape, int32_t tokens_count) {
  const size_t blocks = static_cast<size_t>(tokens_count / kMambaScanChunk);
  const size_t per_block = static_cast<size_t>(shape.ssm_state_floats()) +
                           3 * static_cast<size_t>(shape.heads_count) * kMambaScanChunk +
                           static_cast<size_t>(shape.groups_count) * kMambaScanChunk *
                               kMambaScanChunk;
  return mamba_workspace_floats(shape, tokens_count) + blocks * per_block;
}

template <typename T>
cudaError_t launch_mamba_mixer_chunked(const MambaShape& shape, const MambaLayerParams& params,
                                       const MambaStateView& state, const MambaRows& rows,
                                       const int32_t* positions, const float* proj,
                                       int32_t tokens_count, float* workspace,
                                       size_t workspace_floats, T* out, LaunchStream stream) {
  cudaError_t status =
      check_mamba_mixer(shape, params, state, rows, proj, tokens_count, workspace,
                        workspace_floats, mamba_chunked_workspace_floats(shape, tokens_count),
                        out);
  if (status != cudaSuccess || tokens_count == 0) return status;
  const int32_t tiles = (tokens_count + kConvTokens - 1) / kConvTokens;
  if (positions == nullptr || tiles > kGridYZMax) return cudaErrorInvalidValue;
  float* conv_out = workspace;
  float* y = conv_out + static_cast<size_t>(tokens_count) * shape.conv_dim();
  const MambaSsdWorkspace ssd = ssd_workspace(
      shape, tokens_count, y + static_cast<size_t>(tokens_count) * shape.inner_size());
  const int32_t channel_blocks = (shape.conv_dim() + kConvThreads - 1) / kConvThreads;
  status = launch_kernel(mamba_conv_tokens_kernel, dim3(channel_blocks, tiles, rows.rows_grid),
                         kConvThreads, 0, stream, shape, params, state, rows, proj, conv_out);
  if (status != cudaSuccess) return status;
  status = launch_kernel(mamba_conv_window_kernel, dim3(channel_blocks, rows.rows_grid),
                         kConvThreads, 0, stream, shape, state, rows, proj);
  if (status != cudaSuccess) return status;
  const float* conv = conv_out;
  status = launch_mamba_scan_rows(shape, params, state, rows, positions, MambaScanSpan::kHead,
                                  proj, conv, y, stream);
  if (status != cudaSuccess) return status;
  if (ssd.blocks > 0) {
    status = launch_mamba_ssd(shape, params, state, rows, positions, proj, conv, ssd, y, stream);
    if (status != cudaSuccess) return status;
    status = launch_mamba_scan_rows(shape, params, state, rows, positions, MambaScanSpan::kTail,
                                    proj, conv, y, stream);
    if (status != cudaSuccess) return status;
  }
  return launch_mamba_gated_norm(shape, params.norm_weight, proj, y, tokens_count, out, stream);
}

template cudaError_t launch_mamba_mixer_chunked<__nv_bfloat16>(
    const MambaShape&, const MambaLayerParams&, const MambaStateView&, const MambaRows&,
    const int32_t*, const float*, int32_t, float*, size_t, __nv_bfloat16*, LaunchStream);
template cudaError_t launch_mamba_mixer_chunked<float>(const MambaShape&, const MambaLayerParams&,
                                                       const MambaStateView&, const MambaRows&,
                                                       const int32_t*, const float*, int32_t,
                                                       float*, size_t, float*, LaunchStream);

}  // namespace ls::kernels
