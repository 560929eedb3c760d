#include "kernels/layer_ops.h"

#include "core/ops/layer_math.h"
#include "kernels/launch.cuh"
#include "kernels/reduce.cuh"
#include "kernels/rms_norm.cuh"
#include "kernels/step_layout.h"
#include "kernels/storage.cuh"

namespace ls::kernels {

namespace {

template <typename T>
__global__ void embedding_kernel(const T* table, const int32_t* ids, int32_t hidden, float* out) {
  allow_successor();
  wait_for_predecessor();
  const int32_t t = blockIdx.x;
  const T* row = table + int64_t{ids[t]} * hidden;
  float* o = out + int64_t{t} * hidden;
  for (int32_t i = threadIdx.x; i < hidden; i += blockDim.x) o[i] = to_float(row[i]);
}

template <typename T>
__global__ void rms_norm_kernel(const float* x, const int32_t* row_index, int32_t n,
                                const float* weight, float eps, T* out) {
  allow_successor();
  wait_for_predecessor();
  __shared__ float scratch[32];
  const int32_t r = blockIdx.x;
  const int64_t source = row_index ? row_index[r] : r;
  const float* xr = x + source * n;
  float sum = 0.0f;
  for (int32_t i = threadIdx.x; i < n; i += blockDim.x) sum += xr[i] * xr[i];
  const float scale = ops::rms_norm_scale(block_sum(sum, scratch), n, eps);
  T* o = out + int64_t{r} * n;
  for (int32_t i = threadIdx.x; i < n; i += blockDim.x) {
    o[i] = from_float<T>(ops::rms_norm_element(xr[i], scale, weight[i]));
  }
}

// The vectorised form for rows of norm_vectorised(n) (kernels/rms_norm.cuh, whose order of the
// sum of squares the decode GEMV's folded norm repeats): one block of kNormThreads per row; each
// thread loads its float4s of the row and of the weight at once (every load in flight together,
// the row held in registers), sums their squares in that order, then the block sum;
// out[i] = (x[i] · scale) · weight[i] as in the scalar kernel.

template <typename T>
__global__ void __launch_bounds__(kNormThreads)
rms_norm_vec_kernel(const float* x, const int32_t* row_index, int32_t n, const float* weight,
                    float eps, T* out) {
  allow_successor();
  wait_for_predecessor();
  __shared__ float scratch[32];
  const int32_t r = blockIdx.x;
  const int64_t source = row_index ? row_index[r] : r;
  const float4* xr = reinterpret_cast<const float4*>(x + source * n);
  const float4* wr = reinterpret_cast<const float4*>(weight);
  const int32_t vecs = n / 4;
  float4 v[kNormVecMax];
  float4 w[kNormVecMax];
#pragma unroll
  for (int32_t k = 0; k < kNormVecMax; ++k) {
    const int32_t i = static_cast<int32_t>(threadIdx.x) + k * kNormThreads;
    if (i < vecs) v[k] = xr[i], w[k] = __ldg(wr + i);
  }
  const float sum = norm_thread_squares(v, static_cast<int32_t>(threadIdx.x), vecs);
  const float scale = ops::rms_norm_scale(block_sum(sum, scratch), n, eps);
  T* o = out + int64_t{r} * n;
#pragma unroll
  for (int32_t k = 0; k < kNormVecMax; ++k) {
    const int32_t i = static_cast<int32_t>(threadIdx.x) + k * kNormThreads;
    if (i < vecs) store_normalised4(o + 4 * i, v[k], scale, w[k]);
  }
}

// Where launch_rope_qkv's kernels write: Q (fp32) and the K/V caches.
template <typename T>
struct RopeQkvArgs {
  const int32_t* positions;
  const int64_t* slots;
  int32_t query_heads, kv_heads, head_dim, rotary_dim;
  const float* cos_table;
  const float* sin_table;
  int32_t positions_count;
  float* q_out;
  T* k_cache;
  T* v_cache;
};

// Token t's qkv row rotated and written (the block's threads share the row's pairs).
template <typename T>
__device__ void rope_qkv_row(const float* qkv, int32_t t, const RopeQkvArgs<T>& a) {
  const int32_t half = a.rotary_dim / 2;
  const int32_t pass = a.head_dim - a.rotary_dim;  // dims past the rotated ones, copied as is
  const int32_t q_size = a.query_heads * a.head_dim;
  const int32_t kv_size = a.kv_heads * a.head_dim;
  const float* row = qkv + int64_t{t} * (q_size + 2 * kv_size);
  const int32_t position = min(a.positions[t], a.positions_count - 1);
  const float* c = a.cos_table + int64_t{position} * half;
  const float* s = a.sin_table + int64_t{position} * half;
  const int64_t slot = a.slots[t];
  const int32_t pairs = (a.query_heads + a.kv_heads) * half;
#pragma unroll 4
  for (int32_t idx = threadIdx.x; idx < pairs; idx += blockDim.x) {
    const int32_t head = idx / half;
    const int32_t i = idx % half;
    const float x1 = row[head * a.head_dim + i];
    const float x2 = row[head * a.head_dim + i + half];
    const ops::RotatedPair y = ops::rope_rotate(x1, x2, c[i], s[i]);
    if (head < a.query_heads) {
      float* q = a.q_out + int64_t{t} * q_size + head * a.head_dim;
      q[i] = y.first;
      q[i + half] = y.second;
    } else {
      T* k = a.k_cache + slot * kv_size + (head - a.query_heads) * a.head_dim;
      k[i] = from_float<T>(y.first);
      k[i + half] = from_float<T>(y.second);
    }
  }
  if (pass > 0) {
    for (int32_t idx = threadIdx.x; idx < (a.query_heads + a.kv_heads) * pass; idx += blockDim.x) {
      const int32_t head = idx / pass;
      const int32_t i = a.rotary_dim + idx % pass;
      const float x = row[head * a.head_dim + i];
      if (head < a.query_heads) {
        a.q_out[int64_t{t} * q_size + head * a.head_dim + i] = x;
      } else {
        a.k_cache[slot * kv_size + (head - a.query_heads) * a.head_dim + i] = from_float<T>(x);
      }
    }
  }
  const float* v = row + q_size + kv_size;
  for (int32_t i = threadIdx.x; i < kv_size; i += blockDim.x) {
    a.v_cache[slot * kv_size + i] = from_float<T>(v[i]);
  }
}

// One block a token.
template <typename T>
__global__ void rope_qkv_kernel(const float* qkv, RopeQkvArgs<T> a) {
  allow_successor();
  wait_for_predecessor();
  rope_qkv_row(qkv, static_cast<int32_t>(blockIdx.x), a);
}

template <typename T>
__global__ void swiglu_kernel(const float* gate_up, int32_t ffn, int64_t count, T* out) {
  allow_successor();
  wait_for_predecessor();
  const int64_t index = int64_t{blockIdx.x} * blockDim.x + threadIdx.x;
  if (index >= count) return;
  const int64_t t = index / ffn;
  const int64_t i = index % ffn;
  const float g = gate_up[t * 2 * ffn + i];
  const float u = gate_up[t * 2 * ffn + ffn + i];
  out[index] = from_float<T>(ops::swiglu(g, u));
}

// Four consecutive elements a thread, through 16-byte loads of gate and up (needs ffn % 4 == 0 and
// gate_up 16-byte aligned): a prefill chunk's SwiGLU is a stream of the fp32 gate/up product,
// and one element a thread moved it at ~1.8 TB/s (H200, 2048 tokens). Each element is the same
// ops::swiglu of the same two floats as swiglu_kernel's, so the bits are the same.
template <typename T>
__global__ void swiglu4_kernel(const float* gate_up, int32_t ffn, int64_t quads, T* out) {
  allow_successor();
  wait_for_predecessor();
  const int64_t q = int64_t{blockIdx.x} * blockDim.x + threadIdx.x;
  if (q >= quads) return;
  const int32_t quads_a_row = ffn / 4;
  const int64_t t = q / quads_a_row;
  const int64_t i = (q % quads_a_row) * 4;
  const float4 g = *reinterpret_cast<const float4*>(gate_up + t * 2 * ffn + i);
  const float4 u = *reinterpret_cast<const float4*>(gate_up + t * 2 * ffn + ffn + i);
  T* o = out + t * ffn + i;
  o[0] = from_float<T>(ops::swiglu(g.x, u.x));
  o[1] = from_float<T>(ops::swiglu(g.y, u.y));
  o[2] = from_float<T>(ops::swiglu(g.z, u.z));
  o[3] = from_float<T>(ops::swiglu(g.w, u.w));
}

__global__ void residual_add_kernel(float* residual, const float* delta, int64_t count) {
  const int64_t i = int64_t{blockIdx.x} * blockDim.x + threadIdx.x;
  if (i < count) residual[i] += delta[i];
}

// In place on one token's qkv row, by the whole block. First the bias over the whole row, then one
// warp per q or k head: each lane sums the squares of elements lane, lane + 32, ... in ascending
// order, a butterfly combines the lanes (a fixed order for a given head_dim), and the head is
// scaled as rms_norm does: (x · scale) · weight. Which warp takes a head changes no value.
__device__ void qkv_bias_head_norm_row(float* row, int32_t query_heads, int32_t kv_heads,
                                       int32_t head_dim, const QkvHeadPrep& prep) {
  const float* bias = prep.bias;
  const float* q_norm = prep.q_norm;
  const float* k_norm = prep.k_norm;
  const float eps = prep.eps;
  const int32_t row_size = (query_heads + 2 * kv_heads) * head_dim;
  if (bias != nullptr) {
    for (int32_t i = threadIdx.x; i < row_size; i += blockDim.x) row[i] += bias[i];
    __syncthreads();
  }
  if (q_norm == nullptr) return;
  const int32_t lane = static_cast<int32_t>(threadIdx.x) % 32;
  const int32_t warps = static_cast<int32_t>(blockDim.x) / 32;
  for (int32_t head = static_cast<int32_t>(threadIdx.x) / 32; head < query_heads + kv_heads;
       head += warps) {
    float* x = row + head * head_dim;  // q heads, then k heads: contiguous in the row
    const float* weight = head < query_heads ? q_norm : k_norm;
    float sum = 0.0f;
    for (int32_t i = lane; i < head_dim; i += 32) sum += x[i] * x[i];
#pragma unroll
    for (int32_t offset = 16; offset > 0; offset /= 2) sum += __shfl_xor_sync(0xffffffffu, sum, offset);
    const float scale = ops::rms_norm_scale(sum, head_dim, eps);
    for (int32_t i = lane; i < head_dim; i += 32) x[i] = ops::rms_norm_element(x[i], scale, weight[i]);
  }
}

constexpr int32_t kHeadNormThreads = 256;

// One block a token.
__global__ void __launch_bounds__(kHeadNormThreads)
qkv_bias_head_norm_kernel(float* qkv, int32_t query_heads, int32_t kv_heads, int32_t head_dim,
                          QkvHeadPrep prep) {
  allow_successor();
  wait_for_predecessor();
  const int32_t row_size = (query_heads + 2 * kv_heads) * head_dim;
  qkv_bias_head_norm_row(qkv + int64_t{blockIdx.x} * row_size, query_heads, kv_heads, head_dim,
                         prep);
}

// One block a token: its row's bias and head norms, then its rotation and KV write.
template <typename T>
__global__ void qkv_head_prep_rope_kernel(float* qkv, QkvHeadPrep prep, RopeQkvArgs<T> a) {
  allow_successor();
  wait_for_predecessor();
  const int32_t t = static_cast<int32_t>(blockIdx.x);
  float* row = qkv + int64_t{t} * (a.query_heads + 2 * a.kv_heads) * a.head_dim;
  qkv_bias_head_norm_row(row, a.query_heads, a.kv_heads, a.head_dim, prep);
  __syncthreads();  // the row's every element prepared before another thread's pair reads it
  rope_qkv_row(qkv, t, a);
}

__global__ void fill_float_kernel(float* out, int64_t count, float value) {
  const int64_t i = int64_t{blockIdx.x} * blockDim.x + threadIdx.x;
  if (i < count) out[i] = value;
}

// Both norms or neither, a positive eps, a row to prepare.
bool head_prep_fits(const float* qkv, const QkvHeadPrep& prep) {
  return qkv != nullptr && (prep.q_norm == nullptr) == (prep.k_norm == nullptr) && prep.eps > 0.0f;
}

int32_t blocks_for(int64_t count, int32_t threads) {
  return static_cast<int32_t>((count + threads - 1) / threads);
}

}  // namespace

template <typename T>
cudaError_t launch_embedding(const T* table, const int32_t* ids, int32_t tokens_count,
                             int32_t hidden, float* out, LaunchStream stream) {
  if (tokens_count < 0 || hidden < 1 || table == nullptr || out == nullptr) {
    return cudaErrorInvalidValue;
  }
  if (tokens_count == 0) return cudaSuccess;
  return launch_kernel(embedding_kernel<T>, tokens_count, 256, 0, stream, table, ids, hidden, out);
}

template <typename T>
cudaError_t launch_rms_norm(const float* x, const int32_t* row_index, int32_t rows_count,
                            int32_t n, const float* weight, float eps, T* out,
                            LaunchStream stream) {
  if (rows_count < 0 || n < 1 || !(eps > 0.0f) || x == nullptr || weight == nullptr) {
    return cudaErrorInvalidValue;
  }
  if (rows_count == 0) return cudaSuccess;
  const bool aligned = reinterpret_cast<uintptr_t>(x) % 16 == 0 &&
                       reinterpret_cast<uintptr_t>(weight) % 16 == 0 &&
                       reinterpret_cast<uintptr_t>(out) % (4 * sizeof(T)) == 0;
  if (norm_vectorised(n) && aligned) {
    return launch_kernel(rms_norm_vec_kernel<T>, rows_count, kNormThreads, 0, stream, x, row_index,
                         n, weight, eps, out);
  }
  return launch_kernel(rms_norm_kernel<T>, rows_count, 256, 0, stream, x, row_index, n, weight,
                       eps, out);
}

namespace {

bool rope_shape_fits(int32_t tokens_count, int32_t query_heads, int32_t kv_heads,
                     int32_t head_dim, int32_t rotary_dim, int32_t positions_count) {
  return tokens_count >= 0 && query_heads >= 1 && kv_heads >= 1 && head_dim >= 2 &&
         head_dim % 2 == 0 && rotary_dim >= 2 && rotary_dim % 2 == 0 && rotary_dim <= head_dim &&
         positions_count >= 1;
}

// 512 threads: a decode token's (heads · half) pairs take few rounds of loads.
constexpr int32_t kRopeThreads = 512;

}  // namespace

template <typename T>
cudaError_t launch_rope_qkv(const float* qkv, const int32_t* positions, const int64_t* slots,
                            int32_t tokens_count, int32_t query_heads, int32_t kv_heads,
                            int32_t head_dim, int32_t rotary_dim, const float* cos,
                            const float* sin, int32_t positions_count, float* q_out, T* k_cache,
                            T* v_cache, LaunchStream stream) {
  if (!rope_shape_fits(tokens_count, query_heads, kv_heads, head_dim, rotary_dim,
                       positions_count)) {
    return cudaErrorInvalidValue;
  }
  if (tokens_count == 0) return cudaSuccess;
  const RopeQkvArgs<T> args{positions, slots, query_heads, kv_heads, head_dim, rotary_dim, cos,
                            sin, positions_count, q_out, k_cache, v_cache};
  return launch_kernel(rope_qkv_kernel<T>, tokens_count, kRopeThreads, 0, stream, qkv, args);
}

template <typename T>
cudaError_t launch_qkv_prep_rope(float* qkv, const QkvHeadPrep& prep, const int32_t* positions,
                                 const int64_t* slots, int32_t tokens_count, int32_t query_heads,
                                 int32_t kv_heads, int32_t head_dim, int32_t rotary_dim,
                                 const float* cos, const float* sin, int32_t positions_count,
                                 float* q_out, T* k_cache, T* v_cache, LaunchStream stream) {
  if (!rope_shape_fits(tokens_count, query_heads, kv_heads, head_dim, rotary_dim,
                       positions_count) ||
      !head_prep_fits(qkv, prep)) {
    return cudaErrorInvalidValue;
  }
  if (tokens_count == 0) return cudaSuccess;
  const RopeQkvArgs<T> args{positions, slots, query_heads, kv_heads, head_dim, rotary_dim, cos,
                            sin, positions_count, q_out, k_cache, v_cache};
  if (prep.bias == nullptr && prep.q_norm == nullptr) {  // nothing to prepare: RoPE's own kernel
    return launch_kernel(rope_qkv_kernel<T>, tokens_count, kRopeThreads, 0, stream, qkv, args);
  }
  return launch_kernel(qkv_head_prep_rope_kernel<T>, tokens_count, kRopeThreads, 0, stream, qkv,
                       prep, args);
}

template <typename T>
cudaError_t launch_swiglu(const float* gate_up, int32_t tokens_count, int32_t ffn, T* out,
                          LaunchStream stream) {
  if (tokens_count < 0 || ffn < 1) return cudaErrorInvalidValue;
  const int64_t count = int64_t{tokens_count} * ffn;
  if (count == 0) return cudaSuccess;
  if (ffn % 4 == 0 && reinterpret_cast<uintptr_t>(gate_up) % 16 == 0) {
    return launch_kernel(swiglu4_kernel<T>, blocks_for(count / 4, 256), 256, 0, stream, gate_up,
                         ffn, count / 4, out);
  }
  return launch_kernel(swiglu_kernel<T>, blocks_for(count, 256), 256, 0, stream, gate_up, ffn, count,
                       out);
}

#define LS_INSTANTIATE_LAYER_OPS(T)                                                               \
  template cudaError_t launch_embedding<T>(const T*, const int32_t*, int32_t, int32_t, float*,    \
                                           LaunchStream);                                         \
  template cudaError_t launch_rms_norm<T>(const float*, const int32_t*, int32_t, int32_t,         \
                                          const float*, float, T*, LaunchStream);                 \
  template cudaError_t launch_rope_qkv<T>(const float*, const int32_t*, const int64_t*, int32_t,  \
                                          int32_t, int32_t, int32_t, int32_t, const float*,       \
                                          const float*,                                           \
                                          int32_t, float*, T*, T*, LaunchStream);                 \
  template cudaError_t launch_qkv_prep_rope<T>(                                                   \
      float*, const QkvHeadPrep&, const int32_t*, const int64_t*, int32_t, int32_t, int32_t,      \
      int32_t, int32_t, const float*, const float*, int32_t, float*, T*, T*, LaunchStream);       \
  template cudaError_t launch_swiglu<T>(const float*, int32_t, int32_t, T*, LaunchStream);
LS_INSTANTIATE_LAYER_OPS(bf16)
LS_INSTANTIATE_LAYER_OPS(float)
#undef LS_INSTANTIATE_LAYER_OPS

cudaError_t launch_residual_add(float* residual, const float* delta, int64_t count,
                                cudaStream_t stream) {
  if (count < 0) return cudaErrorInvalidValue;
  if (count == 0) return cudaSuccess;
  residual_add_kernel<<<blocks_for(count, 256), 256, 0, stream>>>(residual, delta, count);
  return cudaGetLastError();
}

cudaError_t launch_qkv_bias_head_norm(float* qkv, int32_t tokens_count, int32_t query_heads,
                                      int32_t kv_heads, int32_t head_dim, const float* bias,
                                      const float* q_norm, const float* k_norm, float eps,
                                      LaunchStream stream) {
  const QkvHeadPrep prep{bias, q_norm, k_norm, eps};
  if (tokens_count < 0 || query_heads < 1 || kv_heads < 1 || head_dim < 1 ||
      !head_prep_fits(qkv, prep)) {
    return cudaErrorInvalidValue;
  }
  if (tokens_count == 0 || (bias == nullptr && q_norm == nullptr)) return cudaSuccess;
  return launch_kernel(qkv_bias_head_norm_kernel, tokens_count, kHeadNormThreads, 0, stream, qkv,
                       query_heads, kv_heads, head_dim, prep);
}

cudaError_t launch_fill_float(float* out, int64_t count, float value, cudaStream_t stream) {
  if (count < 0) return cudaErrorInvalidValue;
  if (count == 0) return cudaSuccess;
  fill_float_kernel<<<blocks_for(count, 256), 256, 0, stream>>>(out, count, value);
  return cudaGetLastError();
}

}  // namespace ls::kernels
