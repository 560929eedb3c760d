// The AVX-512 row pieces the CPU record shares (core/logits_digest.cpp, core/top_logits.cpp): the
// digest's lanes, rule 5 on 16 logits, a tail mask. Compiled only inside LS_AVX512 functions of
// those files, for CPUs that cpu_has_avx512() found.
#pragma once

#include "core/avx512.h"

#if LS_HAS_AVX512_PATHS
#include "core/logits_digest.h"
#include "core/ops/nan_guard.h"

#include <cstdint>
#include <cstring>
#include <limits>

namespace ls::avx512 {

LS_AVX512_BEGIN

// The live lanes of a vector that starts n logits before the end.
LS_AVX512 inline __mmask16 lanes_below(size_t n) {
  return static_cast<__mmask16>(n >= 16 ? 0xFFFFu : (1u << n) - 1u);
}

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

LS_AVX512_END

}  // namespace ls::avx512
#endif
