// The public CudaBackend: the Backend interface over Impl (kernels/cuda_backend_impl.h), its
// statistics and the factories.
#include "kernels/cuda_backend_impl.h"

#include "core/drafter.h"
#include "kernels/layer_ops.h"

#include <cuda_runtime.h>

#include <chrono>
#include <cmath>
#include <utility>

namespace ls {

CudaBackend::CudaBackend(const ModelWeights& weights, const ExecutorConfig& config,
                         const CudaBackendOptions& options)
    : impl_(std::make_unique<Impl>(weights.config, config, options)) {
  impl_->upload_weights(weights);
  if (options.graphs) impl_->capture_graphs();
}

CudaBackend::CudaBackend(const DeviceSeededWeights& weights, const ExecutorConfig& config,
                         const CudaBackendOptions& options)
    : impl_(std::make_unique<Impl>(weights.config, config, options)) {
  impl_->generate_weights(weights.seed);
  if (options.graphs) impl_->capture_graphs();
}

CudaBackend::~CudaBackend() = default;

void CudaBackend::apply_table_writes(const StepPlan& plan) {
  Impl& m = *impl_;
  m.stage(plan);
  if (m.graph_step()) return;
  if (!plan.table_writes.empty()) m.enqueue_table_writes(m.rows_grid);
}

void CudaBackend::reset_lengths(const StepPlan& plan) {
  Impl& m = *impl_;
  m.stage(plan);
  if (m.graph_step()) return;
  if (!plan.length_resets.empty()) m.enqueue_resets();
}

void CudaBackend::fill_inputs(const StepPlan& plan) {
  Impl& m = *impl_;
  m.stage(plan);
  if (m.graph_step()) return;
  m.enqueue_fill(m.rows_grid);
  m.mark(CudaPhase::kStateOps);
}

bool CudaBackend::has_recurrent_state() const { return impl_->hybrid(); }

void CudaBackend::apply_state_rules(const StepPlan& plan) {
  Impl& m = *impl_;
  m.stage(plan);
  if (m.graph_step()) return;
  m.enqueue_mamba_rules();
  m.mark(CudaPhase::kStateOps);
}

std::vector<uint64_t> CudaBackend::read_mamba_digests(std::span<const int32_t> slots) const {
  return impl_->read_mamba_digests(slots);
}

std::vector<float> CudaBackend::read_mamba_state(int32_t slot) const {
  return impl_->read_mamba_slot(slot);
}

namespace {
// Writes the nanoseconds of its scope to *out when it ends (the benchmark's host-time split).
struct ScopeNanos {
  int64_t* out;
  std::chrono::steady_clock::time_point begin = std::chrono::steady_clock::now();
  ~ScopeNanos() {
    *out = std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() -
                                                                begin)
               .count();
  }
};

// The step's prefill tokens: the prefill rows' (its first ne rows), which lead the token buffer,
// each row's tokens consecutive, as the attention launch's tile kernel needs them.
int32_t prefill_tokens_of(const StepPlan& plan) {
  int32_t tokens = 0;
  for (int32_t r = 0; r < plan.prefill_rows_count; ++r) {
    const size_t row = static_cast<size_t>(r);
    LS_ASSERT(plan.token_offsets[row] == tokens, "prefill row {} starts at token {}, not {}", r,
              plan.token_offsets[row], tokens);
    tokens += plan.input_lengths[row];
  }
  return tokens;
}
}  // namespace

void CudaBackend::forward(const StepPlan& plan) {
  Impl& m = *impl_;
  const ScopeNanos timer{&m.last_forward_ns};
  if (plan.record && m.hybrid()) {
    // The record digests each row's working slot (as CpuBackend::fill_record requires them).
    for (const int32_t slot : plan.mamba_working) {
      LS_ASSERT(slot >= 0, "recorded hybrid step: a row without a working slot");
    }
  }
  m.stage(plan);
  if (plan.rows_count == 0) {
    // An IDLE step at TP > 1 issues the busy step's collectives with no elements, so the ranks of
    // a data-parallel group stay in step (the CPU reference's IDLE forward).
    if (m.tp) {
      m.tp->begin_forward();
      m.tp->idle_collectives(m.stream.get());
    }
    return;
  }
  if (m.graph_step()) {
    m.launch_graph();
    return;
  }
  if (m.activation_capture) m.begin_activation_capture(plan);
  const int32_t tokens = plan.mode == ForwardMode::kDecode ? m.rows_grid * plan.verify_width
                                                           : plan.tokens_count;
  const int32_t logits_rows = plan.mode == ForwardMode::kDecode ? tokens : plan.logits_rows_count();
  m.enqueue_forward(tokens, logits_rows,
                    plan.mode == ForwardMode::kDecode ? 0 : prefill_tokens_of(plan));
}

