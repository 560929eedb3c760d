// Per-layer activations on the CUDA backend (core/activations.h; replay's --localise and
// --record-activations): while the capture is on, the forward copies each tensor to the host as
// soon as it is computed, waiting for the stream each time. A debugging mode: the step runs eager
// (choose_graph takes no graph) and nothing of it runs while the capture is off.
#include "kernels/cuda_backend_impl.h"

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

// `rows` rows of `width` T at `device` (contiguous) into t's values; the stream has finished.
template <typename T>
void copy_rows(const T* device, ActivationTensor& t) {
  std::vector<T> host(t.values.size());
  if (!host.empty()) {
    LS_CUDA(cudaMemcpy(host.data(), device, host.size() * sizeof(T), cudaMemcpyDeviceToHost));
  }
  for (size_t i = 0; i < host.size(); ++i) t.values[i] = widened(host[i]);
}

}  // namespace

void CudaBackend::capture_activations(bool on) {
  LS_REQUIRE(!on || !impl_->hybrid(), "per-layer activations: model '{}' has Mamba2 layers, which "
             "the capture does not cover", impl_->model.name);
  LS_REQUIRE(!on || impl_->shard.degree == 1, "per-layer activations: TP 1 only");
  impl_->activation_capture = on;
}

StepActivations CudaBackend::take_activations() {
  return std::exchange(impl_->captured_activations, {});
}

void CudaBackend::Impl::begin_activation_capture(const StepPlan& plan) {
  captured_activations.tensors.clear();
  capture_tokens = plan.tokens_count;
  capture_logits_rows = plan.logits_rows_count();
}

// attn_in, q, k, v and attn_out of layer `layer`, after its attention ran. A fused decode
// product never wrote the attention input: its norm runs once more into `normed` for the copy
// (the residual is still the layer's input: the o product has not run).
template <typename T>
void CudaBackend::Impl::capture_attention(int32_t layer, bool norm_fused, const T* k_layer,
                                          const T* v_layer) {
  const size_t li = static_cast<size_t>(layer);
  const bool stored_bf16 = std::is_same_v<T, bf16>;
  if (norm_fused) {
    LS_CUDA(kernels::launch_rms_norm(residual.get(), nullptr, capture_tokens, hidden,
                                     attn_norm.get() + li * static_cast<size_t>(hidden),
                                     model.rms_eps, as<T>(normed), forward_stream()));
  }
  LS_CUDA(cudaStreamSynchronize(stream.get()));
  StepActivations& out = captured_activations;
  copy_rows(as<T>(normed), out.add(layer, ActivationKind::kAttnIn, capture_tokens, hidden, stored_bf16));
  copy_rows(q.get(), out.add(layer, ActivationKind::kQ, capture_tokens, q_size));
  // K and V as the layer wrote them, at each token's slot.
  std::vector<int64_t> token_slots(static_cast<size_t>(capture_tokens));
  if (!token_slots.empty()) {
    LS_CUDA(cudaMemcpy(token_slots.data(), slots.get(), token_slots.size() * sizeof(int64_t),
                       cudaMemcpyDeviceToHost));
  }
  for (const auto& [kind, cache] : {std::pair{ActivationKind::kK, k_layer},
                                    std::pair{ActivationKind::kV, v_layer}}) {
    ActivationTensor& t = out.add(layer, kind, capture_tokens, kv_size, stored_bf16);
    std::vector<T> row(static_cast<size_t>(kv_size));
    for (int32_t i = 0; i < capture_tokens; ++i) {
      const int64_t slot = token_slots[static_cast<size_t>(i)];
      LS_ASSERT(slot >= 0 && slot < slots_count, "token {} slot {} of {}", i, slot, slots_count);
      LS_CUDA(cudaMemcpy(row.data(), cache + slot * kv_size, row.size() * sizeof(T),
                         cudaMemcpyDeviceToHost));
      for (size_t e = 0; e < row.size(); ++e) {
        t.values[static_cast<size_t>(i) * row.size() + e] = widened(row[e]);
      }
    }
  }
  copy_rows(as<T>(attn_out), out.add(layer, ActivationKind::kAttnOut, capture_tokens, q_size, stored_bf16));
}

void CudaBackend::Impl::capture_layer_output(int32_t layer) {
  LS_CUDA(cudaStreamSynchronize(stream.get()));
  copy_rows(residual.get(),
            captured_activations.add(layer, ActivationKind::kMlpOut, capture_tokens, hidden));
}

template <typename T>
void CudaBackend::Impl::capture_head() {
  LS_CUDA(cudaStreamSynchronize(stream.get()));
  const bool stored_bf16 = std::is_same_v<T, bf16>;
  copy_rows(as<T>(final_normed), captured_activations.add(-1, ActivationKind::kFinalNorm,
                                                           capture_logits_rows, hidden, stored_bf16));
  copy_rows(logits.get(),
            captured_activations.add(-1, ActivationKind::kLogits, capture_logits_rows, vocab));
}

template void CudaBackend::Impl::capture_attention<float>(int32_t, bool, const float*, const float*);
template void CudaBackend::Impl::capture_attention<bf16>(int32_t, bool, const bf16*, const bf16*);
template void CudaBackend::Impl::capture_head<float>();
template void CudaBackend::Impl::capture_head<bf16>();

}  // namespace ls
