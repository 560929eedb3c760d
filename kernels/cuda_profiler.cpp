// The profiler: phase marks between a step's kernels (options.profile) and the device's busy and
// idle time around each step (options.time_steps).
#include "kernels/cuda_backend_impl.h"

#include <limits>

namespace ls {

// A timing event between two phases (options.profile); inside a capture, an external event node.
void CudaBackend::Impl::mark(CudaPhase phase) {
  if (!options.profile) return;
  LS_ASSERT(marks_count < static_cast<int32_t>(mark_events.size()), "{} phase marks",
            marks_count);
  const size_t k = static_cast<size_t>(marks_count++);
  mark_phases[k] = phase;
  LS_CUDA(cudaEventRecordWithFlags(mark_events[k].get(), stream.get(),
                                   capturing ? cudaEventRecordExternal : cudaEventRecordDefault));
}

// After the step completed: the time between consecutive marks, summed per phase.
void CudaBackend::Impl::collect_marks() {
  if (!options.profile || !phase_totals.available || marks_count < 2) return;
  for (int32_t k = 1; k < marks_count; ++k) {
    float ms = 0.0f;
    const cudaError_t status = cudaEventElapsedTime(&ms, mark_events[k - 1].get(),
                                                    mark_events[k].get());
    if (status != cudaSuccess) {
      (void)cudaGetLastError();  // not sticky: the profile is given up, the step is fine
      phase_totals.available = false;
      return;
    }
    phase_totals.ms[static_cast<size_t>(mark_phases[static_cast<size_t>(k)])] += ms;
  }
  ++phase_totals.steps;
}

// After the step completed (options.time_steps): the device's idle time before it and its busy
// time, from the events stage() and enqueue_finish recorded.
void CudaBackend::Impl::collect_step_timing() {
  last_timing = CudaStepTiming{};
  if (!options.time_steps) return;
  const int64_t k = collected_count;
  auto elapsed_ms = [](const CudaEvent& from, const CudaEvent& to) {
    float ms = 0.0f;
    if (cudaEventElapsedTime(&ms, from.get(), to.get()) != cudaSuccess) {
      (void)cudaGetLastError();  // not sticky: the figure is given up, the step is fine
      return std::numeric_limits<double>::quiet_NaN();
    }
    return static_cast<double>(ms);
  };
  const CudaEvent& begin = step_begin_marks[static_cast<size_t>(k % kTimingSlots)];
  last_timing.busy_ms = elapsed_ms(begin, step_end_marks[static_cast<size_t>(k % kTimingSlots)]);
  if (k > 0) {
    last_timing.idle_before_ms =
        elapsed_ms(step_end_marks[static_cast<size_t>((k - 1) % kTimingSlots)], begin);
  }
}

std::string_view to_string(CudaPhase phase) {
  switch (phase) {
    case CudaPhase::kStateOps: return "state_ops";
    case CudaPhase::kEmbedding: return "embedding";
    case CudaPhase::kNorms: return "norms";
    case CudaPhase::kGemmQkv: return "gemm_qkv";
    case CudaPhase::kRope: return "rope_kv_write";
    case CudaPhase::kAttention: return "attention";
    case CudaPhase::kGemmO: return "gemm_o";
    case CudaPhase::kGemmGateUp: return "gemm_gate_up";
    case CudaPhase::kSwiglu: return "swiglu";
    case CudaPhase::kGemmDown: return "gemm_down";
    case CudaPhase::kLmHead: return "lm_head";
    case CudaPhase::kGuard: return "guard_argmax";
    case CudaPhase::kSampling: return "sampling_commit";
    case CudaPhase::kCopyBack: return "copy_back";
    case CudaPhase::kCount: break;
  }
  return "?";
}

}  // namespace ls
