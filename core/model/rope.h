// RoPE in the Hugging Face Llama convention (rotate-half: dimension i pairs with i + head_dim/2).
// The cos/sin table is computed once, in double and rounded to float, so every backend that
// uploads it applies bit-identical rotations.
#pragma once

#include <cstdint>
#include <vector>

namespace ls {

struct RopeTable {
  int32_t half_dim = 0;
  int32_t positions_count = 0;
  std::vector<float> cos;  // [positions_count, half_dim]
  std::vector<float> sin;  // [positions_count, half_dim]
};

RopeTable build_rope_table(int32_t head_dim, float theta, int32_t positions_count);

// Rotates one head vector [head_dim] in place for `position` (< positions_count).
void apply_rope(const RopeTable& table, int32_t position, float* head);

}  // namespace ls
