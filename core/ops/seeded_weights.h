// The seeded weights' layout and values (weights_from_seed in core/model/weights.cpp, the CUDA
// backend's on-device generation in kernels/cuda_backend.cpp and kernels/weight_init.cu).
//
// Element i of tensor t is a function of Philox4x32-10 word 0 at key = seed, counter0 = i,
// counter1 = t, mapped to u in [0, 1) by uniform_from_bits. Tensor indices t:
//   0                embedding                      [vocab, hidden]
//   1 + 9·l + k      layer l, k = 0..8 in LayerWeights field order (SeededLayerTensor):
//                    attn_norm, wq, wk, wv, wo, ffn_norm, w_gate, w_up, w_down
//   1 + 9·L          final_norm                     [hidden]
//   2 + 9·L          lm_head, only when embeddings are not tied   [vocab, hidden]
//   3 + 9·L + 5·l + k  layer l's family tensors, k = 0..4 (SeededFeatureTensor), only when the
//                    config has the feature: q_bias, k_bias, v_bias (qkv_bias), q_norm, k_norm
//                    (qk_norm). Index 2 + 9·L stays lm_head's even when tied.
//   3 + 14·L + 8·l + k  layer l's Mamba2 mixer tensors (a hybrid: `tiny-hybrid`), k = 0..7
//                    (SeededMambaTensor), only on its kMamba2 layers (conv_bias only with
//                    mamba.conv_bias): in_proj, conv_weight, conv_bias, dt_bias, a_log, d_skip,
//                    mamba_norm, out_proj. A Mamba layer has no wq..wo: their indices go unused.
// Values center + half_width·(2u − 1): linear weights half_width = 1/sqrt(in), center 0;
// embeddings 2u − 1; norms 1 + (2u − 1)/8; biases (2u − 1)/8; the mixer's conv taps (2u − 1)/2,
// dt_bias 2u − 1, a_log 0.5 + (2u − 1)/2 (A = −exp(a_log) in (−e, −1]), D and its norm weight as
// norms, conv_bias as biases. 2u − 1 is exact (u has 24 bits)
// and so is the /8, so each value takes at most one rounding: the bits are the same everywhere.
// This order is part of every seeded model and of every recorded digest: changing it changes
// them all.
#pragma once

#include "core/ops/host_device.h"
#include "core/ops/philox.h"

#include <cstdint>

namespace ls::ops {

enum SeededLayerTensor : uint32_t {
  kSeededAttnNorm, kSeededWq, kSeededWk, kSeededWv, kSeededWo,
  kSeededFfnNorm, kSeededWGate, kSeededWUp, kSeededWDown, kSeededLayerTensorsCount
};

enum SeededFeatureTensor : uint32_t {
  kSeededQBias, kSeededKBias, kSeededVBias, kSeededQNorm, kSeededKNorm, kSeededFeatureTensorsCount
};

enum SeededMambaTensor : uint32_t {
  kSeededInProj, kSeededConvWeight, kSeededConvBias, kSeededDtBias, kSeededALog, kSeededDSkip,
  kSeededMambaNorm, kSeededOutProj, kSeededMambaTensorsCount
};

inline constexpr uint32_t kSeededEmbeddingIndex = 0;

constexpr uint32_t seeded_layer_tensor_index(uint32_t layer, SeededLayerTensor k) {
  return 1 + kSeededLayerTensorsCount * layer + k;
}
constexpr uint32_t seeded_final_norm_index(uint32_t layers_count) {
  return 1 + kSeededLayerTensorsCount * layers_count;
}
constexpr uint32_t seeded_lm_head_index(uint32_t layers_count) {
  return 2 + kSeededLayerTensorsCount * layers_count;
}
constexpr uint32_t seeded_feature_tensor_index(uint32_t layers_count, uint32_t layer,
                                               SeededFeatureTensor k) {
  return 3 + kSeededLayerTensorsCount * layers_count + kSeededFeatureTensorsCount * layer + k;
}

constexpr uint32_t seeded_mamba_tensor_index(uint32_t layers_count, uint32_t layer,
                                             SeededMambaTensor k) {
  return 3 + (uint32_t{kSeededLayerTensorsCount} + uint32_t{kSeededFeatureTensorsCount}) * layers_count +
         kSeededMambaTensorsCount * layer + k;
}

// center + half_width·(2u − 1) for one kind of tensor.
struct SeededRange {
  float center;
  float half_width;
};
inline constexpr SeededRange kSeededEmbeddingRange{0.0f, 1.0f};
inline constexpr SeededRange kSeededNormRange{1.0f, 0.125f};
inline constexpr SeededRange kSeededBiasRange{0.0f, 0.125f};
inline constexpr SeededRange kSeededConvRange{0.0f, 0.5f};
inline constexpr SeededRange kSeededDtBiasRange{0.0f, 1.0f};
inline constexpr SeededRange kSeededALogRange{0.5f, 0.5f};

// An element's value from its Philox word 0.
LS_HOST_DEVICE LS_INLINE float seeded_value_from_bits(uint32_t bits, float center,
                                                      float half_width) {
  const float symmetric = sub_rn(mul_rn(2.0f, uniform_from_bits(bits)), 1.0f);
  return add_rn(center, mul_rn(half_width, symmetric));
}

LS_HOST_DEVICE LS_INLINE float seeded_value(uint64_t seed, uint32_t tensor_index, int64_t element,
                                            float center, float half_width) {
  return seeded_value_from_bits(philox_word0(seed, static_cast<uint64_t>(element), tensor_index),
                                center, half_width);
}

}  // namespace ls::ops
