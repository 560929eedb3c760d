// The profiler: phase marks between a step's kernels (options.profile) and the device's busy and
// idle time around each step (options.time_steps).
#include "kernels/cuda_backend_impl.h"

#include <limits>

namespace ls {

void PhaseMarks::create(size_t marks_max) {
  for (size_t i = 0; i < marks_max; ++i) events.push_back(CudaEvent::create(true));
  phases.assign(marks_max, CudaPhase::kCount);
}

void PhaseMarks::mark(cudaStream_t stream, CudaPhase phase) {
  if (!on()) return;
  LS_ASSERT(count < static_cast<int32_t>(events.size()), "{} phase marks", count);
  const size_t k = static_cast<size_t>(count++);
  phases[k] = phase;
  LS_CUDA(cudaEventRecordWithFlags(events[k].get(), stream,
                                   capturing ? cudaEventRecordExternal : cudaEventRecordDefault));
}

void PhaseMarks::collect() {
  if (!on() || !totals.available || count < 2) return;
  for (int32_t k = 1; k < count; ++k) {
    float ms = 0.0f;
    const cudaError_t status = cudaEventElapsedTime(&ms, events[k - 1].get(), events[k].get());
    if (status != cudaSuccess) {
      (void)cudaGetLastError();  // not sticky: the profile is given up, the step is fine
      totals.available = false;
      return;
    }
    totals.ms[static_cast<size_t>(phases[static_cast<size_t>(k)])] += ms;
  }
  ++totals.steps;
}

void StepTimer::create() {
  on = true;
  for (auto& event : begin_marks) event = CudaEvent::create(true);
  for (auto& event : end_marks) event = CudaEvent::create(true);
}

void StepTimer::record_begin(int64_t step, cudaStream_t stream) {
  if (!on) return;
  LS_CUDA(cudaEventRecord(begin_marks[static_cast<size_t>(step % kSlots)].get(), stream));
}

void StepTimer::record_end(int64_t step, cudaStream_t stream) {
  if (!on) return;
  LS_CUDA(cudaEventRecord(end_marks[static_cast<size_t>(step % kSlots)].get(), stream));
}

void StepTimer::collect(int64_t step) {
  last = CudaStepTiming{};
  if (!on) return;
  const int64_t k = step;
  auto elapsed_ms = [](const CudaEvent& from, const CudaEvent& to) {
    float ms = 0.0f;
    if (cudaEventElapsedTime(&ms, from.get(), to.get()) != cudaSuccess) {
      (void)cudaGetLastError();  // not sticky: the figure is given up, the step is fine
      return std::numeric_limits<double>::quiet_NaN();
    }
    return static_cast<double>(ms);
  };
  const CudaEvent& begin = begin_marks[static_cast<size_t>(k % kSlots)];
  last.busy_ms = elapsed_ms(begin, end_marks[static_cast<size_t>(k % kSlots)]);
  if (k > 0) {
    last.idle_before_ms = elapsed_ms(end_marks[static_cast<size_t>((k - 1) % kSlots)], begin);
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

std::string_view to_string(LeaveOut what) {
  switch (what) {
    case LeaveOut::kQkv: return "qkv";
    case LeaveOut::kAttention: return "attention";
    case LeaveOut::kCombine: return "attention_combine";
    case LeaveOut::kAttentionBody: return "attention_body";
    case LeaveOut::kAttentionKvReads: return "attention_kv_reads";
    case LeaveOut::kAttentionArithmetic: return "attention_arithmetic";
    case LeaveOut::kO: return "o";
    case LeaveOut::kGateUp: return "gate_up";
    case LeaveOut::kDown: return "down";
    case LeaveOut::kLayers: return "layers";
  }
  return "?";
}

}  // namespace ls
