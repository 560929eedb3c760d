// The context clamp (seed spec §4 invariant 1): a' = min(a, max(0, L − vcl_old)). No commit may
// take a row's valid cache length past the context length L. The CPU backend applies it at its
// two sites (core/cpu_backend.cpp), the CUDA finish kernel once (kernels/sampling_ops.cu), and the
// drafter and the invariant checks read it from here.
#pragma once

#include "core/ops/host_device.h"

#include <cstdint>

namespace ls::ops {

LS_HOST_DEVICE LS_INLINE int32_t clamp_accepted_to_context(int32_t accepted, int32_t vcl_old,
                                                           int32_t context_length) {
  const int32_t room = context_length - vcl_old;
  const int32_t limit = room > 0 ? room : 0;
  return accepted < limit ? accepted : limit;
}

}  // namespace ls::ops
