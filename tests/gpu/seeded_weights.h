// weights_from_seed on many threads, for GPU tests whose CPU reference needs llama-1b's fp32
// weights (1.2 G values: ~35 s on one core). The same formula element for element — Philox4x32-10
// word 0 at (seed, element, tensor index), center + half_width·(2u − 1) — checked equal to
// ls::weights_from_seed on `tiny` by SeededWeightsParallel.EqualsWeightsFromSeed.
#pragma once

#include "core/model/weights.h"
#include "core/sampling.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <thread>
#include <vector>

namespace ls::gpu_test {

inline void seeded_fill(std::vector<float>& out, int64_t count, uint64_t seed,
                        uint32_t tensor_index, float center, float half_width, int32_t threads) {
  out.resize(static_cast<size_t>(count));
  const int64_t per = (count + threads - 1) / threads;
  std::vector<std::thread> workers;
  for (int32_t w = 0; w < threads; ++w) {
    workers.emplace_back([&, w] {
      const int64_t begin = std::min(count, per * w), end = std::min(count, per * (w + 1));
      for (int64_t i = begin; i < end; ++i) {
        const uint32_t bits = philox4x32_10(seed, static_cast<uint64_t>(i), tensor_index)[0];
        const float symmetric = 2.0f * uniform_from_bits(bits) - 1.0f;
        out[static_cast<size_t>(i)] = center + half_width * symmetric;
      }
    });
  }
  for (std::thread& t : workers) t.join();
}

inline ModelWeights weights_from_seed_parallel(const ModelConfig& c, uint64_t seed,
                                               int32_t threads) {
  const int64_t h = c.hidden_size, q = c.q_size(), kv = c.kv_size(), f = c.ffn_size;
  auto bound = [](int64_t in) { return 1.0f / std::sqrt(static_cast<float>(in)); };
  ModelWeights w;
  w.config = c;
  uint32_t index = 0;
  seeded_fill(w.embedding, int64_t{c.vocab_size} * h, seed, index++, 0.0f, 1.0f, threads);
  w.layers.resize(static_cast<size_t>(c.layers_count));
  for (LayerWeights& l : w.layers) {  // LayerWeights field order, as weights.cpp's kLayerTensors
    seeded_fill(l.attn_norm, h, seed, index++, 1.0f, 0.125f, threads);
    seeded_fill(l.wq, q * h, seed, index++, 0.0f, bound(h), threads);
    seeded_fill(l.wk, kv * h, seed, index++, 0.0f, bound(h), threads);
    seeded_fill(l.wv, kv * h, seed, index++, 0.0f, bound(h), threads);
    seeded_fill(l.wo, h * q, seed, index++, 0.0f, bound(q), threads);
    seeded_fill(l.ffn_norm, h, seed, index++, 1.0f, 0.125f, threads);
    seeded_fill(l.w_gate, f * h, seed, index++, 0.0f, bound(h), threads);
    seeded_fill(l.w_up, f * h, seed, index++, 0.0f, bound(h), threads);
    seeded_fill(l.w_down, h * f, seed, index++, 0.0f, bound(f), threads);
  }
  seeded_fill(w.final_norm, h, seed, index++, 1.0f, 0.125f, threads);
  if (!c.tied_embeddings) {
    seeded_fill(w.lm_head, int64_t{c.vocab_size} * h, seed, index++, 0.0f, bound(h), threads);
  }
  return w;
}

}  // namespace ls::gpu_test
