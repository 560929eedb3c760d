// The weights on the device: uploaded from host ModelWeights (as bf16 or fp32) or generated from
// a seed (DeviceSeededWeights), this rank's shard of each tensor at TP > 1.
#include "kernels/cuda_backend_impl.h"

#include "core/host_threads.h"
#include "core/model/safetensors.h"
#include "core/model/weights.h"
#include "kernels/layer_ops.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <vector>

namespace ls {

using kernels::bf16;

void CudaBackend::Impl::upload_tensor(const DeviceArray<uint8_t>& dst, size_t offset,
                                      std::span<const float> src) {
  LS_ASSERT((offset + src.size()) * elem_bytes <= dst.bytes(), "upload past the buffer");
  if (options.precision == CudaPrecision::kFp32) {
    LS_CUDA(cudaMemcpy(as<float>(dst) + offset, src.data(), src.size_bytes(),
                       cudaMemcpyHostToDevice));
    return;
  }
  // Converted (safetensors.h's rounding) a chunk at a time on every core, at least kRunMin values
  // a thread (fewer threads for a small tensor), then copied.
  constexpr size_t kChunk = size_t{1} << 24, kRunMin = size_t{1} << 18;
  const auto cores = static_cast<size_t>(host_cores());
  std::vector<uint16_t> bits(std::min(src.size(), kChunk));
  for (size_t begin = 0; begin < src.size(); begin += kChunk) {
    const size_t n = std::min(kChunk, src.size() - begin);
    const auto threads = static_cast<int32_t>(std::clamp<size_t>(n / kRunMin, 1, cores));
    f32_to_bf16(src.subspan(begin, n), std::span(bits).first(n), threads);
    LS_CUDA(cudaMemcpy(as<bf16>(dst) + offset + begin, bits.data(), n * sizeof(uint16_t),
                       cudaMemcpyHostToDevice));
  }
}

void CudaBackend::Impl::seed_tensor(const DeviceArray<uint8_t>& dst, size_t offset,
                                    kernels::SeededBlock block, uint64_t seed,
                                    uint32_t tensor_index, ops::SeededRange range) {
  const float center = range.center, half_width = range.half_width;
  LS_ASSERT((offset + static_cast<size_t>(block.rows * block.cols)) * elem_bytes <= dst.bytes(),
            "seed past the buffer");
  if (options.precision == CudaPrecision::kFp32) {
    LS_CUDA(kernels::launch_seeded_f32(as<float>(dst) + offset, block, seed, tensor_index, center,
                                       half_width, stream.get()));
  } else {
    LS_CUDA(kernels::launch_seeded_bf16(as<bf16>(dst) + offset, block, seed, tensor_index, center,
                                        half_width, stream.get()));
  }
}

void CudaBackend::Impl::upload_weights(const ModelWeights& weights) {
  LS_REQUIRE(weights.config.hidden_size == hidden && weights.config.layers_count == layers &&
                 weights.config.vocab_size == vocab && weights.config.ffn_size == full_model.ffn_size,
             "cuda backend: the weights' shape does not match the model config");
  weights.validate();
  LS_REQUIRE(weights.config.qkv_bias == model.qkv_bias && weights.config.qk_norm == model.qk_norm,
             "cuda backend: the weights' family features do not match the model config");
  LS_REQUIRE(weights.config.layer_kinds == model.layer_kinds && weights.config.mamba == model.mamba,
             "cuda backend: the weights' layer kinds or Mamba shape do not match the model config");
  const size_t h = static_cast<size_t>(hidden);
  const int32_t d = model.head_dim;
  const ShardRange q_rows = head_elements(shard.query_heads, d);
  const ShardRange kv_rows = head_elements(shard.kv_heads, d);
  upload_tensor(embedding, 0, weights.embedding);
  if (shard.degree > 1) {
    upload_tensor(lm_head, 0, shard_rows(weights.lm_head_view(), hidden, shard.vocab));
  } else if (!model.tied_embeddings) {
    upload_tensor(lm_head, 0, weights.lm_head);
  }
  const size_t qkv_rows = static_cast<size_t>(q_size + 2 * kv_size);
  std::vector<float> columns;  // a column shard's copy (TP > 1)
  for (int32_t i = 0; i < layers; ++i) {
    const LayerWeights& w = weights.layers[i];
    const size_t li = static_cast<size_t>(i);
    const size_t qkv_at = li * qkv_rows * h;
    if (model.layer_kind(i) == LayerKind::kMamba2) {
      // TODO(perf): its slices of w_qkv and w_o stay unused (it holds no KV).
      upload_mamba_layer(i, w);
    } else {
      upload_tensor(w_qkv, qkv_at, shard_rows(w.wq, hidden, q_rows));
      upload_tensor(w_qkv, qkv_at + static_cast<size_t>(q_size) * h,
                    shard_rows(w.wk, hidden, kv_rows));
      upload_tensor(w_qkv, qkv_at + static_cast<size_t>(q_size + kv_size) * h,
                    shard_rows(w.wv, hidden, kv_rows));
      upload_tensor(w_o, li * h * q_size,
                    shard_columns(w.wo, hidden, full_model.q_size(), q_rows, columns));
    }
    const size_t gu_at = li * 2 * ffn * h;
    upload_tensor(w_gate_up, gu_at, shard_rows(w.w_gate, hidden, shard.ffn));
    upload_tensor(w_gate_up, gu_at + static_cast<size_t>(ffn) * h,
                  shard_rows(w.w_up, hidden, shard.ffn));
    upload_tensor(w_down, li * h * ffn,
                  shard_columns(w.w_down, hidden, full_model.ffn_size, shard.ffn, columns));
    LS_CUDA(cudaMemcpy(attn_norm.get() + li * h, w.attn_norm.data(), h * 4, cudaMemcpyHostToDevice));
    LS_CUDA(cudaMemcpy(ffn_norm.get() + li * h, w.ffn_norm.data(), h * 4, cudaMemcpyHostToDevice));
    upload_features(li, w);
  }
  LS_CUDA(cudaMemcpy(final_norm.get(), weights.final_norm.data(), h * 4, cudaMemcpyHostToDevice));
}

// Qwen2's biases side by side in QKV order (this rank's heads); Qwen3's head norms.
void CudaBackend::Impl::upload_features(size_t li, const LayerWeights& w) {
  auto copy = [](float* dst, std::span<const float> src) {
    LS_CUDA(cudaMemcpy(dst, src.data(), src.size_bytes(), cudaMemcpyHostToDevice));
  };
  if (model.qkv_bias) {
    const ShardRange q_rows = head_elements(shard.query_heads, model.head_dim);
    const ShardRange kv_rows = head_elements(shard.kv_heads, model.head_dim);
    float* bias = qkv_bias.get() + li * static_cast<size_t>(q_size + 2 * kv_size);
    copy(bias, shard_rows(w.q_bias, 1, q_rows));
    copy(bias + q_size, shard_rows(w.k_bias, 1, kv_rows));
    copy(bias + q_size + kv_size, shard_rows(w.v_bias, 1, kv_rows));
  }
  if (model.qk_norm) {
    copy(q_norm.get() + li * model.head_dim, w.q_norm);
    copy(k_norm.get() + li * model.head_dim, w.k_norm);
  }
}

// weights_from_seed's tensors generated on the device, at the indices and in the ranges of
// core/ops/seeded_weights.h. Norms, biases and head norms stay fp32 at every precision.
void CudaBackend::Impl::seed_fp32(float* dst, kernels::SeededBlock block, uint64_t seed,
                                  uint32_t tensor_index, ops::SeededRange range) {
  LS_CUDA(kernels::launch_seeded_f32(dst, block, seed, tensor_index, range.center, range.half_width,
                                     stream.get()));
}

namespace {

// The seeded elements of rows `rows` of a [*, cols] tensor, and of columns `columns` of a
// [rows, cols] one: a rank's shard of the TP-1 tensor, element for element.
kernels::SeededBlock seeded_rows(ShardRange rows, int64_t cols) {
  return {rows.count, cols, int64_t{rows.begin} * cols, cols};
}
kernels::SeededBlock seeded_columns(int64_t rows, int64_t cols, ShardRange columns) {
  return {rows, columns.count, columns.begin, cols};
}

}  // namespace

// The family tensors: Qwen2's biases side by side in QKV order, Qwen3's head norms.
void CudaBackend::Impl::generate_features(uint64_t seed) {
  const int64_t d = model.head_dim;
  const auto index = [&](int32_t layer, ops::SeededFeatureTensor k) {
    return ops::seeded_feature_tensor_index(static_cast<uint32_t>(layers),
                                            static_cast<uint32_t>(layer), k);
  };
  const ShardRange q_rows = head_elements(shard.query_heads, model.head_dim);
  const ShardRange kv_rows = head_elements(shard.kv_heads, model.head_dim);
  for (int32_t i = 0; i < layers; ++i) {
    if (model.qkv_bias) {
      float* bias = qkv_bias.get() + static_cast<size_t>(i) * (q_size + 2 * kv_size);
      seed_fp32(bias, seeded_rows(q_rows, 1), seed, index(i, ops::kSeededQBias),
                ops::kSeededBiasRange);
      seed_fp32(bias + q_size, seeded_rows(kv_rows, 1), seed, index(i, ops::kSeededKBias),
                ops::kSeededBiasRange);
      seed_fp32(bias + q_size + kv_size, seeded_rows(kv_rows, 1), seed,
                index(i, ops::kSeededVBias), ops::kSeededBiasRange);
    }
    if (model.qk_norm) {
      const kernels::SeededBlock head{1, d, 0, d};
      seed_fp32(q_norm.get() + i * d, head, seed, index(i, ops::kSeededQNorm), ops::kSeededNormRange);
      seed_fp32(k_norm.get() + i * d, head, seed, index(i, ops::kSeededKNorm), ops::kSeededNormRange);
    }
  }
}

// This rank's shard of each seeded tensor: the elements of weights_from_seed's TP-1 tensor that
// the shard holds, so TP N's weights equal TP 1's. Ranges are the whole tensor's (1/sqrt(in) of
// TP 1's in).
void CudaBackend::Impl::generate_weights(uint64_t seed) {
  // TODO(spec): a seeded layout for the mixer tensors, here and in weights_from_seed.
  LS_REQUIRE(!hybrid(), "cuda backend: model '{}' has Mamba2 layers; seeded weights have no "
             "layout for the mixer tensors (weights_from_seed refuses them too): load a "
             "checkpoint directory", model.name);
  const int64_t h = hidden;
  auto linear = [](int64_t in) {
    return ops::SeededRange{0.0f, 1.0f / std::sqrt(static_cast<float>(in))};
  };
  auto at = [](int64_t elements) { return static_cast<size_t>(elements); };
  const int64_t full_q = full_model.q_size(), full_ffn = full_model.ffn_size;
  const ShardRange q_rows = head_elements(shard.query_heads, model.head_dim);
  const ShardRange kv_rows = head_elements(shard.kv_heads, model.head_dim);
  const auto whole = [](int64_t rows, int64_t cols) { return kernels::SeededBlock{rows, cols, 0, cols}; };
  seed_tensor(embedding, 0, whole(vocab, h), seed, ops::kSeededEmbeddingIndex,
              ops::kSeededEmbeddingRange);
  const int64_t qkv_rows = q_size + 2 * kv_size;
  for (int32_t i = 0; i < layers; ++i) {
    const auto index = [i](ops::SeededLayerTensor k) {
      return ops::seeded_layer_tensor_index(static_cast<uint32_t>(i), k);
    };
    const int64_t qkv_at = i * qkv_rows * h;
    seed_fp32(attn_norm.get() + i * h, whole(1, h), seed, index(ops::kSeededAttnNorm),
              ops::kSeededNormRange);
    seed_tensor(w_qkv, at(qkv_at), seeded_rows(q_rows, h), seed, index(ops::kSeededWq), linear(h));
    seed_tensor(w_qkv, at(qkv_at + q_size * h), seeded_rows(kv_rows, h), seed,
                index(ops::kSeededWk), linear(h));
    seed_tensor(w_qkv, at(qkv_at + (q_size + kv_size) * h), seeded_rows(kv_rows, h), seed,
                index(ops::kSeededWv), linear(h));
    seed_tensor(w_o, at(i * h * q_size), seeded_columns(h, full_q, q_rows), seed,
                index(ops::kSeededWo), linear(full_q));
    seed_fp32(ffn_norm.get() + i * h, whole(1, h), seed, index(ops::kSeededFfnNorm),
              ops::kSeededNormRange);
    const int64_t gu_at = i * 2 * ffn * h;
    seed_tensor(w_gate_up, at(gu_at), seeded_rows(shard.ffn, h), seed, index(ops::kSeededWGate),
                linear(h));
    seed_tensor(w_gate_up, at(gu_at + ffn * h), seeded_rows(shard.ffn, h), seed,
                index(ops::kSeededWUp), linear(h));
    seed_tensor(w_down, at(i * h * ffn), seeded_columns(h, full_ffn, shard.ffn), seed,
                index(ops::kSeededWDown), linear(full_ffn));
  }
  const auto layers_count = static_cast<uint32_t>(layers);
  seed_fp32(final_norm.get(), whole(1, h), seed, ops::seeded_final_norm_index(layers_count),
            ops::kSeededNormRange);
  if (shard.degree > 1) {
    // Tied: the head is the embedding's rows, seeded as the embedding.
    const bool tied = model.tied_embeddings;
    seed_tensor(lm_head, 0, seeded_rows(shard.vocab, h), seed,
                tied ? ops::kSeededEmbeddingIndex : ops::seeded_lm_head_index(layers_count),
                tied ? ops::kSeededEmbeddingRange : linear(h));
  } else if (!model.tied_embeddings) {
    seed_tensor(lm_head, 0, whole(vocab, h), seed, ops::seeded_lm_head_index(layers_count),
                linear(h));
  }
  generate_features(seed);
  LS_CUDA(cudaStreamSynchronize(stream.get()));
}

}  // namespace ls
