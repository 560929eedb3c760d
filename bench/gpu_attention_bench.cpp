// Paged attention alone, on the H200: the split-KV kernels (and the combine) for llama-1b's and
// llama-8b's head layouts, timed with CUDA events over back-to-back launches. Decode at batch 1,
// 16, 64 and contexts 1024 and 4096, with the KV bytes read and the bandwidth that is; prefill of
// a 2048-token chunk from an empty cache and of a 512-token chunk over a 1536-token prefix, with
// the effective TFLOP/s of the causal products; a step of both (the 512-token chunk, then 64
// decode rows, as the backend lays a mixed step out). Prefill and mixed steps run twice: with the
// tile kernel taking the chunk (AttentionPrefill::kTiles, the default mode) and with the decode
// kernel taking every token (kDecodeKernel, batch-invariant mode).
//
//   lockstep_gpu_attention_bench [--iterations N]
//
// The KV a decode token must read is the floor: tokens · kv_heads · keys · head_dim · 2 (K and V)
// · 2 bytes; each decode figure is also given as a fraction of the streaming read bandwidth
// measured at the start of the same run (bench/gpu_bandwidth.h, as lockstep_gpu_bench counts).
// The step benchmark (lockstep_gpu_bench) shows attention's share of a whole step; this one
// isolates the kernel so its changes can be measured on their own.
#include "bench/gpu_bandwidth.h"
#include "bench/gpu_bench_main.h"
#include "kernels/attention.h"

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

