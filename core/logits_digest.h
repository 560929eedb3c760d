// What a trace records of one logits row, defined once for every backend (trace/trace.capnp
// "DIGESTS" is the contract): the CPU reference computes it here, the CUDA backend in a kernel
// (kernels/record_ops.cu) from the same per-element functions, so both give the same bits for the
// same logits bits. The functions are plain integer arithmetic so that they compile for the host
// and for the device alike.
//
// Digest of a row of V float32 values x[0..V) (the sanitised logits the sampler read):
//   u_i = the bits of x[i] (uint32)
//   a_i = fmix32(u_i XOR (i · 0x9E3779B1))
//   b_i = (u_i XOR 0x7F4A7C15) · (2i + 1)                                   (all mod 2^32)
//   A = Σ a_i mod 2^32, B = Σ b_i mod 2^32
//   digest = fmix64(((A << 32) | B) XOR (V · 0x9E3779B97F4A7C15))
// The sums make the digest independent of the order in which a parallel reduction adds the terms
// (integer addition is associative); for a fixed i both a_i and b_i are bijections of u_i (fmix32
// is one, and so is a product with an odd number), so every change of one value changes both A
// and B. fmix32 / fmix64 are MurmurHash3's finalisers. b_i costs one multiply: the digest runs
// over every logit of every step.
//
// Top-k: the k largest (id, logit) pairs by the key (logit descending, lower id first on ties,
// NaN after every number, −0 equal to +0).
#pragma once

#include <cstdint>
#include <cstring>
#include <span>
#include <vector>

#if defined(__CUDACC__)
#define LS_HOST_DEVICE __host__ __device__
#else
#define LS_HOST_DEVICE
#endif

namespace ls {

inline constexpr int32_t kTopLogitsCountMax = 8;

struct TopLogit {
  int32_t id = 0;
  float logit = 0.0f;

  bool operator==(const TopLogit&) const = default;
};

namespace digest {

LS_HOST_DEVICE inline uint32_t fmix32(uint32_t h) {
  h ^= h >> 16;
  h *= 0x85EBCA6Bu;
  h ^= h >> 13;
  h *= 0xC2B2AE35u;
  h ^= h >> 16;
  return h;
}

LS_HOST_DEVICE inline uint64_t fmix64(uint64_t k) {
  k ^= k >> 33;
  k *= 0xFF51AFD7ED558CCDull;
  k ^= k >> 33;
  k *= 0xC4CEB9FE1A85EC53ull;
  k ^= k >> 33;
  return k;
}

LS_HOST_DEVICE inline uint32_t lane_a(uint32_t bits, uint32_t i) {
  return fmix32(bits ^ (i * 0x9E3779B1u));
}

LS_HOST_DEVICE inline uint32_t lane_b(uint32_t bits, uint32_t i) {
  return (bits ^ 0x7F4A7C15u) * (2u * i + 1u);
}

LS_HOST_DEVICE inline uint64_t finish(uint32_t a, uint32_t b, uint32_t count) {
  const uint64_t lanes = (static_cast<uint64_t>(a) << 32) | b;
  return fmix64(lanes ^ (static_cast<uint64_t>(count) * 0x9E3779B97F4A7C15ull));
}

// A total order for top-k as one unsigned key: larger ranks first. The value's bits made
// monotonic (−0 as +0; NaN below every number) above, the id's complement below.
LS_HOST_DEVICE inline uint64_t rank_key(uint32_t bits, int32_t id) {
  uint32_t ordered = 0;  // NaN
  const bool nan = (bits & 0x7FFFFFFFu) > 0x7F800000u;
  if (!nan) {
    if ((bits & 0x7FFFFFFFu) == 0) bits = 0;  // −0 ranks as +0
    ordered = (bits & 0x80000000u) ? ~bits : (bits | 0x80000000u);  // never 0: −inf is 0x007FFFFF
  }
  return (static_cast<uint64_t>(ordered) << 32) | static_cast<uint32_t>(~static_cast<uint32_t>(id));
}

inline uint32_t bits_of(float x) {
  uint32_t u = 0;
  std::memcpy(&u, &x, sizeof u);
  return u;
}

}  // namespace digest

// The digest above over one row (the CPU reference of the device kernel).
uint64_t logits_row_digest(std::span<const float> row);

// Appends the top min(count, row size) pairs of `row` to `out`, best first.
void append_top_logits(std::span<const float> row, int32_t count, std::vector<TopLogit>& out);

}  // namespace ls