void CudaBackend::poison_logits(std::span<const int32_t> logits_rows, float value) {
  Impl& m = *impl_;
  for (const int32_t r : logits_rows) {
    LS_ASSERT(r >= 0 && r < m.logits_rows_max, "logits row {}", r);
    LS_CUDA(kernels::launch_fill_float(m.logits.get() + static_cast<int64_t>(r) * m.vocab, m.vocab,
                                       value, m.stream.get()));
  }
}

void CudaBackend::finish_step(const StepPlan& plan, StepResult& result) {
  LS_ASSERT(impl_->steps_in_flight() == 0, "finish_step with {} steps in flight",
            impl_->steps_in_flight());
  enqueue_finish(plan);
  collect_finish(plan, result);
}

bool CudaBackend::can_run_ahead() const { return !impl_->options.profile; }

// Rules 5–9 launched behind the step's forward, then this parity's step_done; nothing waits.
void CudaBackend::enqueue_finish(const StepPlan& plan) {
  Impl& m = *impl_;
  const ScopeNanos timer{&m.last_enqueue_ns};
  m.stage(plan);
  // The phase marks are one set, read when the step is collected.
  LS_ASSERT(!m.options.profile || m.steps_in_flight() == 0, "profiling with {} steps in flight",
            m.steps_in_flight());
  const size_t parity = static_cast<size_t>(m.steps_count & 1);
  const cudaStream_t s = m.stream.get();
  if (plan.rows_count > 0) {
    m.enqueue_tail(plan);
    if (plan.capture_logits) {
      // Pageable memory: the call returns once the copy is done, so a step that captures logits
      // (tests, replays) completes here instead of running ahead.
      std::vector<float>& logits = m.host_logits[parity];
      logits.resize(static_cast<size_t>(plan.logits_rows_count()) * m.vocab);
      LS_CUDA(cudaMemcpyAsync(logits.data(), m.logits.get(), logits.size() * sizeof(float),
                              cudaMemcpyDeviceToHost, s));
    }
  }
  LS_CUDA(cudaEventRecord(m.step_done[parity].get(), s));
  m.step_timer.record_end(m.steps_count, s);
  m.check_step_launches();
  m.staged = false;
  ++m.steps_count;
}

// Waits for the oldest enqueued step (its parity's step_done) and unpacks its pinned results.
void CudaBackend::collect_finish(const StepPlan& plan, StepResult& result) {
  Impl& m = *impl_;
  const ScopeNanos timer{&m.last_collect_ns};
  LS_ASSERT(m.steps_in_flight() > 0, "collect_finish with no step in flight");
  const size_t parity = static_cast<size_t>(m.collected_count & 1);
  const auto wait_begin = std::chrono::steady_clock::now();
  LS_CUDA(cudaEventSynchronize(m.step_done[parity].get()));
  // The waits since the last collect: this one and an eager step's wait at staging.
  m.last_wait_ns = std::chrono::duration_cast<std::chrono::nanoseconds>(
                       std::chrono::steady_clock::now() - wait_begin)
                       .count() +
                   std::exchange(m.stage_wait_ns, 0);
  m.unpack(plan, parity, result);  // an IDLE step: every vector empty
  if (plan.capture_logits && plan.rows_count > 0) {
    result.logits.swap(m.host_logits[parity]);  // the old vector is this parity's next buffer
  } else {
    result.logits.clear();
  }
  if (plan.rows_count > 0) m.phase_marks.collect();
  m.step_timer.collect(m.collected_count);
  ++m.collected_count;
}

void CudaBackend::copy_pages(const CacheOp& op) {
  Impl& m = *impl_;
  LS_ASSERT(op.device_pages.size() == op.host_pages.size(), "unpaired page copy");
  const size_t p = static_cast<size_t>(m.config.page_size);
  const size_t kv = static_cast<size_t>(m.kv_size);
  const size_t l = static_cast<size_t>(m.kv_layers);
  const size_t e = m.elem_bytes;
  const size_t page_bytes = p * kv * e;
  const size_t layer_pitch = static_cast<size_t>(m.slots_count) * kv * e;
  for (size_t i = 0; i < op.device_pages.size(); ++i) {
    LS_ASSERT(op.device_pages[i] >= 1 && op.device_pages[i] < m.config.pages_count,
              "device page {}", op.device_pages[i]);
    LS_ASSERT(op.host_pages[i] >= 0 && op.host_pages[i] < m.config.host_pages_count,
              "host page {}", op.host_pages[i]);
    const size_t first_slot = static_cast<size_t>(op.device_pages[i]) * p;
    uint8_t* host_page = m.host_kv.get() + static_cast<size_t>(op.host_pages[i]) * 2 * l * page_bytes;
    for (int which = 0; which < 2; ++which) {
      uint8_t* device = (which == 0 ? m.k_cache.get() : m.v_cache.get()) + first_slot * kv * e;
      uint8_t* host = host_page + static_cast<size_t>(which) * l * page_bytes;
      if (op.kind == CacheOpKind::kSwapOut) {
        LS_CUDA(cudaMemcpy2DAsync(host, page_bytes, device, layer_pitch, page_bytes, l,
                                  cudaMemcpyDeviceToHost, m.stream.get()));
      } else {
        LS_CUDA(cudaMemcpy2DAsync(device, layer_pitch, host, page_bytes, page_bytes, l,
                                  cudaMemcpyHostToDevice, m.stream.get()));
      }
    }
  }
  m.enqueue_state_copy(op);  // a hybrid's working state travels with the pages
}

