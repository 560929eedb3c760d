// lockstep's decode GEMV (kernels/gemm.h launch_gemv_bf16) and its fused forms
// (kernels/decode_gemv.h): one kernel template over where x comes from (bf16 in global memory,
// or normalised from the residual into shared memory) and what the epilogue writes.
#include "kernels/decode_gemv.h"
#include "kernels/gemm.h"

#include "core/ops/layer_math.h"
#include "kernels/copy_async.cuh"
#include "kernels/kernel_fit.h"
#include "kernels/launch.cuh"
#include "kernels/reduce.cuh"
#include "kernels/rms_norm.cuh"

namespace ls::kernels {

namespace {

using bf16 = __nv_bfloat16;

constexpr int32_t kGemvWarps = 4;  // tasks per group; a block runs one group at a time
constexpr int32_t kGemvThreads = 32 * kGemvWarps;
constexpr int32_t kGemvUnroll = 8;  // 16-byte weight loads per row a lane has in flight

// What a warp's task writes, and the rows it takes: one row for a plain product (a warp per row,
// as few registers as the product needs); two for an epilogue that combines rows.
enum class Epilogue {
  kStore,   // y[t, row] = acc (+ beta · y): task = row
  kSwiglu,  // act[t, j] = silu(acc[j]) · acc[ffn + j]: task j, rows j and ffn + j
  kRopeKv,  // a Q/K head's rows i and i + half, rotated into q_out / k_cache; or V rows 2j, 2j + 1
};

template <Epilogue E>
constexpr int32_t kRowsOf = E == Epilogue::kStore ? 1 : 2;

struct GemvParams {
  const bf16* w;
  int32_t tokens, out, in;
  const bf16* x;  // [tokens, in] when not normalised in the kernel
  GemvNorm norm;
  float* y;  // kStore
  float beta;
  bf16* act;  // kSwiglu [tokens, out / 2]
  RopeKvTarget rope;
};

struct TaskRows {
  int32_t row[2];
};

template <Epilogue E>
__device__ __forceinline__ TaskRows task_rows(const GemvParams& p, int32_t task) {
  if constexpr (E == Epilogue::kStore) {
    return TaskRows{{task, task}};
  } else if constexpr (E == Epilogue::kSwiglu) {
    return TaskRows{{task, p.out / 2 + task}};
  } else {
    const int32_t half = p.rope.head_dim / 2;
    const int32_t rotated = (p.rope.query_heads + p.rope.kv_heads) * half;
    if (task < rotated) {
      const int32_t a = (task / half) * p.rope.head_dim + task % half;
      return TaskRows{{a, a + half}};
    }
    const int32_t v = (p.rope.query_heads + p.rope.kv_heads) * p.rope.head_dim;
    return TaskRows{{v + 2 * (task - rotated), v + 2 * (task - rotated) + 1}};
  }
}

__device__ __forceinline__ void unpack8(const uint4& raw, float* out) {
  const __nv_bfloat162* pairs = reinterpret_cast<const __nv_bfloat162*>(&raw);
#pragma unroll
  for (int32_t k = 0; k < 4; ++k) {
    const float2 f = __bfloat1622float2(pairs[k]);
    out[2 * k] = f.x;
    out[2 * k + 1] = f.y;
  }
}

// One chunk (8 elements) of each of the task's rows against the same chunk of every token's
// input: each row's sum takes the elements in ascending order, as a row alone would.
template <int32_t kTokens, int32_t kRows, bool kNormed>
__device__ __forceinline__ void accumulate(const uint4 (&w_raw)[kRows], const uint4* x,
                                           int32_t x_pitch, int32_t chunk, int32_t tokens,
                                           float (&acc)[kRows][kTokens]) {
  float wf[kRows][8];
#pragma unroll
  for (int32_t r = 0; r < kRows; ++r) unpack8(w_raw[r], wf[r]);
#pragma unroll
  for (int32_t t = 0; t < kTokens; ++t) {
    if (t < tokens) {
      float xf[8];
      const uint4* at = x + int64_t{t} * x_pitch + chunk;
      unpack8(kNormed ? *at : __ldg(at), xf);
#pragma unroll
      for (int32_t r = 0; r < kRows; ++r) {
#pragma unroll
        for (int32_t e = 0; e < 8; ++e) acc[r][t] += wf[r][e] * xf[e];
      }
    }
  }
}

// A warp's dot products of its task's rows. Lane l takes the 8-element chunks l, l + 32,
// l + 64, ... of each row in ascending order (the unrolled and the tail loop keep that order);
// the caller sums across lanes with a butterfly: each row's order depends on `in` only.
template <int32_t kTokens, int32_t kRows>
struct RowStream {
  const uint4* w[kRows];
  int32_t chunks;
  int32_t c;
  uint4 raw[kRows][kGemvUnroll];

