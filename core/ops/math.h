// The libm functions the shared ops call: CUDA's on the device, the C library's on the host.
// (expf differs between the two in the last bit for some inputs; see core/sampling.cpp's TODO.)
#pragma once

#include "core/ops/host_device.h"

#if !defined(__CUDA_ARCH__)
#include <cmath>
#endif

namespace ls::ops {

LS_HOST_DEVICE LS_INLINE float exp_f(float x) {
#if defined(__CUDA_ARCH__)
  return expf(x);
#else
  return std::exp(x);
#endif
}

LS_HOST_DEVICE LS_INLINE float sqrt_f(float x) {
#if defined(__CUDA_ARCH__)
  return sqrtf(x);
#else
  return std::sqrt(x);
#endif
}

LS_HOST_DEVICE LS_INLINE bool is_nan(float x) {
#if defined(__CUDA_ARCH__)
  return isnan(x);
#else
  return std::isnan(x);
#endif
}

LS_HOST_DEVICE LS_INLINE bool is_inf(float x) {
#if defined(__CUDA_ARCH__)
  return isinf(x);
#else
  return std::isinf(x);
#endif
}

}  // namespace ls::ops
