#include "core/mamba_mixer.h"

#include "core/ops/layer_math.h"
#include "core/ops/mamba_math.h"

#include <algorithm>

namespace ls {

namespace {

// The causal conv: each channel's window drops its oldest input and takes this token's xBC, then
// the channel is the dot of its window with its taps, oldest first, plus its bias, through SiLU.
void conv_step(const MambaConfig& m, const LayerWeights& w, const float* xbc, float* window,
               float* conv_out) {
  const int32_t k = m.conv_kernel;
  for (int32_t c = 0; c < m.conv_dim(); ++c) {
    float* row = window + static_cast<size_t>(c) * k;
    std::copy(row + 1, row + k, row);
    row[k - 1] = xbc[c];
    const float* taps = w.conv_weight.data() + static_cast<size_t>(c) * k;
    float sum = 0.0f;
    for (int32_t i = 0; i < k; ++i) sum = ops::mamba_conv_accumulate(sum, row[i], taps[i]);
    if (m.conv_bias) sum += w.conv_bias[static_cast<size_t>(c)];
    conv_out[c] = ops::silu(sum);
  }
}

// The selective scan's single step for every head: state = state · exp(dt · A) + (dt · B) · x;
// y = Σ_n state · C (n ascending) + D · x.
void scan_step(const MambaConfig& m, const LayerWeights& w, float* ssm, const float* conv_out,
               const float* dt, float* y) {
  const int32_t inner = m.inner_size();
  const int32_t n_state = m.state_size;
  const int32_t heads_per_group = m.heads_count / m.groups_count;
  const float* x = conv_out;
  for (int32_t head = 0; head < m.heads_count; ++head) {
    const int32_t group = head / heads_per_group;
    const float* b = conv_out + inner + static_cast<size_t>(group) * n_state;
    const float* c = conv_out + inner + static_cast<size_t>(m.groups_count) * n_state +
                     static_cast<size_t>(group) * n_state;
    const float step = dt[head];
    const float decay = ops::mamba_decay(step, w.a_log[static_cast<size_t>(head)]);
    for (int32_t p = 0; p < m.head_dim; ++p) {
      const int32_t i = head * m.head_dim + p;
      float* s = ssm + (static_cast<size_t>(head) * m.head_dim + p) * n_state;
      float sum = 0.0f;
      for (int32_t n = 0; n < n_state; ++n) {
        s[n] = ops::mamba_state_update(s[n], decay, step, b[n], x[i]);
        sum += s[n] * c[n];
      }
      y[i] = ops::mamba_output(sum, x[i], w.d_skip[static_cast<size_t>(head)]);
    }
  }
}

}  // namespace

MambaScratch make_mamba_scratch(const MambaConfig& m) {
  return MambaScratch{std::vector<float>(static_cast<size_t>(m.conv_dim())),
                      std::vector<float>(static_cast<size_t>(m.heads_count))};
}

void mamba_mixer_token(const MambaConfig& m, const LayerWeights& w, float rms_eps,
                       const float* proj, float* state, MambaScratch& scratch, float* y) {
  const int32_t inner = m.inner_size();
  const float* gate = proj;
  const float* xbc = proj + inner;
  const float* dt = proj + inner + m.conv_dim();
  conv_step(m, w, xbc, state, scratch.conv_out.data());
  for (int32_t head = 0; head < m.heads_count; ++head) {
    scratch.dt[static_cast<size_t>(head)] = ops::mamba_step_size(
        dt[head], w.dt_bias[static_cast<size_t>(head)], m.dt_min, m.dt_max);
  }
  scan_step(m, w, state + m.conv_state_floats(), scratch.conv_out.data(), scratch.dt.data(), y);
  // The gated RMSNorm (norm after the gate, over all of inner, as BambaRMSNormGated does).
  for (int32_t i = 0; i < inner; ++i) y[i] *= ops::silu(gate[i]);
  ops::rms_norm_row(y, w.mamba_norm.data(), inner, rms_eps, y);
}

}  // namespace ls
