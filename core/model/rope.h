// RoPE in the Hugging Face Llama convention (rotate-half: dimension i pairs with i + head_dim/2).
// The cos/sin table is computed once, at load, from the model's RopeConfig, and every backend
// uploads the same table, so the CPU reference and CUDA apply bit-identical rotations.
#pragma once

#include "core/config.h"

#include <cstdint>
#include <vector>

namespace ls {

struct RopeTable {
  int32_t half_dim = 0;
  int32_t positions_count = 0;
  std::vector<float> cos;  // [positions_count, half_dim]
  std::vector<float> sin;  // [positions_count, half_dim]
};

// inv_freq [head_dim / 2] for the rope type, step by step in fp32 as transformers computes it
// (_compute_default/linear_scaling/llama3_parameters), so the angles round as HF's do.
std::vector<float> rope_inverse_frequencies(const RopeConfig& rope, int32_t head_dim);

// angle(p, i) = fp32(p · inv_freq_i), as HF's fp32 product; cos and sin of that angle in double,
// rounded to float.
RopeTable build_rope_table(const RopeConfig& rope, int32_t head_dim, int32_t positions_count);

// Rotates one head vector [head_dim] in place for `position` (< positions_count).
void apply_rope(const RopeTable& table, int32_t position, float* head);

}  // namespace ls