  // Points the stream at the start of the task's rows.
  __device__ void aim(const GemvParams& p, TaskRows rows, int32_t lane) {
#pragma unroll
    for (int32_t r = 0; r < kRows; ++r) {
      w[r] = reinterpret_cast<const uint4*>(p.w + int64_t{rows.row[r]} * p.in);
    }
    chunks = p.in / 8;
    c = lane;
  }
  __device__ bool round_fits() const { return c + 32 * (kGemvUnroll - 1) < chunks; }
  __device__ void load_round() {
#pragma unroll
    for (int32_t r = 0; r < kRows; ++r) {
#pragma unroll
      for (int32_t u = 0; u < kGemvUnroll; ++u) raw[r][u] = __ldcs(w[r] + c + 32 * u);
    }
  }
  // Rounds from the one already loaded (when it fits), then the tail.
  template <bool kNormed>
  __device__ void run(const uint4* x, int32_t tokens, float (&acc)[kRows][kTokens]) {
    uint4 chunk[kRows];
    while (round_fits()) {
#pragma unroll
      for (int32_t u = 0; u < kGemvUnroll; ++u) {
#pragma unroll
        for (int32_t r = 0; r < kRows; ++r) chunk[r] = raw[r][u];
        accumulate<kTokens, kRows, kNormed>(chunk, x, chunks, c + 32 * u, tokens, acc);
      }
      c += 32 * kGemvUnroll;
      if (round_fits()) load_round();
    }
    for (; c < chunks; c += 32) {
#pragma unroll
      for (int32_t r = 0; r < kRows; ++r) chunk[r] = __ldcs(w[r] + c);
      accumulate<kTokens, kRows, kNormed>(chunk, x, chunks, c, tokens, acc);
    }
  }
};

// The norm weight [in] into shared memory, asynchronously: issued before the wait for the
// predecessor (a weight: nothing writes it), so that normalising reads it from there instead of
// waiting on the DRAM after the sums of squares.
__device__ __forceinline__ void stage_norm_weight(const GemvNorm& norm, int32_t in,
                                                  float* weight_s) {
  for (int32_t i = static_cast<int32_t>(threadIdx.x); i < in / 4; i += kGemvThreads) {
    copy_async_16(weight_s + 4 * i, norm.weight + 4 * i);
  }
  copy_async_commit();
}

// One token's norm with the residual held in registers: each thread loads its float4s tid,
// tid + kGemvThreads, ... once and keeps them for the second pass, which then reads nothing but
// the staged weight (a second trip to the L2 saved on a batch-1 step's critical path). Those are
// exactly the float4s of the two norm warps the thread plays: norm warp `warp` (thread v = tid)
// takes float4s v + k·kNormThreads, the even j below, and norm warp warp + kGemvWarps (v = tid +
// kGemvThreads) the odd j, so the sums are normalise_into's. Needs vecs <= kHeldVecs ·
// kGemvThreads (a hidden size up to 4096).
constexpr int32_t kHeldVecs = 8;
static_assert(kNormWarps == 2 * kGemvWarps && kNormThreads == 2 * kGemvThreads,
              "a warp plays two norm warps");
static_assert(kHeldVecs <= 2 * kNormVecMax, "held float4s map onto the norm order");

__device__ void normalise_held(const GemvNorm& norm, int32_t in, const float* weight_s,
                               bf16* normed, float* partials) {
  const int32_t tid = static_cast<int32_t>(threadIdx.x);
  const int32_t warp = tid / 32;
  const int32_t lane = tid % 32;
  const int32_t vecs = in / 4;
  const float4* xr = reinterpret_cast<const float4*>(norm.residual);
  float4 held[kHeldVecs];  // float4 tid + j·kGemvThreads of the row, those below vecs
#pragma unroll
  for (int32_t j = 0; j < kHeldVecs; ++j) {
    if (tid + j * kGemvThreads < vecs) held[j] = xr[tid + j * kGemvThreads];
  }
#pragma unroll
  for (int32_t role = 0; role < 2; ++role) {
    float4 part[kNormVecMax];
#pragma unroll
    for (int32_t k = 0; k < kNormVecMax; ++k) {
      // Past kHeldVecs the norm order's index is past vecs: never summed.
      part[k] = 2 * k + role < kHeldVecs ? held[2 * k + role] : make_float4(0.f, 0.f, 0.f, 0.f);
    }
    const float sum = warp_sum(norm_thread_squares(part, tid + role * kGemvThreads, vecs));
    if (lane == 0) partials[warp + role * kGemvWarps] = sum;
  }
  copy_async_wait_all();  // this thread's part of the weight; the barrier publishes every part
  __syncthreads();
  const float total = warp_sum(lane < kNormWarps ? partials[lane] : 0.0f);
  const float scale = ops::rms_norm_scale(total, in, norm.eps);
  const float4* weight = reinterpret_cast<const float4*>(weight_s);
#pragma unroll
  for (int32_t j = 0; j < kHeldVecs; ++j) {
    const int32_t i = tid + j * kGemvThreads;
    if (i < vecs) store_normalised4(normed + 4 * i, held[j], scale, weight[i]);
  }
  __syncthreads();
}

// x[t] = rms_norm(residual[t]) as bf16 into `normed` [tokens, in]: the sum of squares in the
// order of the vectorised norm kernel (kernels/rms_norm.cuh), whose kNormWarps warps this block's
// warps play in turn (a warp's butterfly is the same on any warp); then the same block sum over
// their partials, scale and element rounding. `weight_s`: stage_norm_weight's copy. One token
// (the kTokens = 1 kernel) holds its residual in registers where it fits (normalise_held).
template <int32_t kTokens>
__device__ void normalise_into(const GemvNorm& norm, int32_t tokens, int32_t in,
                               const float* weight_s, bf16* normed) {
  __shared__ float partials[kGemvTokensMax][kNormWarps];
  const int32_t warp = static_cast<int32_t>(threadIdx.x) / 32;
  const int32_t lane = static_cast<int32_t>(threadIdx.x) % 32;
  const int32_t vecs = in / 4;
  if constexpr (kTokens == 1) {
    if (vecs <= kHeldVecs * kGemvThreads) {
      normalise_held(norm, in, weight_s, normed, partials[0]);
      return;
    }
  }
  for (int32_t t = 0; t < tokens; ++t) {
    const float4* xr = reinterpret_cast<const float4*>(norm.residual + int64_t{t} * in);
    for (int32_t w = warp; w < kNormWarps; w += kGemvWarps) {
      const float sum = warp_sum(norm_thread_squares(xr, w * 32 + lane, vecs));
      if (lane == 0) partials[t][w] = sum;
    }
  }
  copy_async_wait_all();  // this thread's part of the weight; the barrier publishes every part
  __syncthreads();
  const float4* weight = reinterpret_cast<const float4*>(weight_s);
  for (int32_t t = 0; t < tokens; ++t) {
    const float total = warp_sum(lane < kNormWarps ? partials[t][lane] : 0.0f);
    const float scale = ops::rms_norm_scale(total, in, norm.eps);
    const float4* xr = reinterpret_cast<const float4*>(norm.residual + int64_t{t} * in);
    for (int32_t i = static_cast<int32_t>(threadIdx.x); i < vecs; i += kGemvThreads) {
      store_normalised4(normed + int64_t{t} * in + 4 * i, xr[i], scale, weight[i]);
    }
  }
  __syncthreads();
}

// What the RoPE/KV epilogue reads besides the sums, for one token of one task: its KV slot and,
// for a Q or K pair, the cos/sin of its position. Read as the task starts, so that the dependent
// reads (the position, then its row of the tables) run under the task's dot products instead of
// after its butterflies, on the step's critical path.
struct RopeInputs {
  int64_t slot = 0;
  float cos = 0.0f, sin = 0.0f;
};

__device__ __forceinline__ RopeInputs rope_inputs(const GemvParams& p, TaskRows rows,
                                                  int32_t task, int32_t t) {
  const RopeKvTarget& r = p.rope;
  const int32_t half = r.head_dim / 2;
  RopeInputs in;
  in.slot = r.slots[t];
  if (rows.row[0] < (r.query_heads + r.kv_heads) * r.head_dim) {  // a Q or K pair: rotated
    const int32_t position = min(r.positions[t], r.positions_count - 1);
    in.cos = r.cos[int64_t{position} * half + task % half];
    in.sin = r.sin[int64_t{position} * half + task % half];
  }
  return in;
}

// Token t's outputs of one task (every lane holds the sums; lane t writes token t, with `rope`
// its rope_inputs for kRopeKv).
template <Epilogue E>
__device__ __forceinline__ void write_task(const GemvParams& p, TaskRows rows, int32_t task,
                                           int32_t t, const float* sums, const RopeInputs& rope) {
  if constexpr (E == Epilogue::kStore) {
    float* y = p.y + int64_t{t} * p.out + rows.row[0];
    *y = p.beta == 0.0f ? sums[0] : sums[0] + p.beta * *y;
  } else if constexpr (E == Epilogue::kSwiglu) {
    p.act[int64_t{t} * (p.out / 2) + task] = __float2bfloat16_rn(ops::swiglu(sums[0], sums[1]));
  } else {
    const RopeKvTarget& r = p.rope;
    const int32_t half = r.head_dim / 2;
    const int32_t q_size = r.query_heads * r.head_dim;
    const int32_t kv_size = r.kv_heads * r.head_dim;
    const int32_t a = rows.row[0];
    if (a >= q_size + kv_size) {  // V: rounded as it is
      r.v_cache[rope.slot * kv_size + (a - q_size - kv_size)] = __float2bfloat16_rn(sums[0]);
      r.v_cache[rope.slot * kv_size + (a - q_size - kv_size) + 1] = __float2bfloat16_rn(sums[1]);
      return;
    }
    const ops::RotatedPair y = ops::rope_rotate(sums[0], sums[1], rope.cos, rope.sin);
    if (a < q_size) {
      float* q = r.q_out + int64_t{t} * q_size + a;
      q[0] = y.first;
      q[half] = y.second;
    } else {
      bf16* k = r.k_cache + rope.slot * kv_size + (a - q_size);
      k[0] = __float2bfloat16_rn(y.first);
      k[half] = __float2bfloat16_rn(y.second);
    }
  }
}

// grid: blocks of kGemvWarps warps; block b runs groups b·per_block ... (b + 1)·per_block − 1,
// warp w of group g the task g·kGemvWarps + w. The first round of weight loads, and the norm
// weight's copy to shared memory, are issued before waiting for the predecessor kernel
// (kernels/launch.h): weights depend on nothing earlier, and at hidden 2048 that round is the
// whole row.
template <int32_t kTokens, bool kNormed, Epilogue E>
__global__ void __launch_bounds__(kGemvThreads)
gemv_kernel(const GemvParams p, int32_t tasks, int32_t groups_per_block) {
  constexpr int32_t kRows = kRowsOf<E>;
  allow_successor();
  extern __shared__ uint4 normed_x[];  // [tokens, in / 8], then the norm weight, when kNormed
  float* weight_s = reinterpret_cast<float*>(normed_x + int64_t{p.tokens} * (p.in / 8));
  const int32_t warp = static_cast<int32_t>(threadIdx.x) / 32;
  const int32_t lane = static_cast<int32_t>(threadIdx.x) % 32;
  const int32_t per_block = kNormed ? groups_per_block : 1;  // (launch_as)
  const int32_t first = blockIdx.x * per_block * kGemvWarps + warp;
  const int32_t last = min(tasks, first + per_block * kGemvWarps);
  RowStream<kTokens, kRows> stream;
  if (first < tasks) {
    stream.aim(p, task_rows<E>(p, first), lane);
    if (stream.round_fits()) stream.load_round();
  }
  if constexpr (kNormed) stage_norm_weight(p.norm, p.in, weight_s);
  wait_for_predecessor();
  if constexpr (kNormed) {
    normalise_into<kTokens>(p.norm, p.tokens, p.in, weight_s, reinterpret_cast<bf16*>(normed_x));
  }
  const uint4* x = kNormed ? normed_x : reinterpret_cast<const uint4*>(p.x);
  for (int32_t task = first; task < last; task += kGemvWarps) {
    RopeInputs rope;
    if constexpr (E == Epilogue::kRopeKv) {
      if (lane < p.tokens) rope = rope_inputs(p, task_rows<E>(p, task), task, lane);
    }
    float acc[kRows][kTokens];
#pragma unroll
    for (int32_t r = 0; r < kRows; ++r) {
#pragma unroll
      for (int32_t t = 0; t < kTokens; ++t) acc[r][t] = 0.0f;
    }
    stream.template run<kNormed>(x, p.tokens, acc);
    // The next task's first round goes out before this task's butterflies and writes.
    if (task + kGemvWarps < last) {
      stream.aim(p, task_rows<E>(p, task + kGemvWarps), lane);
      if (stream.round_fits()) stream.load_round();
    }
#pragma unroll
    for (int32_t r = 0; r < kRows; ++r) {
#pragma unroll
      for (int32_t t = 0; t < kTokens; ++t) acc[r][t] = warp_sum(acc[r][t]);
    }
    const TaskRows rows = task_rows<E>(p, task);
#pragma unroll
    for (int32_t t = 0; t < kTokens; ++t) {
      if (t < p.tokens && lane == t) {
        float sums[kRows];
#pragma unroll
        for (int32_t r = 0; r < kRows; ++r) sums[r] = acc[r][t];
        write_task<E>(p, rows, task, t, sums, rope);
      }
    }
  }
}

// Without the folded norm one group a block: the block scheduler balances small blocks. With it,
// a grid that fits on the GPU at once (resident blocks × SMs), each block running the fewest
// groups that cover the tasks, spread evenly: the norm is computed once a block.
template <int32_t kTokens, bool kNormed, Epilogue E>
cudaError_t launch_as(const GemvParams& p, int32_t tasks, LaunchStream stream) {
  constexpr auto kKernel = gemv_kernel<kTokens, kNormed, E>;
  const int32_t groups = (tasks + kGemvWarps - 1) / kGemvWarps;
  // The normalised input, then the norm weight (gemv_kernel).
  const size_t shared =
      kNormed ? size_t(p.tokens) * size_t(p.in) * sizeof(bf16) + size_t(p.in) * sizeof(float) : 0;
  int32_t per_block = 1;
  if constexpr (kNormed) {
    // Past 48 KB less the kernel's static shared memory a launch must have asked for its dynamic
    // shared memory (at exactly 48 KB, llama-8b at 6 tokens, the static part already puts it
    // over): kernels/kernel_fit.h grants it, per device, with how many blocks fit. A host call,
    // not a stream operation: a graph's capture may make it too.
    int32_t cap = 0;
    if (const cudaError_t status = resident_on_gpu<kKernel>(kGemvThreads, shared, &cap);
        status != cudaSuccess) {
      return status;
    }
    per_block = p.norm.block_per_group ? 1 : (groups + cap - 1) / cap;
  }
  const int32_t blocks = (groups + per_block - 1) / per_block;
  return launch_kernel(kKernel, blocks, kGemvThreads, shared, stream, p, tasks, per_block);
}

// Instantiated at 1, 2, 4 and 8 tokens: a token's arithmetic is the same in each.
template <bool kNormed, Epilogue E>
cudaError_t launch(const GemvParams& p, int32_t tasks, LaunchStream stream) {
  if (p.tokens == 1) return launch_as<1, kNormed, E>(p, tasks, stream);
  if (p.tokens == 2) return launch_as<2, kNormed, E>(p, tasks, stream);
  if (p.tokens <= 4) return launch_as<4, kNormed, E>(p, tasks, stream);
  return launch_as<8, kNormed, E>(p, tasks, stream);
}

bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

bool valid_shape(int32_t tokens, int32_t out, int32_t in, const bf16* w) {
  return tokens >= 1 && tokens <= kGemvTokensMax && out >= 1 && in >= 8 && in % 8 == 0 &&
         w != nullptr && aligned16(w);
}

bool valid_norm(const GemvNorm& norm, int32_t in) {
  return gemv_norm_fits(in) && norm.residual != nullptr && norm.weight != nullptr &&
         aligned16(norm.residual) && aligned16(norm.weight) && norm.eps > 0.0f;
}

}  // namespace

bool gemv_norm_fits(int32_t n) { return n % 8 == 0 && norm_vectorised(n); }

cudaError_t launch_gemv_bf16(const bf16* x, const bf16* w, float* y, int32_t tokens, int32_t out,
                             int32_t in, float beta, LaunchStream stream) {
  if (!valid_shape(tokens, out, in, w) || x == nullptr || y == nullptr || !aligned16(x)) {
    return cudaErrorInvalidValue;
  }
  GemvParams p{};
  p.w = w, p.tokens = tokens, p.out = out, p.in = in, p.x = x, p.y = y, p.beta = beta;
  return launch<false, Epilogue::kStore>(p, out, stream);
}

cudaError_t launch_gemv_norm_bf16(GemvNorm norm, const bf16* w, float* y, int32_t tokens,
                                  int32_t out, int32_t in, LaunchStream stream) {
  if (!valid_shape(tokens, out, in, w) || !valid_norm(norm, in) || y == nullptr) {
    return cudaErrorInvalidValue;
  }
  GemvParams p{};
  p.w = w, p.tokens = tokens, p.out = out, p.in = in, p.norm = norm, p.y = y, p.beta = 0.0f;
  return launch<true, Epilogue::kStore>(p, out, stream);
}

cudaError_t launch_gemv_norm_swiglu_bf16(GemvNorm norm, const bf16* w_gate_up, bf16* act,
                                         int32_t tokens, int32_t ffn, int32_t in,
                                         LaunchStream stream) {
  if (ffn < 1 || ffn > (1 << 30) || !valid_shape(tokens, 2 * ffn, in, w_gate_up) ||
      !valid_norm(norm, in) || act == nullptr) {
    return cudaErrorInvalidValue;
  }
  GemvParams p{};
  p.w = w_gate_up, p.tokens = tokens, p.out = 2 * ffn, p.in = in, p.norm = norm, p.act = act;
  return launch<true, Epilogue::kSwiglu>(p, ffn, stream);
}

cudaError_t launch_gemv_norm_rope_kv_bf16(GemvNorm norm, const bf16* w_qkv,
                                          const RopeKvTarget& target, int32_t tokens, int32_t in,
                                          LaunchStream stream) {
  const RopeKvTarget& r = target;
  if (r.query_heads < 1 || r.kv_heads < 1 || r.head_dim < 2 || r.head_dim % 2 != 0 ||
      r.positions_count < 1 || r.positions == nullptr || r.slots == nullptr ||
      r.cos == nullptr || r.sin == nullptr || r.q_out == nullptr || r.k_cache == nullptr ||
      r.v_cache == nullptr) {
    return cudaErrorInvalidValue;
  }
  const int64_t rows = int64_t{r.query_heads + 2 * r.kv_heads} * r.head_dim;
  if (rows > (int64_t{1} << 30) ||
      !valid_shape(tokens, static_cast<int32_t>(rows), in, w_qkv) || !valid_norm(norm, in)) {
    return cudaErrorInvalidValue;
  }
  GemvParams p{};
  p.w = w_qkv, p.tokens = tokens, p.out = static_cast<int32_t>(rows), p.in = in, p.norm = norm;
  p.rope = target;
  return launch<true, Epilogue::kRopeKv>(p, p.out / 2, stream);
}

}  // namespace ls::kernels
