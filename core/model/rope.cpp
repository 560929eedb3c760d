#include "core/model/rope.h"

#include "core/check.h"
#include "core/ops/layer_math.h"

#include <cmath>
#include <numbers>

namespace ls {

namespace {

// transformers' _compute_llama3_parameters, in its fp32 tensor arithmetic (Python scalars become
// fp32 operands): frequencies whose wavelength exceeds original/low_freq_factor are divided by
// factor, those under original/high_freq_factor kept, and the band between interpolated.
float llama3_scaled(const RopeConfig& rope, float inv_freq) {
  const float factor = rope.factor;
  const auto old_context = static_cast<float>(rope.original_max_positions);
  const float low_wavelen = old_context / rope.low_freq_factor;
  const float high_wavelen = old_context / rope.high_freq_factor;
  const float wavelen = static_cast<float>(2.0 * std::numbers::pi) / inv_freq;
  const float scaled = wavelen > low_wavelen ? inv_freq / factor : inv_freq;
  const bool medium = !(wavelen < high_wavelen) && !(wavelen > low_wavelen);
  if (!medium) return scaled;
  const float smooth = (old_context / wavelen - rope.low_freq_factor) /
                       (rope.high_freq_factor - rope.low_freq_factor);
  const float left = (1.0f - smooth) * scaled / factor;
  const float right = smooth * scaled;
  return left + right;
}

}  // namespace

std::vector<float> rope_inverse_frequencies(const RopeConfig& rope, int32_t rotary_dim) {
  LS_ASSERT(rotary_dim > 0, "rotary_dim {}", rotary_dim);
  LS_ASSERT(rotary_dim % 2 == 0, "rotary_dim {}", rotary_dim);
  std::vector<float> inv_freq(static_cast<size_t>(rotary_dim / 2));
  for (int32_t i = 0; i < rotary_dim / 2; ++i) {
    // 1.0 / (base ** (arange(0, dim, 2).float() / dim)): an fp32 exponent, an fp32 power.
    const float exponent = static_cast<float>(2 * i) / static_cast<float>(rotary_dim);
    const auto power = static_cast<float>(std::pow(static_cast<double>(rope.theta),
                                                   static_cast<double>(exponent)));
    float value = 1.0f / power;
    switch (rope.type) {
      case RopeType::kDefault: break;
      case RopeType::kLinear: value = value / rope.factor; break;
      case RopeType::kLlama3: value = llama3_scaled(rope, value); break;
    }
    inv_freq[static_cast<size_t>(i)] = value;
  }
  return inv_freq;
}

RopeTable build_rope_table(const RopeConfig& rope, int32_t rotary_dim, int32_t positions_count) {
  LS_ASSERT(positions_count > 0, "positions_count {}", positions_count);
  const std::vector<float> inv_freq = rope_inverse_frequencies(rope, rotary_dim);
  RopeTable table;
  table.half_dim = rotary_dim / 2;
  table.positions_count = positions_count;
  table.cos.resize(static_cast<size_t>(positions_count) * table.half_dim);
  table.sin.resize(table.cos.size());
  for (int32_t p = 0; p < positions_count; ++p) {
    for (int32_t i = 0; i < table.half_dim; ++i) {
      const float angle = static_cast<float>(p) * inv_freq[static_cast<size_t>(i)];
      const size_t at = static_cast<size_t>(p) * table.half_dim + i;
      table.cos[at] = static_cast<float>(std::cos(static_cast<double>(angle)));
      table.sin[at] = static_cast<float>(std::sin(static_cast<double>(angle)));
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
    const ops::RotatedPair y = ops::rope_rotate(head[i], head[i + h], c[i], s[i]);
    head[i] = y.first;
    head[i + h] = y.second;
  }
}

}  // namespace ls
