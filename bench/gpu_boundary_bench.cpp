// What a dependent step between two pieces of decode work costs, apart from any model
// (kernels/boundary_probe.h): a chain of phases, each streaming its weights and then reading every
// block's output of the phase before, run three ways inside a CUDA graph, as a step runs —
//  * a kernel a phase in plain stream order,
//  * a kernel a phase overlapping its predecessor (programmatic dependent launch, the decode
//    step's way: weights loaded before the wait),
//  * one persistent kernel whose blocks wait at a grid barrier between phases
//    (kernels/grid_barrier.h: a persistent decode kernel's way, issue 14), of either shape:
//    cooperative groups' (fences, a generation) or CUTLASS's (a release add, acquire polls).
// A phase's time is the slope between a 96-phase and a 48-phase chain (so the graph's own launch
// drops out); what it costs above its bytes at the streaming read bandwidth measured in the same
// run is the boundary's cost. Phase sizes span the products of a decode step at batch 1 (0: the
// boundary alone; llama-1b's QKV moves 12.6 MB, its o 8.4, llama-8b's o 33.5). Grids of one and of
// four blocks an SM (the GEMVs run about three to four). Every form's outputs are checked to be
// the same bits as plain order's.
//
//   lockstep_gpu_boundary_bench [--iterations N]
#include "bench/gpu_bandwidth.h"
#include "bench/gpu_bench_main.h"
#include "kernels/boundary_probe.h"
#include "kernels/device_memory.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <vector>

