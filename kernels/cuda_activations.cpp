// Per-layer activations on the CUDA backend (core/activations.h; replay's --localise and
// --record-activations). While the capture is on, the forward hands each tensor over as soon as
// it is computed: with kValues it waits for the stream and copies the rows to the host (what
// localisation compares element by element); with kDigests it enqueues their digests
// (kernels/activation_ops.h) into one device buffer, copied back once when the executor takes the
// step's activations. Either way the step runs eager (choose_graph takes no graph); nothing of it
// runs while the capture is off.
#include "kernels/cuda_backend_impl.h"

#include "kernels/activation_ops.h"
#include "kernels/layer_ops.h"

#include <cuda_runtime.h>

#include <cstring>
#include <type_traits>
#include <utility>

namespace ls {

using kernels::bf16;

namespace {

// A device tensor's element as the fp32 value core/activations.h keeps: bf16 widened exactly.
float widened(float x) { return x; }
float widened(bf16 x) {
  uint16_t bits = 0;
  std::memcpy(&bits, &x, sizeof bits);
  const uint32_t wide = static_cast<uint32_t>(bits) << 16;
  float out = 0;
  std::memcpy(&out, &wide, sizeof out);
  return out;
}

// Row `row` of x [*, width] T into `out` [width] as fp32, synchronously.
template <typename T>
void copy_row(const T* x, int64_t row, int32_t width, std::vector<T>& host_row, float* out) {
  host_row.resize(static_cast<size_t>(width));
  LS_CUDA(cudaMemcpy(host_row.data(), x + row * width, host_row.size() * sizeof(T),
                     cudaMemcpyDeviceToHost));
  for (size_t e = 0; e < host_row.size(); ++e) out[e] = widened(host_row[e]);
}

}  // namespace

void CudaBackend::capture_activations(ActivationCapture mode) {
  Impl& m = *impl_;
  const bool on = mode != ActivationCapture::kOff;
  LS_REQUIRE(!on || !m.hybrid(), "per-layer activations: model '{}' has Mamba2 layers, which the "
             "capture does not cover", m.model.name);
  LS_REQUIRE(!on || m.shard.degree == 1, "per-layer activations: TP 1 only");
  LS_REQUIRE(!on || m.options.leave_out == 0, "per-layer activations: the backend leaves kernels "
             "out of every step (leave_out {:#x}, a benchmark's profile)", m.options.leave_out);
  if (mode == ActivationCapture::kDigests && m.activation_digests.count() == 0) {
    m.activation_digests = DeviceArray<uint64_t>(
        static_cast<size_t>(activation_digests_count(m.layers, m.tokens_max, m.logits_rows_max)));
  }
  m.capture_mode = mode;
  m.activation_capture = on;
}

StepActivations CudaBackend::take_activations() { return impl_->take_captured_activations(); }

void CudaBackend::Impl::begin_activation_capture(const StepPlan& plan) {
  captured_activations.tensors.clear();
  activation_digests_enqueued = 0;
  capture_tokens = plan.tokens_count;
  capture_logits_rows = plan.logits_rows_count();
}

template <typename T>
void CudaBackend::Impl::capture_tensor(int32_t layer, ActivationKind kind, const T* x,
                                       const int64_t* row_index, int32_t rows, int32_t width) {
  ActivationTensor& t = captured_activations.add(layer, kind, rows, width,
                                                 std::is_same_v<T, bf16>, capture_mode);
  if (capture_mode == ActivationCapture::kDigests) {
    const int64_t end = activation_digests_enqueued + rows;
    LS_ASSERT(end <= static_cast<int64_t>(activation_digests.count()), "{} activation digests of {}",
              end, activation_digests.count());
    LS_CUDA(kernels::launch_activation_digests(x, row_index, rows, width,
                                               activation_digests.get() + activation_digests_enqueued,
                                               stream.get()));
    activation_digests_enqueued = end;
    return;
  }
  LS_CUDA(cudaStreamSynchronize(stream.get()));
  std::vector<int64_t> rows_at(static_cast<size_t>(rows));
  if (row_index != nullptr && rows > 0) {
    LS_CUDA(cudaMemcpy(rows_at.data(), row_index, rows_at.size() * sizeof(int64_t),
                       cudaMemcpyDeviceToHost));
  }
  std::vector<T> host_row;
  for (int32_t r = 0; r < rows; ++r) {
    const int64_t row = row_index != nullptr ? rows_at[static_cast<size_t>(r)] : r;
    copy_row(x, row, width, host_row, t.values.data() + static_cast<size_t>(r) * width);
  }
}

// The forward's digests into its tensors (kDigests; the stream waited for), or its values.
StepActivations CudaBackend::Impl::take_captured_activations() {
  if (capture_mode == ActivationCapture::kDigests && activation_digests_enqueued > 0) {
    std::vector<uint64_t> host(static_cast<size_t>(activation_digests_enqueued));
    LS_CUDA(cudaStreamSynchronize(stream.get()));
    LS_CUDA(cudaMemcpy(host.data(), activation_digests.get(), host.size() * sizeof(uint64_t),
                       cudaMemcpyDeviceToHost));
    size_t next = 0;
    for (ActivationTensor& t : captured_activations.tensors) {
      std::copy(host.begin() + static_cast<ptrdiff_t>(next),
                host.begin() + static_cast<ptrdiff_t>(next + t.digests.size()), t.digests.begin());
      next += t.digests.size();
    }
    LS_ASSERT(next == host.size(), "{} activation digests for {} enqueued", next, host.size());
  }
  activation_digests_enqueued = 0;
  return std::exchange(captured_activations, {});
}

// attn_in, q, k, v and attn_out of layer `layer`, after its attention ran. A fused decode
// product never wrote the attention input: its norm runs once more into `normed` for the capture
// (the residual is still the layer's input: the o product has not run).
template <typename T>
void CudaBackend::Impl::capture_attention(int32_t layer, bool norm_fused, const T* k_layer,
                                          const T* v_layer) {
  const size_t li = static_cast<size_t>(layer);
  if (norm_fused) {
    LS_CUDA(kernels::launch_rms_norm(residual.get(), nullptr, capture_tokens, hidden,
                                     attn_norm.get() + li * static_cast<size_t>(hidden),
                                     model.rms_eps, as<T>(normed), forward_stream()));
  }
  capture_tensor(layer, ActivationKind::kAttnIn, as<T>(normed), nullptr, capture_tokens, hidden);
  capture_tensor(layer, ActivationKind::kQ, q.get(), nullptr, capture_tokens, q_size);
  // K and V as the layer wrote them, at each token's slot.
  capture_tensor(layer, ActivationKind::kK, k_layer, slots.get(), capture_tokens, kv_size);
  capture_tensor(layer, ActivationKind::kV, v_layer, slots.get(), capture_tokens, kv_size);
  capture_tensor(layer, ActivationKind::kAttnOut, as<T>(attn_out), nullptr, capture_tokens, q_size);
}

void CudaBackend::Impl::capture_layer_output(int32_t layer) {
  capture_tensor(layer, ActivationKind::kMlpOut, residual.get(), nullptr, capture_tokens, hidden);
}

template <typename T>
void CudaBackend::Impl::capture_head() {
  capture_tensor(-1, ActivationKind::kFinalNorm, as<T>(final_normed), nullptr, capture_logits_rows,
                 hidden);
  capture_tensor(-1, ActivationKind::kLogits, logits.get(), nullptr, capture_logits_rows, vocab);
}

template void CudaBackend::Impl::capture_attention<float>(int32_t, bool, const float*, const float*);
template void CudaBackend::Impl::capture_attention<bf16>(int32_t, bool, const bf16*, const bf16*);
template void CudaBackend::Impl::capture_head<float>();
template void CudaBackend::Impl::capture_head<bf16>();

}  // namespace ls
