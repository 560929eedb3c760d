#include "core/logits_digest.h"

#include "core/avx512.h"
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

// Rule 5 over a row (core/ops/nan_guard.h), in place; whether the row held a NaN. With `digest`,
// also the digest of the sanitised row, from the values as they are stored. On the bits, without
// a branch, so that it vectorises (AVX2 clone).
[[gnu::target_clones("avx2", "default")]] bool sanitise_portable(float* x, uint32_t n,
                                                                 uint64_t* digest) {
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
  if (digest) *digest = digest_portable(x, n);
  return nan != 0;
}

#if LS_HAS_AVX512_PATHS
LS_AVX512_BEGIN

// The digest's sums 16 logits at a time. Lane a's 32 × 32 → 64-bit products come from two
// unsigned multiplies of the even and the odd lanes (the compiler's own vectorisation widened
// every lane and multiplied 64 × 64); both factors that depend on i advance by addition. The
// row's last n mod 16 logits take the scalar definition (finish()).
struct DigestLanes {
  __m512i index_mix;
  __m512i odd_factor;
  __m512i a = _mm512_setzero_si512();
  __m512i b = _mm512_setzero_si512();

  LS_AVX512 DigestLanes() {
    const __m512i lanes = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    index_mix = _mm512_mullo_epi32(lanes, _mm512_set1_epi32(static_cast<int32_t>(0x9E3779B1u)));
    odd_factor = _mm512_add_epi32(_mm512_slli_epi32(lanes, 1), _mm512_set1_epi32(1));
  }

  // Logits i, …, i + 15, in order from i = 0.
  LS_AVX512 void add(__m512i bits) {
    const __m512i multiplier = _mm512_set1_epi32(static_cast<int32_t>(0x85EBCA6Bu));
    const __m512i mixed = _mm512_xor_si512(bits, index_mix);
    // Each 64-bit product folded (high XOR low) into both of its 32-bit halves: a product XOR
    // itself with its halves swapped. The swaps are shuffles, which issue beside the multiplies
    // (shifts would queue behind them).
    const __m512i even = _mm512_mul_epu32(mixed, multiplier);
    const __m512i odd = _mm512_mul_epu32(_mm512_shuffle_epi32(mixed, _MM_PERM_CDAB), multiplier);
    const __m512i even_folded = _mm512_xor_si512(even, _mm512_shuffle_epi32(even, _MM_PERM_CDAB));
    const __m512i odd_folded = _mm512_xor_si512(odd, _mm512_shuffle_epi32(odd, _MM_PERM_CDAB));
    a = _mm512_add_epi32(a, _mm512_mask_blend_epi32(0xAAAA, even_folded, odd_folded));
    b = _mm512_add_epi32(b, _mm512_mullo_epi32(_mm512_xor_si512(bits, _mm512_set1_epi32(0x7F4A7C15)),
                                               odd_factor));
    index_mix = _mm512_add_epi32(index_mix, _mm512_set1_epi32(static_cast<int32_t>(16u * 0x9E3779B1u)));
    odd_factor = _mm512_add_epi32(odd_factor, _mm512_set1_epi32(32));
  }

  // The digest of x[0, n), whose first n − n mod 16 logits were added.
  LS_AVX512 uint64_t finish(const float* x, uint32_t n) const {
    uint32_t a_sum = static_cast<uint32_t>(_mm512_reduce_add_epi32(a));
    uint32_t b_sum = static_cast<uint32_t>(_mm512_reduce_add_epi32(b));
    for (uint32_t i = n / 16 * 16; i < n; ++i) {
      uint32_t bits;
      std::memcpy(&bits, x + i, sizeof bits);
      a_sum += digest::lane_a(bits, i);
      b_sum += digest::lane_b(bits, i);
    }
    return digest::finish(a_sum, b_sum, n);
  }
};

LS_AVX512 uint64_t digest_avx512(const float* x, uint32_t n) {
  DigestLanes lanes;
  for (uint32_t i = 0; i + 16 <= n; i += 16) lanes.add(_mm512_loadu_si512(x + i));
  return lanes.finish(x, n);
}

// sanitised_logit on 16 lanes: ±inf → ±M (the sign kept), NaN → −M; the NaN lanes' mask. On the
// bits (AVX-512F has no float and/or).
LS_AVX512 inline __m512 sanitised_16(__m512 x, __mmask16& nan) {
  nan = _mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q);
  const __mmask16 infinite = _mm512_cmp_ps_mask(
      _mm512_abs_ps(x), _mm512_set1_ps(std::numeric_limits<float>::infinity()), _CMP_EQ_OQ);
  const __m512i bits = _mm512_castps_si512(x);
  const __m512i sign = _mm512_and_si512(bits, _mm512_set1_epi32(INT32_MIN));
  const __m512i magnitude = _mm512_castps_si512(_mm512_set1_ps(ops::kSanitisedMagnitude));
  const __m512i kept = _mm512_mask_mov_epi32(bits, infinite, _mm512_or_si512(sign, magnitude));
  return _mm512_mask_mov_ps(_mm512_castsi512_ps(kept), nan, _mm512_set1_ps(-ops::kSanitisedMagnitude));
}

// The guard's pass, 16 logits an instruction, with the digest of what it stores when asked: the
// record's digest then costs no pass of its own over the row.
LS_AVX512 bool sanitise_avx512(float* x, uint32_t n, uint64_t* digest) {
  DigestLanes lanes;
  __mmask16 any_nan = 0;
  uint32_t i = 0;
  for (; i + 16 <= n; i += 16) {
    __mmask16 nan;
    const __m512 clean = sanitised_16(_mm512_loadu_ps(x + i), nan);
    any_nan |= nan;
    _mm512_storeu_ps(x + i, clean);
    if (digest) lanes.add(_mm512_castps_si512(clean));
  }
  if (i < n) {  // the last n mod 16: masked, so the digest's scalar tail reads stored values
    const __mmask16 live = static_cast<__mmask16>((1u << (n - i)) - 1u);
    __mmask16 nan;
    const __m512 clean = sanitised_16(_mm512_maskz_loadu_ps(live, x + i), nan);
    any_nan |= nan & live;
    _mm512_mask_storeu_ps(x + i, live, clean);
  }
  if (digest) *digest = lanes.finish(x, n);
  return any_nan != 0;
}
LS_AVX512_END

using DigestFn = uint64_t (*)(const float*, uint32_t);
using SanitiseFn = bool (*)(float*, uint32_t, uint64_t*);

DigestFn fastest_digest() { return cpu_has_avx512() ? digest_avx512 : digest_portable; }
SanitiseFn fastest_sanitise() { return cpu_has_avx512() ? sanitise_avx512 : sanitise_portable; }
#else
using DigestFn = uint64_t (*)(const float*, uint32_t);
using SanitiseFn = bool (*)(float*, uint32_t, uint64_t*);

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

bool sanitise_logits_row(std::span<float> row, uint64_t* digest) {
  return chosen_sanitise()(row.data(), static_cast<uint32_t>(row.size()), digest);
}

bool sanitise_logits_row_portable(std::span<float> row, uint64_t* digest) {
  return sanitise_portable(row.data(), static_cast<uint32_t>(row.size()), digest);
}

}  // namespace ls
