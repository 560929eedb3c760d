// The Mamba2 mixer kernels alone, on the H200 (kernels/mamba_ops.h, kernels/mamba_scan.h): one
// layer of Bamba-9B's mixer (128 heads of 64, one group, state 128, conv 4) at decode batch 1, 16,
// 64 and 128, a prefill chunk of 512 and 2048 tokens of one row through the sequential scan and the
// chunked (SSD) scan, and the slot copy, timed with CUDA events over back-to-back launches, with
// the bytes that must move and the bandwidth that is, against the device's streaming read
// bandwidth measured first in the same run (bench/gpu_bandwidth.h, as every GPU benchmark counts).
//
//   lockstep_gpu_mamba_bench [--iterations N]
//
// The floor a launch must move: each real row's fp32 state read and written once (conv window and
// SSM state), each token's in_proj output read and its gated-norm output (bf16) written. Decode is
// that stream of the states (its line gives the fraction of the read bandwidth; half the bytes are
// writes, so the floor is somewhat above a pure read's); prefill is compute-bound, so its lines
// give the time per layer, sequential against chunked.
#include "bench/gpu_bandwidth.h"
#include "bench/gpu_bench_main.h"
#include "kernels/mamba_ops.h"
#include "kernels/mamba_scan.h"

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <vector>

