#include "core/logits_digest.h"

#include "core/avx512.h"
#include "core/logits_avx512.h"
#include "core/ops/nan_guard.h"

#include <cstring>
#include <limits>

namespace ls {
namespace {

// Cloned for AVX2 (dispatched at load time): the loop vectorises there with 8 lanes of 32-bit
// multiplies, which x86-64's baseline SSE2 lacks. The sums are exact whatever the lane order.
[[gnu::target_clones("avx2", "default")]] uint64_t digest_portable(const float* x, uint32_t n) {
  uint32_t a = 0;
  uint32_t b = 0;
  for (uint32_t i = 0; i < n; ++i) {
    uint32_t bits;
    std::memcpy(&bits, x + i, sizeof bits);
    a += digest::lane_a(bits, i);
    b += digest::lane_b(bits, i);
  }
  return digest::finish(a, b, n);
}

// Rule 5 over a row (core/ops/nan_guard.h), in place; whether the row held a NaN. On the bits,
// without a branch, so that it vectorises (AVX2 clone).
[[gnu::target_clones("avx2", "default")]] bool sanitise_portable(float* x, uint32_t n) {
  const uint32_t positive_bits = digest::bits_of(ops::kSanitisedMagnitude);
  const uint32_t negative_bits = digest::bits_of(-ops::kSanitisedMagnitude);
  uint32_t nan = 0;
  for (uint32_t i = 0; i < n; ++i) {
    uint32_t bits;
    std::memcpy(&bits, x + i, sizeof bits);
    const uint32_t magnitude = bits & 0x7FFFFFFFu;
    const uint32_t is_nan = magnitude > 0x7F800000u ? 1u : 0u;
    const uint32_t infinite = (bits & 0x80000000u) | positive_bits;  // ±inf → ±M
    bits = magnitude == 0x7F800000u ? infinite : bits;
    bits = is_nan != 0 ? negative_bits : bits;
    nan |= is_nan;
    std::memcpy(x + i, &bits, sizeof bits);
  }
  return nan != 0;
}

#if LS_HAS_AVX512_PATHS
LS_AVX512_BEGIN

LS_AVX512 uint64_t digest_avx512(const float* x, uint32_t n) {
  avx512::DigestLanes lanes;
  for (uint32_t i = 0; i + 16 <= n; i += 16) lanes.add(_mm512_loadu_si512(x + i));
  return lanes.finish(x, n);
}

// The guard's pass, 16 logits an instruction.
LS_AVX512 bool sanitise_avx512(float* x, uint32_t n) {
  __mmask16 any_nan = 0;
  for (uint32_t i = 0; i < n; i += 16) {
    const __mmask16 live = avx512::lanes_below(n - i);
    __mmask16 nan;
    const __m512 clean = avx512::sanitised_16(_mm512_maskz_loadu_ps(live, x + i), nan);
    any_nan |= nan & live;
    _mm512_mask_storeu_ps(x + i, live, clean);
  }
  return any_nan != 0;
}
LS_AVX512_END

using DigestFn = uint64_t (*)(const float*, uint32_t);
using SanitiseFn = bool (*)(float*, uint32_t);

DigestFn fastest_digest() { return cpu_has_avx512() ? digest_avx512 : digest_portable; }
SanitiseFn fastest_sanitise() { return cpu_has_avx512() ? sanitise_avx512 : sanitise_portable; }
#else
using DigestFn = uint64_t (*)(const float*, uint32_t);
using SanitiseFn = bool (*)(float*, uint32_t);

DigestFn fastest_digest() { return digest_portable; }
SanitiseFn fastest_sanitise() { return sanitise_portable; }
#endif

// Chosen once, at the first call (function-local statics: safe from any static initialiser).
DigestFn chosen_digest() {
  static const DigestFn chosen = fastest_digest();
  return chosen;
}
SanitiseFn chosen_sanitise() {
  static const SanitiseFn chosen = fastest_sanitise();
  return chosen;
}

}  // namespace

uint64_t logits_row_digest(std::span<const float> row) {
  return chosen_digest()(row.data(), static_cast<uint32_t>(row.size()));
}

uint64_t logits_row_digest_portable(std::span<const float> row) {
  return digest_portable(row.data(), static_cast<uint32_t>(row.size()));
}

bool sanitise_logits_row(std::span<float> row) {
  return chosen_sanitise()(row.data(), static_cast<uint32_t>(row.size()));
}

bool sanitise_logits_row_portable(std::span<float> row) {
  return sanitise_portable(row.data(), static_cast<uint32_t>(row.size()));
}

}  // namespace ls