namespace {

namespace kernels = ls::kernels;

constexpr int32_t kPhasesLong = 96;  // llama-1b's 16 layers × 6 kernels
constexpr int32_t kPhasesShort = 48;
constexpr int64_t kMiB = int64_t{1} << 20;
constexpr int64_t kPhaseBytes[] = {0, 2 * kMiB, 8 * kMiB, 32 * kMiB};

enum class Form { kPlain, kOverlapped, kPersistent, kPersistentCounting };
constexpr Form kForms[] = {Form::kPlain, Form::kOverlapped, Form::kPersistent,
                           Form::kPersistentCounting};

const char* name_of(Form form) {
  switch (form) {
    case Form::kPlain: return "kernel a phase, plain order";
    case Form::kOverlapped: return "kernel a phase, overlapped";
    case Form::kPersistent: return "persistent, grid sync";
    case Form::kPersistentCounting: return "persistent, counting barrier";
  }
  return "";
}

// The probe's chain of `probe.phases` phases in `form`, launched on `stream`.
void launch_chain(const kernels::BoundaryProbe& probe, Form form, cudaStream_t stream) {
  if (form == Form::kPersistent || form == Form::kPersistentCounting) {
    CHECK(kernels::launch_boundary_persistent(
        probe, form == Form::kPersistent ? kernels::ProbeBarrier::kGrid
                                         : kernels::ProbeBarrier::kCounting,
        stream));
    return;
  }
  const kernels::LaunchStream on(stream, form == Form::kOverlapped);
  for (int32_t phase = 0; phase < probe.phases; ++phase) {
    CHECK(kernels::launch_boundary_phase(probe, phase, on));
  }
}

// The chain captured into a graph (as a decode step runs), destroyed with this object.
struct ChainGraph {
  cudaGraphExec_t exec = nullptr;
  ChainGraph(const kernels::BoundaryProbe& probe, Form form, cudaStream_t stream) {
    cudaGraph_t graph = nullptr;
    CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
    launch_chain(probe, form, stream);
    CHECK(cudaStreamEndCapture(stream, &graph));
    CHECK(cudaGraphInstantiate(&exec, graph, 0));
    CHECK(cudaGraphDestroy(graph));
  }
  ~ChainGraph() { cudaGraphExecDestroy(exec); }
  ChainGraph(const ChainGraph&) = delete;
  ChainGraph& operator=(const ChainGraph&) = delete;
};

// The chain's last row of outputs after one launch that starts from rows 1.. poisoned (NaN), so
// that a phase reading a row before its predecessor wrote it shows.
std::vector<float> last_row(const kernels::BoundaryProbe& probe, Form form, cudaStream_t stream) {
  const size_t row = static_cast<size_t>(probe.blocks);
  CHECK(cudaMemsetAsync(probe.outputs + row, 0xff, row * probe.phases * sizeof(float), stream));
  const ChainGraph chain(probe, form, stream);
  CHECK(cudaGraphLaunch(chain.exec, stream));
  CHECK(cudaStreamSynchronize(stream));
  std::vector<float> out(row);
  CHECK(cudaMemcpy(out.data(), probe.outputs + row * probe.phases, row * sizeof(float),
                   cudaMemcpyDeviceToHost));
  return out;
}

// Seconds a phase in `form`: the slope between the long and the short chain.
double seconds_a_phase(kernels::BoundaryProbe probe, Form form, cudaStream_t stream,
                       int32_t iterations) {
  const auto seconds = [&](int32_t phases) {
    probe.phases = phases;
    const ChainGraph chain(probe, form, stream);
    return ls::bench::time_launches([&] { CHECK(cudaGraphLaunch(chain.exec, nullptr)); },
                                    iterations);
  };
  const double long_chain = seconds(kPhasesLong);
  const double short_chain = seconds(kPhasesShort);
  return (long_chain - short_chain) / (kPhasesLong - kPhasesShort);
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// Device memory for the largest case (kernels/device_memory.h owners).
struct Buffers {
  ls::DeviceArray<uint4> weights;
  ls::DeviceArray<float> outputs;
  ls::DeviceArray<kernels::GridBarrier> barrier{1};
  ls::DeviceArray<kernels::CountingBarrier> counter{1};
  Buffers(int64_t weight_bytes, int32_t blocks_max)
      : weights(static_cast<size_t>(weight_bytes) / sizeof(uint4)),
        outputs(size_t(kPhasesLong + 1) * blocks_max) {
    CHECK(cudaMemset(weights.get(), 0x5a, weights.bytes()));
    std::vector<float> input(outputs.count(), 0.0f);
    for (int32_t b = 0; b < blocks_max; ++b) input[b] = static_cast<float>(b % 7);
    CHECK(cudaMemcpy(outputs.get(), input.data(), outputs.bytes(), cudaMemcpyHostToDevice));
    CHECK(cudaMemset(barrier.get(), 0, barrier.bytes()));
  }
};

// One grid and phase size: each form's time a phase, its cost above the bytes, and the bits.
void run_case(const Buffers& buffers, int32_t blocks, int64_t phase_bytes, double read_bw,
              int32_t iterations, cudaStream_t stream) {
  kernels::BoundaryProbe probe;
  probe.weights = buffers.weights.get();
  probe.outputs = buffers.outputs.get();
  probe.barrier = buffers.barrier.get();
  probe.counter = buffers.counter.get();
  probe.phases = kPhasesLong;
  probe.phase_words = phase_bytes / 16;
  probe.blocks = blocks;
  const double streaming = static_cast<double>(phase_bytes) / read_bw;
  std::printf("  %lld MiB a phase, %d blocks: its bytes at the read bandwidth %.2f us\n",
              static_cast<long long>(phase_bytes / kMiB), blocks, streaming * 1e6);
  // The counting barrier's waits end at multiples of the grid's blocks: zeroed for this grid.
  CHECK(cudaMemset(buffers.counter.get(), 0, buffers.counter.bytes()));
  const std::vector<float> reference = last_row(probe, Form::kPlain, stream);
  for (const Form form : kForms) {
    if (!same_bits(last_row(probe, form, stream), reference)) {
      std::fprintf(stderr, "%s: outputs differ from plain order's\n", name_of(form));
      std::exit(1);
    }
    const double phase = seconds_a_phase(probe, form, stream, iterations);
    std::printf("    %-28s %6.2f us a phase, %6.2f above its bytes\n", name_of(form), phase * 1e6,
                (phase - streaming) * 1e6);
  }
}

void run(int32_t iterations) {
  const ls::bench::Bandwidth bandwidth = ls::bench::measure_and_print_bandwidth(20);
  int32_t device = 0, sms = 0, resident = 0;
  CHECK(cudaGetDevice(&device));
  CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
  CHECK(kernels::boundary_probe_resident_blocks(&resident));
  const int32_t grids[] = {sms, std::min(resident, 4 * sms)};
  const int64_t largest = *std::max_element(std::begin(kPhaseBytes), std::end(kPhaseBytes));
  const Buffers buffers(largest * kPhasesLong, grids[1]);
  cudaStream_t stream = nullptr;
  CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  std::printf("  a phase's time: the slope between %d and %d phases in one graph; every form's "
              "outputs are the same bits as plain order's\n",
              kPhasesLong, kPhasesShort);
  for (const int32_t blocks : grids) {
    for (const int64_t bytes : kPhaseBytes) {
      run_case(buffers, blocks, bytes, bandwidth.read, iterations, stream);
    }
  }
  CHECK(cudaStreamDestroy(stream));
}

}  // namespace

int main(int argc, char** argv) {
  const ls::bench::KernelBench bench{
      .name = "lockstep_gpu_boundary_bench",
      .description = "What a dependent step between phases of decode work costs: a kernel a "
                     "phase (plain or overlapped) against one persistent kernel",
      .subject = "boundary probe",
      .iterations = 50};
  return ls::bench::run_kernel_bench(argc, argv, bench, run);
}
