// The libm functions the shared ops call: CUDA's on the device, the C library's on the host.
// (expf differs between the two in the last bit for some inputs: what must agree bit for bit
// calls core/ops/portable_exp.h instead.)
#pragma once

#include "core/ops/host_device.h"

#if !defined(__CUDA_ARCH__)
#include <cmath>
#endif

namespace ls::ops {

#if defined(__CUDA_ARCH__)
LS_HOST_DEVICE LS_INLINE float exp_f(float x) { return expf(x); }
LS_HOST_DEVICE LS_INLINE float log1p_f(float x) { return log1pf(x); }
LS_HOST_DEVICE LS_INLINE float sqrt_f(float x) { return sqrtf(x); }
LS_HOST_DEVICE LS_INLINE bool is_nan(float x) { return isnan(x); }
LS_HOST_DEVICE LS_INLINE bool is_inf(float x) { return isinf(x); }
#else
LS_HOST_DEVICE LS_INLINE float exp_f(float x) { return std::exp(x); }
LS_HOST_DEVICE LS_INLINE float log1p_f(float x) { return std::log1p(x); }
LS_HOST_DEVICE LS_INLINE float sqrt_f(float x) { return std::sqrt(x); }
LS_HOST_DEVICE LS_INLINE bool is_nan(float x) { return std::isnan(x); }
LS_HOST_DEVICE LS_INLINE bool is_inf(float x) { return std::isinf(x); }
#endif

}  // namespace ls::ops