namespace {

namespace kernels = ls::kernels;
using ls::bench::time_launches;

const kernels::MambaShape kBamba9b{.heads_count = 128, .head_dim = 64, .groups_count = 1,
                                   .state_size = 128, .conv_kernel = 4, .dt_min = 0.0f,
                                   .dt_max = 1e30f, .rms_eps = 1e-5f};

// Device memory freed at scope exit.
struct Device {
  std::vector<void*> owned;
  template <typename T>
  T* alloc(size_t count, int byte) {
    void* p = nullptr;
    CHECK(cudaMalloc(&p, count * sizeof(T)));
    CHECK(cudaMemset(p, byte, count * sizeof(T)));
    owned.push_back(p);
    return static_cast<T*>(p);
  }
  template <typename T>
  T* upload(const std::vector<T>& v) {
    T* p = alloc<T>(v.size(), 0);
    CHECK(cudaMemcpy(p, v.data(), v.size() * sizeof(T), cudaMemcpyHostToDevice));
    return p;
  }
  ~Device() {
    for (void* p : owned) cudaFree(p);
  }
};

void print_line(const char* what, int32_t rows, int32_t tokens, double seconds, double bytes,
                double read_bw) {
  std::printf("  %-18s rows %3d tokens %4d: %9.1f us/launch, %8.1f MB, %5.2f TB/s (%4.1f%% of "
              "read)\n",
              what, rows, tokens, seconds * 1e6, bytes * 1e-6, bytes / seconds * 1e-12,
              100.0 * bytes / seconds / read_bw);
}

enum class Scan { kSequential, kChunked };

// `rows` rows of `tokens_per_row` tokens each, on slots 0 .. rows − 1 (zero states: the kernels'
// time does not depend on the values; the proj bytes 0x3c give finite inputs), each row from
// position 0 (the chunked scan's blocks start at its first token).
void run_mixer(int32_t rows, int32_t tokens_per_row, Scan scan, int32_t iterations,
               double read_bw) {
  const kernels::MambaShape& s = kBamba9b;
  const int32_t tokens = rows * tokens_per_row;
  const int64_t slot_floats = s.conv_state_floats() + s.ssm_state_floats();
  Device d;
  float* pool = d.alloc<float>(size_t(rows) * slot_floats, 0);
  float* proj = d.alloc<float>(size_t(tokens) * s.in_proj_size(), 0x3c);
  const size_t workspace_floats = scan == Scan::kChunked
                                      ? kernels::mamba_chunked_workspace_floats(s, tokens)
                                      : kernels::mamba_workspace_floats(s, tokens);
  float* workspace = d.alloc<float>(workspace_floats, 0);
  __nv_bfloat16* out = d.alloc<__nv_bfloat16>(size_t(tokens) * s.inner_size(), 0);
  float* conv_weight = d.alloc<float>(size_t(s.conv_state_floats()), 0x3c);
  float* heads = d.alloc<float>(size_t(s.heads_count), 0);
  float* norm = d.alloc<float>(size_t(s.inner_size()), 0x3c);
  std::vector<int32_t> offsets, counts(size_t(rows), tokens_per_row), slots, positions;
  for (int32_t r = 0; r < rows; ++r) offsets.push_back(r * tokens_per_row), slots.push_back(r);
  for (int32_t t = 0; t < tokens; ++t) positions.push_back(t % tokens_per_row);
  const int32_t* d_positions = d.upload(positions);
  const kernels::MambaRows device_rows{.token_offsets = d.upload(offsets),
                                       .token_counts = d.upload(counts),
                                       .slots = d.upload(slots), .rows_grid = rows};
  const kernels::MambaLayerParams params{.conv_weight = conv_weight, .conv_bias = nullptr,
                                         .dt_bias = heads, .a_log = heads, .d_skip = heads,
                                         .norm_weight = norm};
  const kernels::MambaStateView state{.conv = pool, .ssm = pool + s.conv_state_floats(),
                                      .slot_stride_floats = slot_floats};
  const double seconds = time_launches(
      [&] {
        if (scan == Scan::kChunked) {
          CHECK(kernels::launch_mamba_mixer_chunked(s, params, state, device_rows, d_positions,
                                                    proj, tokens, workspace, workspace_floats, out,
                                                    nullptr));
        } else {
          CHECK(kernels::launch_mamba_mixer(s, params, state, device_rows, proj, tokens,
                                            workspace, workspace_floats, out, nullptr));
        }
      },
      iterations);
  const double state_bytes = static_cast<double>(slot_floats * int64_t{sizeof(float)});
  const double token_bytes = static_cast<double>(int64_t{s.in_proj_size()} * 4 +
                                                 int64_t{s.inner_size()} * 2);  // fp32 in, bf16 out
  const double bytes = rows * state_bytes * 2 + tokens * token_bytes;
  const char* what = tokens_per_row == 1       ? "decode"
                     : scan == Scan::kChunked ? "prefill chunked"
                                              : "prefill sequential";
  print_line(what, rows, tokens, seconds, bytes, read_bw);
}

// Copies `pairs` whole slots of 32 Mamba layers (Bamba-9B's slot), distinct sources and targets.
void run_copy(int32_t pairs, int32_t iterations, double read_bw) {
  const int64_t slot_floats = 32 * (kBamba9b.conv_state_floats() + kBamba9b.ssm_state_floats());
  Device d;
  float* pool = d.alloc<float>(size_t(2 * pairs) * slot_floats, 0);
  std::vector<int32_t> list;
  for (int32_t p = 0; p < pairs; ++p) list.push_back(p), list.push_back(pairs + p);
  const int32_t* d_list = d.upload(list);
  const double seconds = time_launches(
      [&] { CHECK(kernels::launch_mamba_copy_slots(pool, slot_floats, d_list, pairs, nullptr)); },
      iterations);
  const double slot_bytes = static_cast<double>(slot_floats * int64_t{sizeof(float)});
  print_line("copy", pairs, 0, seconds, pairs * slot_bytes * 2, read_bw);
}

}  // namespace

int main(int argc, char** argv) {
  const ls::bench::KernelBench bench{
      .name = "lockstep_gpu_mamba_bench",
      .description = "The Mamba2 mixer kernels alone: decode, prefill (sequential and chunked "
                     "scans) and slot copies of Bamba-9B's mixer against the bytes they must "
                     "move and the read bandwidth",
      .subject = "Mamba2 mixer (one Bamba-9B layer, bf16 out, fp32 state)",
      .iterations = 20};
  return ls::bench::run_kernel_bench(argc, argv, bench, [](int32_t iterations) {
    const double read_bw = ls::bench::measure_and_print_bandwidth(30).read;
    for (const int32_t batch : {1, 16, 64, 128}) {
      run_mixer(batch, 1, Scan::kSequential, iterations, read_bw);
    }
    for (const int32_t chunk : {512, 2048}) {
      for (const Scan scan : {Scan::kSequential, Scan::kChunked}) {
        run_mixer(1, chunk, scan, iterations, read_bw);
      }
    }
    for (const int32_t pairs : {1, 8}) run_copy(pairs, iterations, read_bw);
  });
}