StateSnapshot CudaBackend::read_state(std::span<const int32_t> pool_rows) const {
  const Impl& m = *impl_;
  LS_CUDA(cudaStreamSynchronize(m.stream.get()));
  const std::vector<int32_t> table = download(m.table);
  const std::vector<int32_t> vcl = download(m.vcl);
  const std::vector<int32_t> fim = download(m.future_inputs);
  const size_t w = static_cast<size_t>(m.config.verify_width);
  const size_t width = static_cast<size_t>(m.table_width);
  StateSnapshot s;
  for (const int32_t rpi : pool_rows) {
    LS_ASSERT(rpi >= 0 && rpi < m.config.pool_rows_count(), "pool row {}", rpi);
    const size_t row = static_cast<size_t>(rpi);
    s.pool_rows.push_back(rpi);
    s.valid_cache_length.push_back(vcl[row]);
    s.future_inputs.insert(s.future_inputs.end(), fim.begin() + row * w, fim.begin() + (row + 1) * w);
    s.table.insert(s.table.end(), table.begin() + row * width, table.begin() + (row + 1) * width);
  }
  return s;
}

InputSnapshot CudaBackend::read_inputs() const {
  const Impl& m = *impl_;
  LS_CUDA(cudaStreamSynchronize(m.stream.get()));
  return {download(m.input_ids), download(m.positions), download(m.slots), m.token_mamba_slots()};
}

CudaMemoryReport CudaBackend::memory_report() const {
  const Impl& m = *impl_;
  return {m.ledger.weights, m.ledger.kv, m.ledger.workspace};
}

int64_t CudaBackend::gemm_plans_count() const {
  return static_cast<int64_t>(impl_->gemm_plans->plans_count());
}

int64_t CudaBackend::graph_replays_count() const { return impl_->graph_replays; }

int64_t CudaBackend::tail_graph_replays_count() const { return impl_->tail_graph_replays; }

std::string CudaBackend::drafter_name() const {
  const std::string& name = impl_->options.drafter;
  return name.empty() ? std::string(kNoDrafterName) : name;
}

int64_t CudaBackend::last_wait_ns() const { return impl_->last_wait_ns; }

int64_t CudaBackend::last_forward_ns() const { return impl_->last_forward_ns; }

int64_t CudaBackend::last_finish_ns() const {
  return impl_->last_enqueue_ns + impl_->last_collect_ns;
}

CudaStepTiming CudaBackend::last_step_timing() const { return impl_->step_timer.last; }

DeviceStepTime CudaBackend::last_device_time() const {
  const auto ns = [](double ms) { return std::isnan(ms) ? int64_t{-1} : static_cast<int64_t>(std::llround(ms * 1e6)); };
  return DeviceStepTime{.busy_ns = ns(impl_->step_timer.last.busy_ms),
                        .idle_before_ns = ns(impl_->step_timer.last.idle_before_ms),
                        .wait_ns = impl_->last_wait_ns};
}

CudaPhaseTimes CudaBackend::phase_times() const { return impl_->phase_marks.totals; }

std::vector<CollectiveCall> CudaBackend::collectives() const {
  return impl_->tp ? impl_->tp->calls() : std::vector<CollectiveCall>{};
}

void CudaBackend::reset_phase_times() {
  CudaPhaseTimes& totals = impl_->phase_marks.totals;
  const bool available = totals.available;
  totals = CudaPhaseTimes{};
  totals.available = available;
}

std::string_view to_string(CudaPrecision precision) {
  return precision == CudaPrecision::kFp32 ? "fp32" : "bf16";
}

std::unique_ptr<Backend> make_cuda_backend(const ModelWeights& weights,
                                           const ExecutorConfig& config) {
  return std::make_unique<CudaBackend>(weights, config);
}

std::unique_ptr<Backend> make_cuda_backend(const ModelWeights& weights,
                                           const ExecutorConfig& config,
                                           const CudaBackendOptions& options) {
  return std::make_unique<CudaBackend>(weights, config, options);
}

}  // namespace ls
