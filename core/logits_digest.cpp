#include "core/logits_digest.h"

#include "core/avx512.h"

#include <cstring>

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

#if LS_HAS_AVX512_PATHS
LS_AVX512_BEGIN

// The same sums 16 logits at a time. Lane a's 32 × 32 → 64-bit products come from two unsigned
// multiplies of the even and the odd lanes (the compiler's own vectorisation widened every lane
// and multiplied 64 × 64); both factors that depend on i advance by addition. The row's last
// n mod 16 logits take the scalar definition.
LS_AVX512 uint64_t digest_avx512(const float* x, uint32_t n) {
  const __m512i lanes = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
  __m512i index_mix = _mm512_mullo_epi32(lanes, _mm512_set1_epi32(static_cast<int32_t>(0x9E3779B1u)));
  const __m512i index_mix_step = _mm512_set1_epi32(static_cast<int32_t>(16u * 0x9E3779B1u));
  __m512i odd_factor = _mm512_add_epi32(_mm512_slli_epi32(lanes, 1), _mm512_set1_epi32(1));
  const __m512i odd_factor_step = _mm512_set1_epi32(32);
  const __m512i multiplier = _mm512_set1_epi32(static_cast<int32_t>(0x85EBCA6Bu));
  const __m512i salt = _mm512_set1_epi32(0x7F4A7C15);
  __m512i a = _mm512_setzero_si512();
  __m512i b = _mm512_setzero_si512();
  uint32_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m512i bits = _mm512_loadu_si512(x + i);
    const __m512i mixed = _mm512_xor_si512(bits, index_mix);
    // Each 64-bit product folded (high XOR low) into both of its 32-bit halves: a product XOR
    // itself with its halves swapped. The swaps are shuffles, which issue beside the multiplies
    // (shifts would queue behind them).
    const __m512i even = _mm512_mul_epu32(mixed, multiplier);
    const __m512i odd = _mm512_mul_epu32(_mm512_shuffle_epi32(mixed, _MM_PERM_CDAB), multiplier);
    const __m512i even_folded = _mm512_xor_si512(even, _mm512_shuffle_epi32(even, _MM_PERM_CDAB));
    const __m512i odd_folded = _mm512_xor_si512(odd, _mm512_shuffle_epi32(odd, _MM_PERM_CDAB));
    a = _mm512_add_epi32(a, _mm512_mask_blend_epi32(0xAAAA, even_folded, odd_folded));
    b = _mm512_add_epi32(b, _mm512_mullo_epi32(_mm512_xor_si512(bits, salt), odd_factor));
    index_mix = _mm512_add_epi32(index_mix, index_mix_step);
    odd_factor = _mm512_add_epi32(odd_factor, odd_factor_step);
  }
  uint32_t a_sum = static_cast<uint32_t>(_mm512_reduce_add_epi32(a));
  uint32_t b_sum = static_cast<uint32_t>(_mm512_reduce_add_epi32(b));
  for (; i < n; ++i) {
    uint32_t bits;
    std::memcpy(&bits, x + i, sizeof bits);
    a_sum += digest::lane_a(bits, i);
    b_sum += digest::lane_b(bits, i);
  }
  return digest::finish(a_sum, b_sum, n);
}
LS_AVX512_END

using DigestFn = uint64_t (*)(const float*, uint32_t);

DigestFn fastest_digest() {
  return cpu_has_avx512() ? digest_avx512 : digest_portable;
}
#else
using DigestFn = uint64_t (*)(const float*, uint32_t);

DigestFn fastest_digest() { return digest_portable; }
#endif

// Chosen once, at the first call (a function-local static: safe from any static initialiser).
DigestFn chosen_digest() {
  static const DigestFn chosen = fastest_digest();
  return chosen;
}

}  // namespace

uint64_t logits_row_digest(std::span<const float> row) {
  return chosen_digest()(row.data(), static_cast<uint32_t>(row.size()));
}

uint64_t logits_row_digest_portable(std::span<const float> row) {
  return digest_portable(row.data(), static_cast<uint32_t>(row.size()));
}

}  // namespace ls
