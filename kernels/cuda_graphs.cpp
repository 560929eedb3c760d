// The graph set: decode steps captured per bucket (the forward alone, with the greedy tail, with
// the tail and the record), and a graph step's replay.
#include "kernels/cuda_backend_impl.h"

#include <algorithm>
#include <functional>
#include <vector>

namespace ls {

void CudaBackend::capture_graphs() {
  LS_ASSERT(impl_->steps_count == 0 && impl_->graphs.empty(), "graphs captured after {} steps",
            impl_->steps_count);
  impl_->capture_graphs();
}

// Warm-up eagerly at every bucket (module loading and cuBLAS's first calls stay out of capture),
// then capture rules 1–4 of a decode step per bucket. The staged header is all zeros here: no
// real rows, so the fill scrubs every token and the forward writes only the dummy page 0.
void CudaBackend::Impl::capture_graphs() {
  const cudaStream_t s = stream.get();
  LS_CUDA(cudaMemsetAsync(staging.get(), 0, staging.bytes(), s));
  graphs.clear();
  tail_graphs.clear();
  record_tail_graphs.clear();
  phase_marks.graph_ends.clear();
  record_graph_k = std::min(kTopLogitsCountMax, vocab);
  // One graph: what it enqueues and where it goes.
  struct Capture {
    std::function<void()> enqueue;
    std::vector<CudaGraph>* into;
    bool forward_only;
  };
  std::vector<Capture> captures;
  for (const int32_t grid : buckets) {
    captures.push_back({[this, grid] {
                          // After the step's opening mark, which stage() records eagerly.
                          phase_marks.count = 1;
                          enqueue_table_writes(grid);
                          enqueue_resets();
                          enqueue_fill(grid);
                          enqueue_mamba_rules();
                          mark(CudaPhase::kStateOps);
                          rows_grid = grid;  // the mixer's rows
                          mamba_chunked = false;  // decode graphs: the sequential scan
                          enqueue_forward(grid * config.verify_width, grid * config.verify_width,
                                          /*prefill_tokens=*/0);
                        },
                        &graphs, true});
  }
  // The same with the greedy tail (profiling keeps the tail eager: its phases stay measurable).
  for (const bool record : {false, true}) {
    for (const int32_t grid : options.profile ? std::vector<int32_t>{} : buckets) {
      captures.push_back({[this, grid, record] {
                            const int32_t tokens = grid * config.verify_width;
                            enqueue_table_writes(grid);
                            enqueue_resets();
                            enqueue_fill(grid);
                            enqueue_mamba_rules();
                            rows_grid = grid;  // the mixer's rows
                            mamba_chunked = false;  // decode graphs: the sequential scan
                            enqueue_forward(tokens, tokens, /*prefill_tokens=*/0);
                            enqueue_tail_kernels(tokens, grid, /*stochastic=*/false, /*sums=*/true,
                                                 record ? record_graph_k : kNotRecorded);
                          },
                          record ? &record_tail_graphs : &tail_graphs, false});
    }
  }
  // Every warm-up eagerly first, then every capture: a TP rank's warm-ups run collectives that
  // wait for the other ranks, and none may still wait for this one while it instantiates and
  // uploads graphs. Ranks sharing a GPU also meet on the host around each collective of the
  // warm-ups (kernels/tp_collectives.cpp): their first cuBLASLt products, attention launches and
  // sorts here may wait for the device, which must then hold no barrier kernel waiting for them.
  for (const Capture& c : captures) c.enqueue();
  LS_CUDA(cudaStreamSynchronize(s));
  for (const Capture& c : captures) {
    phase_marks.capturing = true;
    try {
      c.into->push_back(CudaGraph::capture(s, c.enqueue));
    } catch (...) {
      phase_marks.capturing = false;
      throw;
    }
    phase_marks.capturing = false;
    if (c.forward_only) phase_marks.graph_ends.push_back(phase_marks.count);  // bucket order
  }
  LS_CUDA(cudaStreamSynchronize(s));
  phase_marks.count = 0;
}

// This step's decode graph: the forward alone, with the greedy tail, or with the tail and the
// record (stage() chose which).
void CudaBackend::Impl::launch_graph() {
  const auto& set = record_in_graph ? record_tail_graphs : tail_in_graph ? tail_graphs : graphs;
  LS_CUDA(cudaGraphLaunch(set[static_cast<size_t>(graph_index_)].get(), stream.get()));
  ++graph_replays;
  tail_graph_replays += tail_in_graph ? 1 : 0;
  if (phase_marks.on()) {  // the graph recorded them
    phase_marks.count = phase_marks.graph_ends[static_cast<size_t>(graph_index_)];
  }
}

// Which graph the step at rows_grid replays, if any: decode steps, when graphs were captured.
void CudaBackend::Impl::choose_graph(const StepPlan& plan) {
  const auto bucket = std::lower_bound(buckets.begin(), buckets.end(), rows_grid) - buckets.begin();
  const bool decode_graph =
      plan.mode == ForwardMode::kDecode && !graphs.empty() && !activation_capture;
  graph_index_ = decode_graph ? static_cast<int32_t>(bucket) : -1;
  // The tail joins the graph when every row is greedy (the sampler's weights and sort are not in
  // it) and no fault poisons the logits between the forward and the guard; a recorded step's tail
  // only when a record tail graph writes its count of top-k pairs (the record is in the guard).
  const bool greedy_tail =
      graph_index_ >= 0 && !tail_graphs.empty() && !plan.logits_poisoned &&
      std::all_of(plan.sampling.begin(), plan.sampling.end(),
                  [](const ResolvedSampling& x) { return x.top_k == 1; });
  record_in_graph = greedy_tail && plan.record && !record_tail_graphs.empty() &&
                    plan.top_logits_count == record_graph_k;
  tail_in_graph = greedy_tail && (!plan.record || record_in_graph);
}

}  // namespace ls
