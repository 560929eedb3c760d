// Helpers for the GPU tests: device buffers, bf16 rounding as the device does it, seeded inputs,
// and the relative-error measure the tolerances are stated in (METHOD.md: ‖out − ref‖ / ‖ref‖).
#pragma once

#include "core/model/safetensors.h"
#include <gtest/gtest.h>

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <span>
#include <vector>

namespace ls::gpu_test {

inline bool have_device() {
  int count = 0;
  return cudaGetDeviceCount(&count) == cudaSuccess && count > 0;
}

#define LS_SKIP_WITHOUT_DEVICE() \
  if (!::ls::gpu_test::have_device()) GTEST_SKIP() << "no CUDA device"

template <typename T>
struct DeviceBuffer {
  explicit DeviceBuffer(size_t n) : count(n) {
    EXPECT_EQ(cudaMalloc(&ptr, std::max<size_t>(n, 1) * sizeof(T)), cudaSuccess);
    // Poison: every element a kernel must write is checked, so unwritten ones show up.
    EXPECT_EQ(cudaMemset(ptr, 0xff, std::max<size_t>(n, 1) * sizeof(T)), cudaSuccess);
  }
  explicit DeviceBuffer(const std::vector<T>& v) : DeviceBuffer(v.size()) { upload(v); }
  ~DeviceBuffer() { cudaFree(ptr); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  void upload(const std::vector<T>& v) {
    EXPECT_EQ(cudaMemcpy(ptr, v.data(), v.size() * sizeof(T), cudaMemcpyHostToDevice), cudaSuccess);
  }
  std::vector<T> download() const {
    std::vector<T> v(count);
    EXPECT_EQ(cudaMemcpy(v.data(), ptr, count * sizeof(T), cudaMemcpyDeviceToHost), cudaSuccess);
    return v;
  }
  T* ptr = nullptr;
  size_t count;
};

// bf16 bits as the weights' reader writes them (nearest even; safetensors.h keeps the one copy of
// the rounding). The tests' inputs are finite, where __float2bfloat16_rn gives the same bits.
inline uint16_t to_bf16_bits(float x) { return f32_to_bf16(x); }
inline float from_bf16_bits(uint16_t b) { return bf16_to_f32(b); }
inline float round_bf16(float x) { return from_bf16_bits(to_bf16_bits(x)); }

inline std::vector<__nv_bfloat16> to_bf16(const std::vector<float>& v) {
  std::vector<__nv_bfloat16> out(v.size());
  for (size_t i = 0; i < v.size(); ++i) {
    __nv_bfloat16_raw raw;
    raw.x = to_bf16_bits(v[i]);
    out[i] = __nv_bfloat16(raw);
  }
  return out;
}
inline std::vector<float> from_bf16(const std::vector<__nv_bfloat16>& v) {
  std::vector<float> out(v.size());
  for (size_t i = 0; i < v.size(); ++i) {
    const __nv_bfloat16_raw raw = v[i];
    out[i] = from_bf16_bits(raw.x);
  }
  return out;
}

// Uniform in [lo, hi) from a seeded engine, with our own conversion (platform-stable).
inline std::vector<float> random_floats(size_t n, uint32_t seed, float lo, float hi) {
  std::mt19937 engine(seed);
  std::vector<float> v(n);
  for (float& x : v) x = lo + (hi - lo) * static_cast<float>(engine() >> 8) * 0x1p-24f;
  return v;
}

// Values already representable in bf16, so CPU and GPU start from identical inputs.
inline std::vector<float> random_bf16_values(size_t n, uint32_t seed, float lo, float hi) {
  std::vector<float> v = random_floats(n, seed, lo, hi);
  for (float& x : v) x = round_bf16(x);
  return v;
}

// Whether two vectors hold the same bits, and how many elements differ (a size difference counts
// each missing element), for bit-for-bit comparisons and their failure messages.
template <typename T>
bool same_bits(const std::vector<T>& a, const std::vector<T>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(T)) == 0;
}

template <typename T>
size_t differing(const std::vector<T>& a, const std::vector<T>& b) {
  size_t n = 0;
  for (size_t i = 0; i < std::min(a.size(), b.size()); ++i) {
    n += std::memcmp(&a[i], &b[i], sizeof(T)) != 0 ? 1 : 0;
  }
  return n + (a.size() > b.size() ? a.size() - b.size() : b.size() - a.size());
}

inline double norm(std::span<const float> v) {
  double s = 0;
  for (float x : v) s += double{x} * x;
  return std::sqrt(s);
}

// ‖out − ref‖ / ‖ref‖, or ‖out − ref‖ where ref is all zeros (a state slot just zeroed); NaN
// anywhere in out gives +inf.
inline double relative_error(std::span<const float> out, std::span<const float> ref) {
  double diff = 0, base = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    if (std::isnan(out[i])) return INFINITY;
    diff += (double{out[i]} - ref[i]) * (double{out[i]} - ref[i]);
    base += double{ref[i]} * ref[i];
  }
  return base > 0 ? std::sqrt(diff) / std::sqrt(base) : std::sqrt(diff);
}

// y = x·wᵀ + beta·y in fp64 on the host (the reference of every linear-layer path).
inline std::vector<float> linear_ref(const std::vector<float>& x, const std::vector<float>& w,
                                     const std::vector<float>& y0, int32_t tokens,
                                     int32_t out_dim, int32_t in_dim, float beta) {
  std::vector<float> ref(size_t(tokens) * out_dim);
  for (int32_t t = 0; t < tokens; ++t) {
    for (int32_t o = 0; o < out_dim; ++o) {
      double s = beta * double{y0[size_t(t) * out_dim + o]};
      for (int32_t i = 0; i < in_dim; ++i) {
        s += double{x[size_t(t) * in_dim + i]} * w[size_t(o) * in_dim + i];
      }
      ref[size_t(t) * out_dim + o] = static_cast<float>(s);
    }
  }
  return ref;
}

}  // namespace ls::gpu_test
