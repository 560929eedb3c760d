#include "core/model/rope.h"

#include "core/check.h"

#include <cmath>

namespace ls {

RopeTable build_rope_table(int32_t head_dim, float theta, int32_t positions_count) {
  LS_ASSERT(head_dim > 0 && head_dim % 2 == 0, "head_dim {}", head_dim);
  LS_ASSERT(positions_count > 0, "positions_count {}", positions_count);
  RopeTable table;
  table.half_dim = head_dim / 2;
  table.positions_count = positions_count;
  table.cos.resize(static_cast<size_t>(positions_count) * table.half_dim);
  table.sin.resize(table.cos.size());
  for (int32_t p = 0; p < positions_count; ++p) {
    for (int32_t i = 0; i < table.half_dim; ++i) {
      const double inv_freq = std::pow(static_cast<double>(theta), -2.0 * i / head_dim);
      const double angle = p * inv_freq;
      table.cos[static_cast<size_t>(p) * table.half_dim + i] = static_cast<float>(std::cos(angle));
      table.sin[static_cast<size_t>(p) * table.half_dim + i] = static_cast<float>(std::sin(angle));
    }
  }
  return table;
}

void apply_rope(const RopeTable& table, int32_t position, float* head) {
  LS_ASSERT(position >= 0 && position < table.positions_count, "position {} of {}", position,
            table.positions_count);
  const float* c = table.cos.data() + static_cast<size_t>(position) * table.half_dim;
  const float* s = table.sin.data() + static_cast<size_t>(position) * table.half_dim;
  const int32_t h = table.half_dim;
  for (int32_t i = 0; i < h; ++i) {
    const float x1 = head[i];
    const float x2 = head[i + h];
    head[i] = x1 * c[i] - x2 * s[i];
    head[i + h] = x2 * c[i] + x1 * s[i];
  }
}

}  // namespace ls
