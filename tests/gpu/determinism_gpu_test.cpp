// The determinism line of issue 6 on the CUDA backend: a trace recorded on it (serving loop +
// trace::Recorder, a mixed workload of greedy and sampled requests with chunked prefill, ≥ 200
// steps) replays bit-identical on it in exact mode — with CUDA graphs, as recorded, and eagerly —
// and the same trace replayed teacher-forced on the CPU reference reports its agreement.
#include "core/serving_loop.h"
#include "kernels/cuda_backend.h"
#include "replay/replay.h"
#include "tests/gpu/gpu_test_support.h"
#include "tests/test_support.h"
#include "trace/recorder.h"
#include "trace/trace_observer.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <memory>
#include <utility>

namespace ls {
namespace {

constexpr int32_t kStepsMin = 200;

std::vector<RequestSpec> mixed_requests(int32_t vocab) {
  std::vector<RequestSpec> out;
  for (int32_t i = 0; i < 48; ++i) {
    RequestSpec r;
    r.id = static_cast<RequestId>(i + 1);
    const int32_t length = 5 + (i * 37) % 180;  // up to 184 tokens: chunked under a 64 budget
    r.prompt = testing::prompt_for(r.id, length, vocab);
    r.max_new_tokens = 16 + (i * 11) % 64;
    if (i % 3 == 1) {
      r.sampling.temperature = 0.8f, r.sampling.top_k = 40;
    } else if (i % 3 == 2) {
      r.sampling.temperature = 1.1f, r.sampling.top_p = 0.9f, r.sampling.seed = 1000 + i;
    }
    out.push_back(std::move(r));
  }
  return out;
}

TEST(CudaDeterminism, TraceRecordedOnCudaReplaysBitIdentical) {
  LS_SKIP_WITHOUT_DEVICE();
  const ModelWeights& weights = testing::tiny_weights();
  const int32_t vocab = weights.config.vocab_size;
  SchedulerConfig sc;
  sc.max_batch_rows = 16;
  sc.prefill_chunk_tokens = 64;
  sc.page_size = 16;
  sc.pages_count = 400;
  sc.context_length = 256;
  const ExecutorConfig ec = executor_config_for(sc);
  const std::filesystem::path path =
      std::filesystem::temp_directory_path() / "lockstep_cuda_determinism.trace";
  {
    CudaBackend cuda(weights, ec, CudaBackendOptions{.graphs = true});
    Scheduler scheduler(sc);
    for (const RequestSpec& r : mixed_requests(vocab)) scheduler.submit(r, vocab);
    Executor executor(ec, vocab, cuda, trace::recording_executor_options());
    trace::MachineInfo machine;
    const CudaMachineInfo info = cuda_machine_info();
    machine.gpu_name = info.gpu_name;
    machine.sm_count = std::stoi(info.sm_count);
    machine.driver_version = info.driver_version;
    machine.cuda_version = info.runtime_version;
    machine.cublas_version = info.cublas_version;
    auto recorder = trace::Recorder::open(
        path, trace::make_trace_header(weights, WeightSource{WeightSource::Kind::kSeed, 7, ""}, ec,
                                       cuda.name(), machine));
    trace::TraceObserver observer(*recorder);
    const ServingProgress done =
        run_serving_loop(scheduler, executor, ServingLoopOptions{.observer = &observer});
    recorder->close();
    ASSERT_GE(done.steps_count, kStepsMin);
    std::printf("determinism: recorded %ld steps (%ld tokens) on CUDA (bf16, graphs) to %s\n",
                static_cast<long>(done.steps_count), static_cast<long>(done.tokens_generated),
                path.string().c_str());
  }
  // Recorded with graphs, the forward's kernels overlapped and the decode GEMV's fused forms (the
  // defaults); replayed in every combination of the first two, and unfused with and without
  // graphs: none changes a bit (the logits rows' digests compare every logit).
  struct Replayed {
    bool graphs, overlap, fused;
  };
  for (const Replayed r : {Replayed{true, true, true}, Replayed{false, true, true},
                           Replayed{true, false, true}, Replayed{false, false, true},
                           Replayed{true, true, false}, Replayed{false, true, false}}) {
    const bool graphs = r.graphs, overlap = r.overlap, fused = r.fused;
    replay::ReplayOptions options;
    options.mode = replay::ReplayMode::kExact;
    options.weights = &weights;
    options.make_backend = [graphs, overlap, fused](const ModelWeights& w, const ExecutorConfig& c,
                                                    const std::string& /*drafter: none here*/,
                                                    int32_t /*tp_degree: 1 in this trace*/) {
      return make_cuda_backend(w, c, CudaBackendOptions{.graphs = graphs,
                                                        .overlap_kernels = overlap,
                                                        .fuse_decode = fused});
    };
    const replay::ReplayReport report = replay::replay_trace(path, options);
    EXPECT_EQ(report.header.machine.gpu_name, cuda_machine_info().gpu_name);
    EXPECT_EQ(report.backend, "cuda");
    EXPECT_GE(report.steps_compared, kStepsMin);
    EXPECT_FALSE(report.divergence.has_value())
        << "graphs " << graphs << " overlap " << overlap << " fused " << fused
        << ": diverged at step " << report.divergence->step << ", field "
        << report.divergence->field << ": expected " << report.divergence->expected << ", actual "
        << report.divergence->actual;
    std::printf("determinism: exact replay on CUDA (graphs %d, kernels overlapped %d, decode "
                "fused %d): %ld steps compared, %s\n",
                graphs ? 1 : 0, overlap ? 1 : 0, fused ? 1 : 0,
                static_cast<long>(report.steps_compared),
                report.divergence ? "DIVERGED" : "IDENTICAL");
  }
  replay::ReplayOptions cpu_options;
  cpu_options.mode = replay::ReplayMode::kTeacherForced;
  cpu_options.weights = &weights;
  const replay::ReplayReport cpu = replay::replay_trace(path, cpu_options);
  const double agreement = cpu.tokens_count > 0 ? double(cpu.tokens_equal) / double(cpu.tokens_count) : 0;
  std::printf("determinism: teacher-forced replay on the CPU reference: %ld/%ld tokens equal "
              "(%.2f%%), max |Δlogit| over the recorded top-8 %.4g, top-1 ids equal in %ld of %ld "
              "logits rows\n",
              static_cast<long>(cpu.tokens_equal), static_cast<long>(cpu.tokens_count),
              100 * agreement, cpu.logit_delta_max, static_cast<long>(cpu.top1_equal),
              static_cast<long>(cpu.top1_count));
  EXPECT_EQ(cpu.backend, "cpu");
  EXPECT_GE(cpu.steps_compared, kStepsMin);
  // bf16 against fp32 with inputs forced equal every step: tokens differ only where bf16 rounding
  // flips a near tie (this random tiny model's top-2 logits are often within 1e-3), so the claim
  // checked is the logits': every recorded top-8 logit within the bf16 tolerance of the CPU's.
  EXPECT_GT(agreement, 0.5);
  EXPECT_LT(cpu.logit_delta_max, 0.05f);
  std::filesystem::remove(path);
}

}  // namespace
}  // namespace ls
