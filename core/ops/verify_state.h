// Speculative decoding's recurrent-state rules on a model with Mamba layers (seed spec §4
// invariant 6 "with a drafter"), one definition for the CPU backend (core/cpu_backend.cpp, through
// core/seams.h), the scheduler's checkpoint bookkeeping and the CUDA pool-op kernels
// (kernels/mamba_ops.cu).
#pragma once

#include "core/ops/host_device.h"

#include <cstdint>

namespace ls::ops {

// The first page boundary past `position`: (position div P + 1)·P (position >= 0). A verified
// row whose KV grew from old to new crossed a boundary iff next_page_boundary(old, P) <= new.
LS_HOST_DEVICE LS_INLINE int32_t next_page_boundary(int32_t position, int32_t page_size) {
  return (position / page_size + 1) * page_size;
}

// The verify token whose after-state is the row's state once `tokens_in` (1 <= tokens_in <= W) of
// its verify tokens are in: tokens_in − 1 (the commit's tokens_in is a', the snapshot's fb − old).
LS_HOST_DEVICE LS_INLINE int32_t mamba_verify_state_token(int32_t tokens_in) {
  return tokens_in - 1;
}

}  // namespace ls::ops
