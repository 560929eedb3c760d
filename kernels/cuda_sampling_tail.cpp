// The sampling tail, rules 5–9 of a step: guard, sampler (stochastic rows), verify/commit,
// drafter and the record, then the one packed copy of the results back.
#include "kernels/cuda_backend_impl.h"

#include "kernels/drafter_ops.h"
#include "kernels/logits_ops.h"
#include "kernels/sampling_ops.h"
#include "kernels/state_ops.h"

#include <algorithm>

namespace ls {

// Rules 5–9: guard, (stochastic rows: weights and sort), finish, drafter, one packed copy back.
// A step whose tail is in its graph only copies back here.
void CudaBackend::Impl::enqueue_tail(const StepPlan& plan) {
  if (!tail_in_graph) {
    const bool stochastic = std::any_of(plan.sampling.begin(), plan.sampling.end(),
                                        [](const ResolvedSampling& x) { return x.top_k != 1; });
    enqueue_tail_kernels(plan.logits_rows_count(), plan.rows_count, stochastic,
                         plan.want_logprobs, plan.record ? plan.top_logits_count : kNotRecorded);
  }
  // Into this step's pinned buffer; enqueue_finish records its step_done after this copy.
  LS_CUDA(cudaMemcpyAsync(host_results[static_cast<size_t>(steps_count & 1)].get(), results.get(),
                          results_layout.copy_words(plan) * sizeof(int32_t),
                          cudaMemcpyDeviceToHost, stream.get()));
  mark(CudaPhase::kCopyBack);
}

// The tail's kernels over `logits_rows` logits rows and `rows` rows (a graph's: its bucket's,
// padding included — the finish and drafter kernels skip rows past the staged header's count,
// the guard's work on padding rows is never read). `sums`: the guard's row max and sum of
// exponentials, for log-probabilities (a graph always computes them; the header says whether
// the finish uses them). Greedy rows read the guard's argmax: the sampler's weights and sort run
// only when a row samples (top_k != 1). A recorded step's digests and top-k pairs come from the
// guard's pass over the logits (their combine beside the finish, on record_stream); its rows'
// state is snapshotted by the finish, or after the drafter when one runs, so the one packed copy
// brings back all a record needs (issue 12).
void CudaBackend::Impl::enqueue_tail_kernels(int32_t logits_rows, int32_t rows, bool stochastic,
                                             bool sums, int32_t record_k) {
  const cudaStream_t s = stream.get();
  const bool record = record_k != kNotRecorded;
  const kernels::RecordBuffers recorded = record_buffers();
  const kernels::LogitsPassArgs pass{
      .logits = logits.get(),
      .rows = logits_rows,
      .vocab = vocab,
      .workspace = logits_workspace.get(),
      .nan_flags = row_nan_flags.get(),
      .argmax = argmax.get(),
      .row_max = sums ? row_max.get() : nullptr,
      .row_sum = sums ? row_sum.get() : nullptr,
      .digests = record ? recorded.digests : nullptr,
      .top = record ? recorded.top : nullptr,
      .top_k = record ? record_k : 0,
  };
  const kernels::RecordFork fork{record_stream.get(), record_fork.get()};
  LS_CUDA(kernels::launch_logits_pass(pass, s, record ? &fork : nullptr));
  mark(CudaPhase::kGuard);
  const kernels::SamplingKeys sampler{keys.get(), sorted_keys.get(), block_sums.get(),
                                      block_prefixes.get()};
  if (stochastic) {
    LS_CUDA(kernels::launch_sampling_weights(step_inputs(), logits.get(), logits_rows, vocab,
                                             sampler, s));
    LS_CUDA(kernels::launch_sort_sampling_keys(sort_temp.get(), sort_temp.bytes(), sampler,
                                               logits_rows, vocab, segment_offsets.get(), s));
    LS_CUDA(kernels::launch_sampling_block_sums(step_inputs(), logits_rows, vocab, sampler, s));
  }
  const kernels::FinishArgs args{
      .in = step_inputs(),
      .state = device_state(),
      .out = result_buffers(),
      .logits = logits.get(),
      .vocab = vocab,
      .argmax = argmax.get(),
      .row_nan_flags = row_nan_flags.get(),
      .row_max = row_max.get(),
      .row_sum = row_sum.get(),
      .keys = sampler,
      .input_ids = input_ids.get(),
      .snapshot = record && !drafting ? recorded : kernels::RecordBuffers{},
  };
  LS_CUDA(kernels::launch_finish_rows(args, rows, s));
  enqueue_mamba_snapshots();  // after the commit: they test the new vcl
  if (record && hybrid()) {  // each row's working slot after the rules, forward and snapshots
    enqueue_mamba_digests(mamba_staging.get() + MambaStagingLayout(rows_max).slots, rows,
                          reinterpret_cast<uint64_t*>(results.get() + results_layout.mamba_digests));
  }
  if (drafting) {
    // The next round's drafts from the committed history (CpuBackend::write_next_inputs).
    const kernels::TokenHistory token_history{history.get(), history_begin.get(),
                                              history_capacity};
    LS_CUDA(kernels::launch_record_and_draft(step_inputs(), device_state(), token_buffers(),
                                             token_history, rows, s));
  }
  if (record && drafting) {  // the drafts rewrote the future inputs after the finish's snapshot
    LS_CUDA(kernels::launch_record_state(step_inputs(), device_state(), rows, recorded, s));
  }
  if (record) {
    LS_CUDA(cudaEventRecord(record_join.get(), record_stream.get()));
    LS_CUDA(cudaStreamWaitEvent(s, record_join.get()));
  }
  mark(CudaPhase::kSampling);
}

void CudaBackend::Impl::check_step_launches() const { LS_CUDA(cudaGetLastError()); }

}  // namespace ls
