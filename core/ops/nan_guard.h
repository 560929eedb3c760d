// Rule 5, the NaN guard, on one logit: a NaN becomes −1e30 (and flags its row), ±inf becomes
// ±1e30, a finite value stays. Sampling then never sees a non-finite value.
#pragma once

#include "core/ops/host_device.h"
#include "core/ops/math.h"

namespace ls::ops {

inline constexpr float kSanitisedMagnitude = 1e30f;

LS_HOST_DEVICE LS_INLINE float sanitised_logit(float x) {
  if (is_nan(x)) return -kSanitisedMagnitude;
  if (is_inf(x)) return x > 0.0f ? kSanitisedMagnitude : -kSanitisedMagnitude;
  return x;
}

}  // namespace ls::ops
