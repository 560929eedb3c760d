// Decode attention alone, on the H200: the paged split-KV kernel (and its combine) for llama-1b's
// and llama-8b's head layouts at batch 1, 16, 64 and contexts 1024 and 4096, timed with CUDA
// events over back-to-back launches, with the KV bytes read and the bandwidth that is.
//
//   lockstep_gpu_attention_bench [--iterations N]
//
// The KV a decode token must read is the floor: tokens · kv_heads · keys · head_dim · 2 (K and V)
// · 2 bytes. The step benchmark (lockstep_gpu_bench) shows attention's share of a whole step;
// this one isolates the kernel so its changes can be measured on their own.
#include "bench/gpu_bench_main.h"
#include "kernels/attention.h"

#include <cuda_bf16.h>
#include <cuda_runtime.h>

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

void run_case(const Heads& h, int32_t batch, int32_t context, int32_t iterations) {
  using bf16 = __nv_bfloat16;
  const int32_t width = (context + kPageSize) / kPageSize + 1;  // room for position `context`
  const int32_t rows = batch + 1;                               // pool row 0 unused
  const int64_t slots = (int64_t{rows} * width + 1) * kPageSize;
  const int64_t kv_size = int64_t{h.kv_heads} * h.head_dim;
  kernels::AttentionShape shape{h.query_heads, h.kv_heads, h.head_dim, width, kPageSize,
                                width * kPageSize};
  std::vector<int32_t> table(static_cast<size_t>(rows) * width, 0);
  for (int32_t r = 1; r < rows; ++r) {
    for (int32_t p = 0; p < width; ++p) table[static_cast<size_t>(r) * width + p] = 1 + r * width + p;
  }
  std::vector<int32_t> positions(static_cast<size_t>(batch), context);  // context + 1 keys
  std::vector<int32_t> pool_rows(static_cast<size_t>(batch));
  for (int32_t b = 0; b < batch; ++b) pool_rows[static_cast<size_t>(b)] = b + 1;

  bf16 *k = nullptr, *v = nullptr, *out = nullptr;
  float *q = nullptr, *workspace = nullptr;
  int32_t *d_table = nullptr, *d_positions = nullptr, *d_rows = nullptr;
  const size_t workspace_floats = kernels::attention_workspace_floats(shape, batch);
  const size_t q_count = static_cast<size_t>(batch) * h.query_heads * h.head_dim;
  CHECK(cudaMalloc(&k, static_cast<size_t>(slots * kv_size) * sizeof(bf16)));
  CHECK(cudaMalloc(&v, static_cast<size_t>(slots * kv_size) * sizeof(bf16)));
  CHECK(cudaMalloc(&out, q_count * sizeof(bf16)));
  CHECK(cudaMalloc(&q, q_count * sizeof(float)));
  CHECK(cudaMalloc(&workspace, workspace_floats * sizeof(float)));
  CHECK(cudaMalloc(&d_table, table.size() * 4));
  CHECK(cudaMalloc(&d_positions, positions.size() * 4));
  CHECK(cudaMalloc(&d_rows, pool_rows.size() * 4));
  CHECK(cudaMemset(k, 0x3c, static_cast<size_t>(slots * kv_size) * sizeof(bf16)));  // ~0.0115
  CHECK(cudaMemset(v, 0x3c, static_cast<size_t>(slots * kv_size) * sizeof(bf16)));
  CHECK(cudaMemset(q, 0, q_count * sizeof(float)));
  CHECK(cudaMemcpy(d_table, table.data(), table.size() * 4, cudaMemcpyHostToDevice));
  CHECK(cudaMemcpy(d_positions, positions.data(), positions.size() * 4, cudaMemcpyHostToDevice));
  CHECK(cudaMemcpy(d_rows, pool_rows.data(), pool_rows.size() * 4, cudaMemcpyHostToDevice));

  const auto launch = [&] {
    CHECK(kernels::launch_paged_attention(shape, q, k, v, d_positions, d_rows, d_table, batch,
                                          /*prefill_tokens_count=*/0,
                                          kernels::AttentionPrefill::kTiles, workspace,
                                          workspace_floats, out, nullptr));
  };
  for (int32_t i = 0; i < 3; ++i) launch();
  cudaEvent_t begin = nullptr, end = nullptr;
  CHECK(cudaEventCreate(&begin));
  CHECK(cudaEventCreate(&end));
  CHECK(cudaEventRecord(begin));
  for (int32_t i = 0; i < iterations; ++i) launch();
  CHECK(cudaEventRecord(end));
  CHECK(cudaEventSynchronize(end));
  float ms = 0;
  CHECK(cudaEventElapsedTime(&ms, begin, end));
  const double seconds = ms * 1e-3 / iterations;
  const double bytes = double(batch) * h.kv_heads * (context + 1) * h.head_dim * 2 * sizeof(bf16);
  std::printf("  %-9s batch %2d context %4d: %8.1f us/launch, %7.1f MB KV, %5.2f TB/s\n", h.name,
              batch, context, seconds * 1e6, bytes * 1e-6, bytes / seconds * 1e-12);
  cudaEventDestroy(begin);
  cudaEventDestroy(end);
  for (void* p : {static_cast<void*>(k), static_cast<void*>(v), static_cast<void*>(out),
                  static_cast<void*>(q), static_cast<void*>(workspace),
                  static_cast<void*>(d_table), static_cast<void*>(d_positions),
                  static_cast<void*>(d_rows)}) {
    cudaFree(p);
  }
}

}  // namespace

int main(int argc, char** argv) {
  const ls::bench::KernelBench bench{
      .name = "lockstep_gpu_attention_bench",
      .description = "Decode attention alone: bandwidth of the split-KV kernel per head layout, "
                     "batch and context",
      .subject = "decode attention (bf16 KV, one layer)",
      .iterations = 50};
  return ls::bench::run_kernel_bench(argc, argv, bench, [](int32_t iterations) {
    for (const Heads& h : {Heads{"llama-1b", 32, 8, 64}, Heads{"llama-8b", 32, 8, 128}}) {
      for (const int32_t context : {1024, 4096}) {
        for (const int32_t batch : {1, 16, 64}) run_case(h, batch, context, iterations);
      }
    }
  });
}
