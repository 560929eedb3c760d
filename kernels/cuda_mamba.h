// The word layout of a hybrid step's recurrent-state lists on the device (kernels/cuda_mamba.cpp
// packs a StepPlan's into it). Every list has rows_max entries, padded with −1, so that a decode
// graph captured once reads each step's lists at the same addresses with the same grid.
#pragma once

#include "core/config.h"
#include "kernels/mamba_ops.h"

#include <cstddef>
#include <cstdint>

namespace ls {

// The mixer's shape as the kernels take it (the gated norm's eps is the model's).
inline kernels::MambaShape mamba_shape_of(const ModelConfig& model) {
  const MambaConfig& m = model.mamba;
  return kernels::MambaShape{m.heads_count, m.head_dim, m.groups_count, m.state_size,
                             m.conv_kernel, m.dt_min, m.dt_max, model.rms_eps};
}

struct MambaStagingLayout {
  size_t slots;      // [rows_max] each row's working slot; −1: a padded row or no state
  size_t copies;     // [rows_max, 2] copy-on-write (src, dst), before the forward
  size_t zeroes;     // [rows_max] working slots zeroed after the copies
  size_t snapshots;  // [rows_max, 3] a DECODE step's checkpoint candidates (row, src, dst)
  size_t verify_base;   // [rows_max] StepPlan::mamba_verify_base; −1: not a verified row
  size_t staged_words;  // the words copied from the host each step
  size_t pairs;      // [rows_max, 2] the snapshots the commit kept (device-written)
  size_t commit_pairs;  // [rows_max, 2] verified rows' accepted state → working (device-written)
  size_t words;

  explicit MambaStagingLayout(int32_t rows_max) {
    const size_t b = static_cast<size_t>(rows_max);
    slots = 0;
    copies = slots + b;
    zeroes = copies + 2 * b;
    snapshots = zeroes + b;
    verify_base = snapshots + 3 * b;
    staged_words = verify_base + b;
    pairs = staged_words;
    commit_pairs = pairs + 2 * b;
    words = commit_pairs + 2 * b;
  }
};

}  // namespace ls
