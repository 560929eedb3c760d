#include "kernels/layer_ops.h"
#include "kernels/reduce.cuh"
#include "kernels/step_layout.h"

namespace ls::kernels {

namespace {

__global__ void embedding_kernel(const bf16* table, const int32_t* ids, int32_t hidden,
                                 float* out) {
  const int32_t t = blockIdx.x;
  const bf16* row = table + int64_t{ids[t]} * hidden;
  float* o = out + int64_t{t} * hidden;
  for (int32_t i = threadIdx.x; i < hidden; i += blockDim.x) o[i] = __bfloat162float(row[i]);
}

__global__ void rms_norm_kernel(const float* x, const int32_t* row_index, int32_t n,
                                const float* weight, float eps, bf16* out) {
  __shared__ float scratch[32];
  const int32_t r = blockIdx.x;
  const int64_t source = row_index ? row_index[r] : r;
  const float* xr = x + source * n;
  float sum = 0.0f;
  for (int32_t i = threadIdx.x; i < n; i += blockDim.x) sum += xr[i] * xr[i];
  const float mean_square = block_sum(sum, scratch) / static_cast<float>(n);
  const float scale = 1.0f / sqrtf(mean_square + eps);
  bf16* o = out + int64_t{r} * n;
  for (int32_t i = threadIdx.x; i < n; i += blockDim.x) {
    o[i] = __float2bfloat16_rn(xr[i] * scale * weight[i]);
  }
}

__global__ void rope_qkv_kernel(const float* qkv, const int32_t* positions, const int64_t* slots,
                                int32_t query_heads, int32_t kv_heads, int32_t head_dim,
                                const float* cos_table, const float* sin_table,
                                int32_t positions_count, float* q_out, bf16* k_cache,
                                bf16* v_cache) {
  const int32_t t = blockIdx.x;
  const int32_t half = head_dim / 2;
  const int32_t q_size = query_heads * head_dim;
  const int32_t kv_size = kv_heads * head_dim;
  const float* row = qkv + int64_t{t} * (q_size + 2 * kv_size);
  const int32_t position = min(positions[t], positions_count - 1);
  const float* c = cos_table + int64_t{position} * half;
  const float* s = sin_table + int64_t{position} * half;
  const int64_t slot = slots[t];
  const int32_t pairs = (query_heads + kv_heads) * half;
  for (int32_t idx = threadIdx.x; idx < pairs; idx += blockDim.x) {
    const int32_t head = idx / half;
    const int32_t i = idx % half;
    const float x1 = row[head * head_dim + i];
    const float x2 = row[head * head_dim + i + half];
    const float y1 = x1 * c[i] - x2 * s[i];
    const float y2 = x2 * c[i] + x1 * s[i];
    if (head < query_heads) {
      float* q = q_out + int64_t{t} * q_size + head * head_dim;
      q[i] = y1;
      q[i + half] = y2;
    } else {
      bf16* k = k_cache + slot * kv_size + (head - query_heads) * head_dim;
      k[i] = __float2bfloat16_rn(y1);
      k[i + half] = __float2bfloat16_rn(y2);
    }
  }
  const float* v = row + q_size + kv_size;
  for (int32_t i = threadIdx.x; i < kv_size; i += blockDim.x) {
    v_cache[slot * kv_size + i] = __float2bfloat16_rn(v[i]);
  }
}

__global__ void swiglu_kernel(const float* gate_up, int32_t ffn, int64_t count, bf16* out) {
  const int64_t index = int64_t{blockIdx.x} * blockDim.x + threadIdx.x;
  if (index >= count) return;
  const int64_t t = index / ffn;
  const int64_t i = index % ffn;
  const float g = gate_up[t * 2 * ffn + i];
  const float u = gate_up[t * 2 * ffn + ffn + i];
  out[index] = __float2bfloat16_rn(g / (1.0f + expf(-g)) * u);
}

__global__ void residual_add_kernel(float* residual, const float* delta, int64_t count) {
  const int64_t i = int64_t{blockIdx.x} * blockDim.x + threadIdx.x;
  if (i < count) residual[i] += delta[i];
}

constexpr int32_t kGuardThreads = 1024;

__global__ void __launch_bounds__(kGuardThreads)
guard_logits_kernel(float* logits, int32_t vocab, int32_t* nan_flags, int32_t* argmax,
                    float* row_max, float* row_sum) {
  __shared__ float values[32];
  __shared__ int32_t indices[32];
  __shared__ int32_t any_nan;
  if (threadIdx.x == 0) any_nan = 0;
  __syncthreads();
  float* row = logits + int64_t{blockIdx.x} * vocab;
  ArgMax best{-INFINITY, 0x7fffffff};
  int32_t saw_nan = 0;
  for (int32_t i = threadIdx.x; i < vocab; i += blockDim.x) {
    float x = row[i];
    if (isnan(x)) {
      saw_nan = 1;
      x = -kSanitisedMagnitude;
      row[i] = x;
    } else if (isinf(x)) {
      x = x > 0.0f ? kSanitisedMagnitude : -kSanitisedMagnitude;
      row[i] = x;
    }
    if (x > best.value) best = ArgMax{x, i};  // ascending i: the first keeps a tie
  }
  if (saw_nan) atomicOr(&any_nan, 1);
  best = block_argmax(best, values, indices);
  if (threadIdx.x == 0) {
    nan_flags[blockIdx.x] = any_nan;
    argmax[blockIdx.x] = best.index;
  }
  if (row_max == nullptr || row_sum == nullptr) return;
  float sum = 0.0f;
  for (int32_t i = threadIdx.x; i < vocab; i += blockDim.x) sum += expf(row[i] - best.value);
  sum = block_sum(sum, values);
  if (threadIdx.x == 0) {
    row_max[blockIdx.x] = best.value;
    row_sum[blockIdx.x] = sum;
  }
}

__global__ void fill_float_kernel(float* out, int64_t count, float value) {
  const int64_t i = int64_t{blockIdx.x} * blockDim.x + threadIdx.x;
  if (i < count) out[i] = value;
}

int32_t blocks_for(int64_t count, int32_t threads) {
  return static_cast<int32_t>((count + threads - 1) / threads);
}

}  // namespace

cudaError_t launch_embedding(const bf16* table, const int32_t* ids, int32_t tokens_count,
                             int32_t hidden, float* out, cudaStream_t stream) {
  if (tokens_count < 0 || hidden < 1 || table == nullptr || out == nullptr) {
    return cudaErrorInvalidValue;
  }
  if (tokens_count == 0) return cudaSuccess;
  embedding_kernel<<<tokens_count, 256, 0, stream>>>(table, ids, hidden, out);
  return cudaGetLastError();
}

cudaError_t launch_rms_norm(const float* x, const int32_t* row_index, int32_t rows_count,
                            int32_t n, const float* weight, float eps, bf16* out,
                            cudaStream_t stream) {
  if (rows_count < 0 || n < 1 || !(eps > 0.0f) || x == nullptr || weight == nullptr) {
    return cudaErrorInvalidValue;
  }
  if (rows_count == 0) return cudaSuccess;
  rms_norm_kernel<<<rows_count, 256, 0, stream>>>(x, row_index, n, weight, eps, out);
  return cudaGetLastError();
}

cudaError_t launch_rope_qkv(const float* qkv, const int32_t* positions, const int64_t* slots,
                            int32_t tokens_count, int32_t query_heads, int32_t kv_heads,
                            int32_t head_dim, const float* cos, const float* sin,
                            int32_t positions_count, float* q_out, bf16* k_cache, bf16* v_cache,
                            cudaStream_t stream) {
  if (tokens_count < 0 || query_heads < 1 || kv_heads < 1 || head_dim < 2 || head_dim % 2 != 0 ||
      positions_count < 1) {
    return cudaErrorInvalidValue;
  }
  if (tokens_count == 0) return cudaSuccess;
  rope_qkv_kernel<<<tokens_count, 128, 0, stream>>>(qkv, positions, slots, query_heads, kv_heads,
                                                    head_dim, cos, sin, positions_count, q_out,
                                                    k_cache, v_cache);
  return cudaGetLastError();
}

cudaError_t launch_swiglu(const float* gate_up, int32_t tokens_count, int32_t ffn, bf16* out,
                          cudaStream_t stream) {
  if (tokens_count < 0 || ffn < 1) return cudaErrorInvalidValue;
  const int64_t count = int64_t{tokens_count} * ffn;
  if (count == 0) return cudaSuccess;
  swiglu_kernel<<<blocks_for(count, 256), 256, 0, stream>>>(gate_up, ffn, count, out);
  return cudaGetLastError();
}

cudaError_t launch_residual_add(float* residual, const float* delta, int64_t count,
                                cudaStream_t stream) {
  if (count < 0) return cudaErrorInvalidValue;
  if (count == 0) return cudaSuccess;
  residual_add_kernel<<<blocks_for(count, 256), 256, 0, stream>>>(residual, delta, count);
  return cudaGetLastError();
}

cudaError_t launch_guard_logits(float* logits, int32_t rows_count, int32_t vocab,
                                int32_t* nan_flags, int32_t* argmax, float* row_max,
                                float* row_sum, cudaStream_t stream) {
  if (rows_count < 0 || vocab < 1 || logits == nullptr || nan_flags == nullptr ||
      argmax == nullptr) {
    return cudaErrorInvalidValue;
  }
  if (rows_count == 0) return cudaSuccess;
  guard_logits_kernel<<<rows_count, kGuardThreads, 0, stream>>>(logits, vocab, nan_flags, argmax,
                                                                row_max, row_sum);
  return cudaGetLastError();
}

cudaError_t launch_fill_float(float* out, int64_t count, float value, cudaStream_t stream) {
  if (count < 0) return cudaErrorInvalidValue;
  if (count == 0) return cudaSuccess;
  fill_float_kernel<<<blocks_for(count, 256), 256, 0, stream>>>(out, count, value);
  return cudaGetLastError();
}

}  // namespace ls::kernels
