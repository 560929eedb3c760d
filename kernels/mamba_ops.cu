#include "kernels/mamba_ops.h"

#include "kernels/mamba_scan.h"

#include "core/ops/digest.h"
#include "core/ops/layer_math.h"
#include "core/ops/mamba_math.h"
#include "core/ops/verify_state.h"
#include "kernels/launch.cuh"
#include "kernels/mamba_conv.cuh"
#include "kernels/mamba_rows.cuh"
#include "kernels/reduce.cuh"
#include "kernels/storage.cuh"

namespace ls::kernels {

namespace {

constexpr int32_t kConvThreads = 128;
constexpr int32_t kNormThreads = 256;
constexpr int32_t kPoolThreads = 256;
constexpr int32_t kPoolBlocksMax = 4096;
constexpr int32_t kRowsGridMax = 65535;  // rows are the grids' y (conv) and z (scan) dimension

// The causal conv of one channel of one row: the window lives in registers while the row's
// tokens are walked in order (kernels/mamba_conv.cuh conv_step), then goes back to the slot — or,
// for a verified row, the window after each token to its verify slot. grid (channel blocks,
// rows_grid).
__global__ void __launch_bounds__(kConvThreads)
mamba_conv_kernel(MambaShape shape, MambaLayerParams params, MambaStateView state, MambaRows rows,
                  const float* proj, float* conv_out) {
  allow_successor();
  wait_for_predecessor();
  const int32_t conv_dim = shape.conv_dim();
  const int32_t c = static_cast<int32_t>(blockIdx.x * blockDim.x + threadIdx.x);
  const int32_t row = static_cast<int32_t>(blockIdx.y);
  const int32_t slot = rows.slots[row];
  if (c >= conv_dim || slot < 0) return;
  const int32_t k = shape.conv_kernel;
  const int32_t first = rows.token_offsets[row];
  const int32_t end = first + rows.token_counts[row];
  float* stored = conv_window_of(state, slot, c, k);
  float window[kMambaConvKernelMax];
  float taps[kMambaConvKernelMax];
#pragma unroll
  for (int32_t i = 0; i < kMambaConvKernelMax; ++i) {
    window[i] = i < k ? stored[i] : 0.0f;
    taps[i] = i < k ? params.conv_weight[int64_t{c} * k + i] : 0.0f;
  }
  const bool has_bias = params.conv_bias != nullptr;
  const float bias = has_bias ? params.conv_bias[c] : 0.0f;
  const int32_t xbc_offset = shape.inner_size();
  const int32_t verify_base = verify_base_of(rows, row);
  for (int32_t t = first; t < end; ++t) {
    const float input = proj[int64_t{t} * shape.in_proj_size() + xbc_offset + c];
    conv_out[int64_t{t} * conv_dim + c] = conv_step(window, taps, k, input, has_bias, bias);
    if (verify_base >= 0) store_verify_window(state, verify_base, t - first, c, window, k);
  }
  if (verify_base >= 0) return;  // the working slot waits for the commit
  store_window(stored, window, k);
}

// The gated RMSNorm of one token: g = y · silu(gate) (kept in y), then g · scale · weight with
// the block's fixed-order sum of squares. grid (tokens).
template <typename T>
__global__ void __launch_bounds__(kNormThreads)
mamba_gated_norm_kernel(MambaShape shape, const float* norm_weight, const float* proj, float* y,
                        T* out) {
  allow_successor();
  wait_for_predecessor();
  __shared__ float scratch[32];
  const int64_t t = blockIdx.x;
  const int32_t inner = shape.inner_size();
  const float* gate = proj + t * shape.in_proj_size();
  float* yt = y + t * inner;
  float sum = 0.0f;
  for (int32_t i = threadIdx.x; i < inner; i += blockDim.x) {
    const float g = yt[i] * ops::silu(gate[i]);
    yt[i] = g;  // read back below by this same thread
    sum += g * g;
  }
  const float scale = ops::rms_norm_scale(block_sum(sum, scratch), inner, shape.rms_eps);
  T* o = out + t * inner;
  for (int32_t i = threadIdx.x; i < inner; i += blockDim.x) {
    o[i] = from_float<T>(ops::rms_norm_element(yt[i], scale, norm_weight[i]));
  }
}

// The pool ops' entries, loaded once per block into shared memory with the padding (−1) left
// out, in list order: a block of a launch whose entries are all padding (a graph's idle rows)
// exits after reading the list.
__device__ int32_t load_pairs(const int32_t* pairs, int32_t pairs_grid, int2* kept) {
  __shared__ int32_t count;
  if (threadIdx.x == 0) {
    int32_t n = 0;
    for (int32_t p = 0; p < pairs_grid; ++p) {
      const int2 pair = make_int2(pairs[2 * p], pairs[2 * p + 1]);
      if (pair.x >= 0 && pair.y >= 0) kept[n++] = pair;
    }
    count = n;
  }
  __syncthreads();
  return count;
}

__device__ int32_t load_slots(const int32_t* slots, int32_t slots_grid, int32_t* kept) {
  __shared__ int32_t count;
  if (threadIdx.x == 0) {
    int32_t n = 0;
    for (int32_t s = 0; s < slots_grid; ++s) {
      if (slots[s] >= 0) kept[n++] = slots[s];
    }
    count = n;
  }
  __syncthreads();
  return count;
}

template <typename V>
__device__ __forceinline__ V zero_value();
template <>
__device__ __forceinline__ float zero_value<float>() {
  return 0.0f;
}
template <>
__device__ __forceinline__ float4 zero_value<float4>() {
  return make_float4(0.0f, 0.0f, 0.0f, 0.0f);
}

// Each thread owns elements e of a slot (V: float, or float4 when slots are whole float4s) and
// applies every entry to them in list order: element e of any slot is touched by its thread
// alone, so the result is the list applied in order.
template <typename V>
__global__ void __launch_bounds__(kPoolThreads)
mamba_copy_slots_kernel(V* pool, int64_t slot_vecs, const int32_t* pairs, int32_t pairs_grid) {
  allow_successor();
  wait_for_predecessor();
  extern __shared__ int2 kept_pairs[];
  const int32_t count = load_pairs(pairs, pairs_grid, kept_pairs);
  const int64_t stride = int64_t{gridDim.x} * blockDim.x;
  for (int64_t e = int64_t{blockIdx.x} * blockDim.x + threadIdx.x; e < slot_vecs; e += stride) {
    for (int32_t p = 0; p < count; ++p) {
      pool[kept_pairs[p].y * slot_vecs + e] = pool[kept_pairs[p].x * slot_vecs + e];
    }
  }
}

template <typename V>
__global__ void __launch_bounds__(kPoolThreads)
mamba_zero_slots_kernel(V* pool, int64_t slot_vecs, const int32_t* slots, int32_t slots_grid) {
  allow_successor();
  wait_for_predecessor();
  extern __shared__ int32_t kept_slots[];
  const int32_t count = load_slots(slots, slots_grid, kept_slots);
  const int64_t stride = int64_t{gridDim.x} * blockDim.x;
  for (int64_t e = int64_t{blockIdx.x} * blockDim.x + threadIdx.x; e < slot_vecs; e += stride) {
    for (int32_t s = 0; s < count; ++s) pool[kept_slots[s] * slot_vecs + e] = zero_value<V>();
  }
}

__global__ void mamba_snapshot_pairs_kernel(const int32_t* snapshots, int32_t snapshots_grid,
                                            const int32_t* pool_rows, const int32_t* vcl,
                                            int32_t page_size, int32_t* pairs,
                                            const int32_t* verify_base, const int32_t* vcl_before) {
  allow_successor();
  wait_for_predecessor();
  const int32_t i = static_cast<int32_t>(blockIdx.x * blockDim.x + threadIdx.x);
  if (i >= snapshots_grid) return;
  const int32_t row = snapshots[3 * i];
  const int32_t base = row >= 0 && verify_base != nullptr ? verify_base[row] : -1;
  int32_t src = -1;
  if (base >= 0) {  // the rule with a drafter: the first page boundary past old, if reached
    const int32_t old = vcl_before[row];
    const int32_t boundary = ops::next_page_boundary(old, page_size);
    if (boundary <= vcl[pool_rows[row]]) src = base + ops::mamba_verify_state_token(boundary - old);
  } else if (row >= 0 && vcl[pool_rows[row]] % page_size == 0) {
    src = snapshots[3 * i + 1];
  }
  pairs[2 * i] = src;
  pairs[2 * i + 1] = src >= 0 ? snapshots[3 * i + 2] : -1;
}

__global__ void mamba_verify_commit_pairs_kernel(const int32_t* slots, const int32_t* verify_base,
                                                 int32_t rows_grid, const int32_t* pool_rows,
                                                 const int32_t* vcl, const int32_t* vcl_before,
                                                 int32_t* pairs) {
  allow_successor();
  wait_for_predecessor();
  const int32_t r = static_cast<int32_t>(blockIdx.x * blockDim.x + threadIdx.x);
  if (r >= rows_grid) return;
  const int32_t base = verify_base[r];
  const int32_t accepted = base >= 0 ? vcl[pool_rows[r]] - vcl_before[r] : 0;
  const bool commit = base >= 0 && accepted >= 1 && slots[r] >= 0;
  pairs[2 * r] = commit ? base + ops::mamba_verify_state_token(accepted) : -1;
  pairs[2 * r + 1] = commit ? slots[r] : -1;
}

// The state digests' first stage: block (chunk, row) adds the lane terms of its chunk of the
// row's slot. Unsigned sums wrap mod 2^32, as the definition's do.
constexpr int32_t kDigestThreads = 256;
constexpr int64_t kDigestChunkFloatsMin = 16384;  // 64 floats a thread
constexpr int32_t kDigestChunksMax = 256;

__device__ __forceinline__ uint32_t block_sum_u32(uint32_t x, uint32_t* scratch) {
  for (int offset = 16; offset > 0; offset >>= 1) x += __shfl_xor_sync(0xffffffffu, x, offset);
  __syncthreads();
  if (threadIdx.x % 32 == 0) scratch[threadIdx.x / 32] = x;
  __syncthreads();
  uint32_t total = 0;
  for (int w = 0; w < kDigestThreads / 32; ++w) total += scratch[w];
  return total;
}

__global__ void __launch_bounds__(kDigestThreads)
mamba_digest_chunks_kernel(const float* pool, int64_t slot_floats, int64_t chunk_floats,
                           const int32_t* slots, uint32_t* partials) {
  allow_successor();
  wait_for_predecessor();
  __shared__ uint32_t scratch[2][kDigestThreads / 32];
  const int32_t row = blockIdx.y;
  const int32_t slot = slots[row];
  if (slot < 0) return;  // the whole block: no barrier is left half-reached
  const uint32_t* state = reinterpret_cast<const uint32_t*>(pool + slot * slot_floats);
  const int64_t begin = int64_t{blockIdx.x} * chunk_floats;
  const int64_t end = begin + chunk_floats < slot_floats ? begin + chunk_floats : slot_floats;
  uint32_t a = 0;
  uint32_t b = 0;
  for (int64_t e = begin + threadIdx.x; e < end; e += kDigestThreads) {
    const uint32_t bits = state[e];
    a += digest::lane_a(bits, static_cast<uint32_t>(e));
    b += digest::lane_b(bits, static_cast<uint32_t>(e));
  }
  a = block_sum_u32(a, scratch[0]);
  b = block_sum_u32(b, scratch[1]);
  if (threadIdx.x == 0) {
    uint32_t* out = partials + 2 * (int64_t{row} * gridDim.x + blockIdx.x);
    out[0] = a;
    out[1] = b;
  }
}

// The second stage: block r adds row r's chunk sums and finishes its digest.
__global__ void __launch_bounds__(kDigestThreads)
mamba_digest_finish_kernel(int64_t slot_floats, int32_t chunks, const int32_t* slots,
                           const uint32_t* partials, uint64_t* digests) {
  allow_successor();
  wait_for_predecessor();
  __shared__ uint32_t scratch[2][kDigestThreads / 32];
  const int32_t row = blockIdx.x;
  if (slots[row] < 0) return;
  uint32_t a = 0;
  uint32_t b = 0;
  for (int32_t c = threadIdx.x; c < chunks; c += kDigestThreads) {
    a += partials[2 * (int64_t{row} * chunks + c)];
    b += partials[2 * (int64_t{row} * chunks + c) + 1];
  }
  a = block_sum_u32(a, scratch[0]);
  b = block_sum_u32(b, scratch[1]);
  if (threadIdx.x == 0) digests[row] = digest::finish(a, b, static_cast<uint32_t>(slot_floats));
}

// Chunks of a slot: one block per 16384 floats, at most 256 (larger chunks past that).
int32_t digest_chunks(int64_t slot_floats) {
  const int64_t chunks = (slot_floats + kDigestChunkFloatsMin - 1) / kDigestChunkFloatsMin;
  return static_cast<int32_t>(chunks < kDigestChunksMax ? chunks : kDigestChunksMax);
}

bool valid_shape(const MambaShape& s) {
  return s.heads_count >= 1 && s.head_dim >= 1 && s.groups_count >= 1 &&
         s.heads_count % s.groups_count == 0 && s.state_size >= 1 &&
         s.state_size <= kMambaStateSizeMax && s.conv_kernel >= 1 &&
         s.conv_kernel <= kMambaConvKernelMax && s.rms_eps > 0.0f && s.dt_min <= s.dt_max;
}

bool valid_params(const MambaLayerParams& p) {
  return p.conv_weight != nullptr && p.dt_bias != nullptr && p.a_log != nullptr &&
         p.d_skip != nullptr && p.norm_weight != nullptr;
}

// The state view holds a slot's conv window and SSM state without overlapping another slot's.
bool valid_state(const MambaShape& s, const MambaStateView& v) {
  return v.conv != nullptr && v.ssm != nullptr &&
         v.slot_stride_floats >= s.conv_state_floats() &&
         v.slot_stride_floats >= s.ssm_state_floats();
}

int32_t pool_blocks(int64_t slot_vecs) {
  const int64_t blocks = (slot_vecs + kPoolThreads - 1) / kPoolThreads;
  return static_cast<int32_t>(blocks < kPoolBlocksMax ? blocks : kPoolBlocksMax);
}

// Whole float4s when every slot starts 16-byte aligned.
bool pool_in_float4s(const float* pool, int64_t slot_floats) {
  return slot_floats % 4 == 0 && reinterpret_cast<uintptr_t>(pool) % 16 == 0;
}

}  // namespace

size_t mamba_workspace_floats(const MambaShape& shape, int32_t tokens_count) {
  return static_cast<size_t>(tokens_count) *
         (static_cast<size_t>(shape.conv_dim()) + static_cast<size_t>(shape.inner_size()));
}

cudaError_t check_mamba_mixer(const MambaShape& shape, const MambaLayerParams& params,
                              const MambaStateView& state, const MambaRows& rows,
                              const float* proj, int32_t tokens_count, const float* workspace,
                              size_t workspace_floats, size_t needed_floats, const void* out) {
  if (!valid_shape(shape) || !valid_params(params) || !valid_state(shape, state)) {
    return cudaErrorInvalidValue;
  }
  if (rows.rows_grid < 0 || rows.rows_grid > kRowsGridMax || tokens_count < 0) {
    return cudaErrorInvalidValue;
  }
  if (rows.rows_grid > 0 &&
      (rows.token_offsets == nullptr || rows.token_counts == nullptr || rows.slots == nullptr)) {
    return cudaErrorInvalidValue;
  }
  if (tokens_count == 0) return cudaSuccess;  // no row has a token
  if (rows.rows_grid == 0 || proj == nullptr || out == nullptr || workspace == nullptr ||
      workspace_floats < needed_floats) {
    return cudaErrorInvalidValue;
  }
  return cudaSuccess;
}

template <typename T>
cudaError_t launch_mamba_gated_norm(const MambaShape& shape, const float* norm_weight,
                                    const float* proj, float* y, int32_t tokens_count, T* out,
                                    LaunchStream stream) {
  return launch_kernel(mamba_gated_norm_kernel<T>, tokens_count, kNormThreads, 0, stream, shape,
                       norm_weight, proj, y, out);
}

template cudaError_t launch_mamba_gated_norm<__nv_bfloat16>(const MambaShape&, const float*,
                                                            const float*, float*, int32_t,
                                                            __nv_bfloat16*, LaunchStream);
template cudaError_t launch_mamba_gated_norm<float>(const MambaShape&, const float*, const float*,
                                                    float*, int32_t, float*, LaunchStream);

template <typename T>
cudaError_t launch_mamba_mixer(const MambaShape& shape, const MambaLayerParams& params,
                               const MambaStateView& state, const MambaRows& rows,
                               const float* proj, int32_t tokens_count, float* workspace,
                               size_t workspace_floats, T* out, LaunchStream stream) {
  cudaError_t status = check_mamba_mixer(shape, params, state, rows, proj, tokens_count, workspace,
                                         workspace_floats,
                                         mamba_workspace_floats(shape, tokens_count), out);
  if (status != cudaSuccess || tokens_count == 0) return status;
  float* conv_out = workspace;
  float* y = workspace + static_cast<size_t>(tokens_count) * shape.conv_dim();
  const dim3 conv_grid((shape.conv_dim() + kConvThreads - 1) / kConvThreads, rows.rows_grid);
  status = launch_kernel(mamba_conv_kernel, conv_grid, kConvThreads, 0, stream, shape, params,
                         state, rows, proj, conv_out);
  if (status != cudaSuccess) return status;
  status = launch_mamba_scan_rows(shape, params, state, rows, nullptr, MambaScanSpan::kWhole,
                                  proj, static_cast<const float*>(conv_out), y, stream);
  if (status != cudaSuccess) return status;
  return launch_mamba_gated_norm(shape, params.norm_weight, proj, y, tokens_count, out, stream);
}

template cudaError_t launch_mamba_mixer<__nv_bfloat16>(const MambaShape&, const MambaLayerParams&,
                                              const MambaStateView&, const MambaRows&,
                                              const float*, int32_t, float*, size_t, __nv_bfloat16*,
                                              LaunchStream);
template cudaError_t launch_mamba_mixer<float>(const MambaShape&, const MambaLayerParams&,
                                               const MambaStateView&, const MambaRows&,
                                               const float*, int32_t, float*, size_t, float*,
                                               LaunchStream);

cudaError_t launch_mamba_copy_slots(float* pool, int64_t slot_floats, const int32_t* pairs,
                                    int32_t pairs_grid, LaunchStream stream) {
  if (slot_floats < 1 || pairs_grid < 0 || pairs_grid > kMambaPoolOpsMax || pool == nullptr) {
    return cudaErrorInvalidValue;
  }
  if (pairs_grid == 0) return cudaSuccess;
  if (pairs == nullptr) return cudaErrorInvalidValue;
  const size_t shared = sizeof(int2) * static_cast<size_t>(pairs_grid);
  if (pool_in_float4s(pool, slot_floats)) {
    const int64_t vecs = slot_floats / 4;
    return launch_kernel(mamba_copy_slots_kernel<float4>, pool_blocks(vecs), kPoolThreads, shared,
                         stream, reinterpret_cast<float4*>(pool), vecs, pairs, pairs_grid);
  }
  return launch_kernel(mamba_copy_slots_kernel<float>, pool_blocks(slot_floats), kPoolThreads,
                       shared, stream, pool, slot_floats, pairs, pairs_grid);
}

cudaError_t launch_mamba_snapshot_pairs(const int32_t* snapshots, int32_t snapshots_grid,
                                        const int32_t* pool_rows, const int32_t* vcl,
                                        int32_t page_size, int32_t* pairs, LaunchStream stream,
                                        const int32_t* verify_base, const int32_t* vcl_before) {
  if (snapshots_grid < 0 || page_size < 1) return cudaErrorInvalidValue;
  if ((verify_base == nullptr) != (vcl_before == nullptr)) return cudaErrorInvalidValue;
  if (snapshots_grid == 0) return cudaSuccess;
  if (snapshots == nullptr || pool_rows == nullptr || vcl == nullptr || pairs == nullptr) {
    return cudaErrorInvalidValue;
  }
  const int32_t blocks = (snapshots_grid + kPoolThreads - 1) / kPoolThreads;
  return launch_kernel(mamba_snapshot_pairs_kernel, blocks, kPoolThreads, 0, stream, snapshots,
                       snapshots_grid, pool_rows, vcl, page_size, pairs, verify_base, vcl_before);
}

cudaError_t launch_mamba_verify_commit_pairs(const int32_t* slots, const int32_t* verify_base,
                                             int32_t rows_grid, const int32_t* pool_rows,
                                             const int32_t* vcl, const int32_t* vcl_before,
                                             int32_t* pairs, LaunchStream stream) {
  if (rows_grid < 0 || rows_grid > kMambaPoolOpsMax) return cudaErrorInvalidValue;
  if (rows_grid == 0) return cudaSuccess;
  if (slots == nullptr || verify_base == nullptr || pool_rows == nullptr || vcl == nullptr ||
      vcl_before == nullptr || pairs == nullptr) {
    return cudaErrorInvalidValue;
  }
  const int32_t blocks = (rows_grid + kPoolThreads - 1) / kPoolThreads;
  return launch_kernel(mamba_verify_commit_pairs_kernel, blocks, kPoolThreads, 0, stream, slots,
                       verify_base, rows_grid, pool_rows, vcl, vcl_before, pairs);
}

cudaError_t launch_mamba_zero_slots(float* pool, int64_t slot_floats, const int32_t* slots,
                                    int32_t slots_grid, LaunchStream stream) {
  if (slot_floats < 1 || slots_grid < 0 || slots_grid > kMambaPoolOpsMax || pool == nullptr) {
    return cudaErrorInvalidValue;
  }
  if (slots_grid == 0) return cudaSuccess;
  if (slots == nullptr) return cudaErrorInvalidValue;
  const size_t shared = sizeof(int32_t) * static_cast<size_t>(slots_grid);
  if (pool_in_float4s(pool, slot_floats)) {
    const int64_t vecs = slot_floats / 4;
    return launch_kernel(mamba_zero_slots_kernel<float4>, pool_blocks(vecs), kPoolThreads, shared,
                         stream, reinterpret_cast<float4*>(pool), vecs, slots, slots_grid);
  }
  return launch_kernel(mamba_zero_slots_kernel<float>, pool_blocks(slot_floats), kPoolThreads,
                       shared, stream, pool, slot_floats, slots, slots_grid);
}

size_t mamba_digest_workspace_words(int64_t slot_floats, int32_t rows_grid) {
  if (slot_floats < 1 || rows_grid < 1) return 0;
  return 2 * static_cast<size_t>(digest_chunks(slot_floats)) * static_cast<size_t>(rows_grid);
}

cudaError_t launch_mamba_state_digests(const float* pool, int64_t slot_floats,
                                       const int32_t* slots, int32_t rows_grid,
                                       uint32_t* workspace, size_t workspace_words,
                                       uint64_t* digests, LaunchStream stream) {
  if (slot_floats < 1 || slot_floats > int64_t{UINT32_MAX} || rows_grid < 0 ||
      rows_grid > kMambaPoolOpsMax || pool == nullptr) {
    return cudaErrorInvalidValue;
  }
  if (rows_grid == 0) return cudaSuccess;
  if (slots == nullptr || digests == nullptr || workspace == nullptr ||
      workspace_words < mamba_digest_workspace_words(slot_floats, rows_grid)) {
    return cudaErrorInvalidValue;
  }
  const int32_t chunks = digest_chunks(slot_floats);
  const int64_t chunk_floats = (slot_floats + chunks - 1) / chunks;
  const cudaError_t status =
      launch_kernel(mamba_digest_chunks_kernel, dim3(chunks, rows_grid), kDigestThreads, 0, stream,
                    pool, slot_floats, chunk_floats, slots, workspace);
  if (status != cudaSuccess) return status;
  return launch_kernel(mamba_digest_finish_kernel, rows_grid, kDigestThreads, 0, stream,
                       slot_floats, chunks, slots, static_cast<const uint32_t*>(workspace),
                       digests);
}

}  // namespace ls::kernels
