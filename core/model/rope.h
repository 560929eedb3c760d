// RoPE in the Hugging Face Llama convention (rotate-half: dimension i pairs with i + rotary_dim/2).
// rotary_dim is the head_dim, or less for a partial rotary (ModelConfig::rotary_dim()): then the
// first rotary_dim dims of a head rotate as a full RoPE of that dim would, and the rest pass
// through unchanged (transformers' apply_rotary_pos_emb keeps q[..., rotary_dim:] as it is).
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

// inv_freq [rotary_dim / 2] for the rope type, step by step in fp32 as transformers computes it
// (_compute_default/linear_scaling/llama3_parameters, their dim = int(head_dim ·
// partial_rotary_factor)), so the angles round as HF's do.
std::vector<float> rope_inverse_frequencies(const RopeConfig& rope, int32_t rotary_dim);

// angle(p, i) = fp32(p · inv_freq_i), as HF's fp32 product; cos and sin of that angle in double,
// rounded to float.
RopeTable build_rope_table(const RopeConfig& rope, int32_t rotary_dim, int32_t positions_count);

// Rotates one head vector [head_dim] in place for `position` (< positions_count): its first
// 2 · table.half_dim dims; the dims after them are left as they are.
void apply_rope(const RopeTable& table, int32_t position, float* head);

}  // namespace ls