namespace {

namespace kernels = ls::kernels;

struct Heads {
  const char* name;
  int32_t query_heads, kv_heads, head_dim;
};

constexpr int32_t kPageSize = 16;

// One launch's tokens: `rows` sequences (pool rows 1 ..), each token's row and position; the first
// prefill_tokens are prefill chunks'.
struct Step {
  std::vector<int32_t> positions, pool_rows;
  int32_t rows = 0, context_max = 0, prefill_tokens = 0;
};

// `batch` decode tokens, one a sequence, each at position `context` (context + 1 keys).
Step decode_step(int32_t batch, int32_t context) {
  Step step{{}, {}, batch, context, 0};
  for (int32_t b = 0; b < batch; ++b) {
    step.positions.push_back(context), step.pool_rows.push_back(b + 1);
  }
  return step;
}

// A prefill chunk of `chunk` tokens of one sequence over `prefix` cached positions.
Step prefill_step(int32_t prefix, int32_t chunk) {
  Step step{{}, {}, 1, prefix + chunk - 1, chunk};
  for (int32_t t = 0; t < chunk; ++t) {
    step.positions.push_back(prefix + t), step.pool_rows.push_back(1);
  }
  return step;
}

const char* name_of(kernels::AttentionPrefill prefill) {
  return prefill == kernels::AttentionPrefill::kTiles ? "tiles" : "decode kernel";
}

// Times `iterations` back-to-back launches of the step, its prefill tokens taken as `prefill`
// says; seconds per launch.
double time_step(const Heads& h, const Step& step, kernels::AttentionPrefill prefill,
                 int32_t iterations) {
  using bf16 = __nv_bfloat16;
  const int32_t tokens = static_cast<int32_t>(step.positions.size());
  const int32_t width = (step.context_max + kPageSize) / kPageSize + 1;  // room for the last key
  const int32_t rows = step.rows + 1;                                    // pool row 0 unused
  const int64_t slots = (int64_t{rows} * width + 1) * kPageSize;
  const int64_t kv_size = int64_t{h.kv_heads} * h.head_dim;
  kernels::AttentionShape shape{h.query_heads, h.kv_heads, h.head_dim, width, kPageSize,
                                width * kPageSize};
  std::vector<int32_t> table(static_cast<size_t>(rows) * width, 0);
  for (int32_t r = 1; r < rows; ++r) {
    for (int32_t p = 0; p < width; ++p) table[static_cast<size_t>(r) * width + p] = 1 + r * width + p;
  }
  bf16 *k = nullptr, *v = nullptr, *out = nullptr;
  float *q = nullptr, *workspace = nullptr;
  int32_t *d_table = nullptr, *d_positions = nullptr, *d_rows = nullptr;
  const size_t workspace_floats = kernels::attention_workspace_floats(shape, tokens);
  const size_t q_count = static_cast<size_t>(tokens) * h.query_heads * h.head_dim;
  const size_t kv_bytes = static_cast<size_t>(slots * kv_size) * sizeof(bf16);
  CHECK(cudaMalloc(&k, kv_bytes));
  CHECK(cudaMalloc(&v, kv_bytes));
  CHECK(cudaMalloc(&out, q_count * sizeof(bf16)));
  CHECK(cudaMalloc(&q, q_count * sizeof(float)));
  CHECK(cudaMalloc(&workspace, workspace_floats * sizeof(float)));
  CHECK(cudaMalloc(&d_table, table.size() * 4));
  CHECK(cudaMalloc(&d_positions, step.positions.size() * 4));
  CHECK(cudaMalloc(&d_rows, step.pool_rows.size() * 4));
  CHECK(cudaMemset(k, 0x3c, kv_bytes));  // bf16 ~0.0115, never zeros
  CHECK(cudaMemset(v, 0x3c, kv_bytes));
  CHECK(cudaMemset(q, 0x3c, q_count * sizeof(float)));  // fp32 ~0.0115
  CHECK(cudaMemcpy(d_table, table.data(), table.size() * 4, cudaMemcpyHostToDevice));
  CHECK(cudaMemcpy(d_positions, step.positions.data(), step.positions.size() * 4,
                   cudaMemcpyHostToDevice));
  CHECK(cudaMemcpy(d_rows, step.pool_rows.data(), step.pool_rows.size() * 4,
                   cudaMemcpyHostToDevice));
  const auto launch = [&] {
    CHECK(kernels::launch_paged_attention(shape, q, k, v, d_positions, d_rows, d_table, tokens,
                                          step.prefill_tokens, prefill, workspace,
                                          workspace_floats, out, nullptr));
  };
  const double seconds = ls::bench::time_launches(launch, iterations);
  for (void* p : {static_cast<void*>(k), static_cast<void*>(v), static_cast<void*>(out),
                  static_cast<void*>(q), static_cast<void*>(workspace),
                  static_cast<void*>(d_table), static_cast<void*>(d_positions),
                  static_cast<void*>(d_rows)}) {
    cudaFree(p);
  }
  return seconds;
}

// Decode: the KV every token must read (its keys · kv_heads · head_dim · K and V · 2 bytes) over
// the time, the read bandwidth that is, and its fraction of the measured streaming read.
void run_decode(const Heads& h, int32_t batch, int32_t context, int32_t iterations,
                double read_bandwidth) {
  const double seconds =
      time_step(h, decode_step(batch, context), kernels::AttentionPrefill::kTiles, iterations);
  const double bytes = double(batch) * h.kv_heads * (context + 1) * h.head_dim * 2 * 2;
  std::printf("  decode  %-9s batch %2d context %4d: %8.1f us/launch, %7.1f MB KV, %5.2f TB/s, "
              "%5.1f%% of read BW\n",
              h.name, batch, context, seconds * 1e6, bytes * 1e-6, bytes / seconds * 1e-12,
              100.0 * bytes / seconds / read_bandwidth);
}

// Prefill: the causal products (scores and weighted values, 2 · head_dim FLOPs a key each, for
// every query head and every key a token attends to) over the time.
void run_prefill(const Heads& h, int32_t prefix, int32_t chunk, kernels::AttentionPrefill prefill,
                 int32_t iterations) {
  const double seconds = time_step(h, prefill_step(prefix, chunk), prefill, iterations);
  double keys = 0;
  for (int32_t t = 0; t < chunk; ++t) keys += prefix + t + 1;
  const double flops = keys * h.query_heads * h.head_dim * 4;
  std::printf("  prefill %-9s chunk %4d prefix %4d (%-13s): %8.1f us/launch, %6.1f TFLOP/s\n",
              h.name, chunk, prefix, name_of(prefill), seconds * 1e6, flops / seconds * 1e-12);
}

// A mixed step: a prefill chunk (pool row 1) then `batch` decode rows at `context` (pool rows
// 2 ..), one launch; compare with the decode and prefill figures of its parts.
void run_mixed(const Heads& h, int32_t batch, int32_t context, int32_t prefix, int32_t chunk,
               kernels::AttentionPrefill prefill, int32_t iterations) {
  Step step = prefill_step(prefix, chunk);
  for (int32_t b = 0; b < batch; ++b) {
    step.positions.push_back(context), step.pool_rows.push_back(b + 2);
  }
  step.rows = batch + 1;
  step.context_max = std::max(step.context_max, context);
  const double seconds = time_step(h, step, prefill, iterations);
  std::printf(
      "  mixed   %-9s chunk %4d prefix %4d + batch %2d context %4d (%-13s): %8.1f us/launch\n",
      h.name, chunk, prefix, batch, context, name_of(prefill), seconds * 1e6);
}

}  // namespace

int main(int argc, char** argv) {
  const ls::bench::KernelBench bench{
      .name = "lockstep_gpu_attention_bench",
      .description = "Paged attention alone: decode bandwidth per head layout, batch and "
                     "context; prefill TFLOP/s per chunk",
      .subject = "paged attention (bf16 KV, one layer)",
      .iterations = 50};
  return ls::bench::run_kernel_bench(argc, argv, bench, [](int32_t iterations) {
    const ls::bench::Bandwidth ceiling = ls::bench::measure_and_print_bandwidth(30);
    for (const Heads& h : {Heads{"llama-1b", 32, 8, 64}, Heads{"llama-8b", 32, 8, 128}}) {
      for (const int32_t context : {1024, 4096}) {
        for (const int32_t batch : {1, 16, 64}) {
          run_decode(h, batch, context, iterations, ceiling.read);
        }
      }
      for (const auto prefill : {kernels::AttentionPrefill::kTiles,
                                 kernels::AttentionPrefill::kDecodeKernel}) {
        run_prefill(h, 0, 2048, prefill, iterations);
        run_prefill(h, 1536, 512, prefill, iterations);
        run_mixed(h, 64, 1024, 1536, 512, prefill, iterations);
      }
    }
  });
}
