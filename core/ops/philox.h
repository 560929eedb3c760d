// Philox4x32-10 (Salmon et al., SC'11, Random123) and the float conversion: the only source of
// randomness of sampling (core/sampling.cpp, kernels/sampling_ops.cu) and of seeded weights
// (core/model/weights.cpp, kernels/weight_init.cu). Integer arithmetic and one exact float
// conversion, so the host and the device draw the same bits.
#pragma once

#include "core/ops/host_device.h"

#include <cstdint>

namespace ls::ops {

// Round multipliers and Weyl key increments.
inline constexpr uint32_t kPhiloxM0 = 0xD2511F53u;
inline constexpr uint32_t kPhiloxM1 = 0xCD9E8D57u;
inline constexpr uint32_t kPhiloxW0 = 0x9E3779B9u;
inline constexpr uint32_t kPhiloxW1 = 0xBB67AE85u;
inline constexpr int kPhiloxRounds = 10;

// Draw indices at one sampling position: each use of randomness has its own stream.
inline constexpr uint32_t kDrawSample = 0;
inline constexpr uint32_t kDrawCoin = 1;
inline constexpr uint32_t kDrawCorrection = 2;

struct PhiloxBlock {
  uint32_t word[4];
};

struct PhiloxKey {
  uint32_t word[2];
};

LS_HOST_DEVICE LS_INLINE uint32_t mul_hi(uint32_t a, uint32_t b) {
#if defined(__CUDA_ARCH__)
  return __umulhi(a, b);
#else
  return static_cast<uint32_t>((uint64_t{a} * b) >> 32);
#endif
}

LS_HOST_DEVICE LS_INLINE PhiloxBlock philox_round(const PhiloxBlock& c, const PhiloxKey& key) {
  const uint32_t hi0 = mul_hi(kPhiloxM0, c.word[0]), lo0 = kPhiloxM0 * c.word[0];
  const uint32_t hi1 = mul_hi(kPhiloxM1, c.word[2]), lo1 = kPhiloxM1 * c.word[2];
  return PhiloxBlock{{hi1 ^ c.word[1] ^ key.word[0], lo1, hi0 ^ c.word[3] ^ key.word[1], lo0}};
}

// The generator on `Lanes` full 4-word counters under one key, as Random123 defines it (and its
// known answers), every round over all lanes before the next: one lane is a draw; many let the
// host's compiler keep the lanes in vector registers (weights_from_seed seeds 16 at a time).
template <int Lanes>
LS_HOST_DEVICE LS_INLINE void philox4x32_10_lanes(PhiloxBlock (&counters)[Lanes], PhiloxKey key) {
  for (int round = 0; round < kPhiloxRounds; ++round) {
    if (round > 0) {
      key.word[0] += kPhiloxW0;
      key.word[1] += kPhiloxW1;
    }
    for (int lane = 0; lane < Lanes; ++lane) counters[lane] = philox_round(counters[lane], key);
  }
}

LS_HOST_DEVICE LS_INLINE PhiloxBlock philox4x32_10(PhiloxBlock counter, PhiloxKey key) {
  PhiloxBlock lanes[1] = {counter};
  philox4x32_10_lanes(lanes, key);
  return lanes[0];
}

// The counter (counter0 lo, counter0 hi, counter1, 0) and the key (key lo, key hi) of one draw.
LS_HOST_DEVICE LS_INLINE PhiloxBlock philox_counter(uint64_t counter0, uint32_t counter1) {
  return PhiloxBlock{{static_cast<uint32_t>(counter0), static_cast<uint32_t>(counter0 >> 32),
                      counter1, 0u}};
}
LS_HOST_DEVICE LS_INLINE PhiloxKey philox_key(uint64_t key) {
  return PhiloxKey{{static_cast<uint32_t>(key), static_cast<uint32_t>(key >> 32)}};
}

// Word 0 at philox_key(key), philox_counter(counter0, counter1): one draw.
LS_HOST_DEVICE LS_INLINE uint32_t philox_word0(uint64_t key, uint64_t counter0, uint32_t counter1) {
  return philox4x32_10(philox_counter(counter0, counter1), philox_key(key)).word[0];
}

// A uniform float in [0, 1) from the top 24 bits of a Philox word: 24 bits fill a float's
// significand exactly, so the conversion and the scaling are exact on every platform.
LS_HOST_DEVICE LS_INLINE float uniform_from_bits(uint32_t bits) {
  return static_cast<float>(bits >> 8) * 0x1p-24f;
}

// The draw of sampling at sequence `position` (>= 0) for draw index kDrawSample, kDrawCoin, ...
LS_HOST_DEVICE LS_INLINE float draw_uniform(uint64_t seed, int64_t position, uint32_t draw_index) {
  return uniform_from_bits(philox_word0(seed, static_cast<uint64_t>(position), draw_index));
}

}  // namespace ls::ops
