// The per-element arithmetic of the logits digest and the top-k order (core/logits_digest.h
// states the definition; trace/trace.capnp "DIGESTS" is the contract). Plain integer code for the
// host and the device alike: the CPU backend (core/logits_digest.cpp) and the CUDA kernel
// (kernels/logits_ops.cu) both include it, so they compute the same function of the same bits.
#pragma once

#include "core/ops/host_device.h"

#include <cstdint>

namespace ls {

// The most (id, logit) pairs a trace records per logits row.
inline constexpr int32_t kTopLogitsCountMax = 8;

namespace digest {

LS_HOST_DEVICE inline uint64_t fmix64(uint64_t k) {
  k ^= k >> 33;
  k *= 0xFF51AFD7ED558CCDull;
  k ^= k >> 33;
  k *= 0xC4CEB9FE1A85EC53ull;
  k ^= k >> 33;
  return k;
}

// Both halves of one 32 × 32 → 64-bit product, folded: every input bit reaches the high half, so
// a change of any bits (a sign flip included) moves a_i by a value with no fixed low pattern, and
// sums over many changed logits do not cancel by construction. Two multiplies, where fmix32 (the
// definition of format 2) took two multiplies and six shift/xor steps: the device computes it for
// every logit of every recorded step.
LS_HOST_DEVICE inline uint32_t lane_a(uint32_t bits, uint32_t i) {
  const uint64_t product = static_cast<uint64_t>(bits ^ (i * 0x9E3779B1u)) * 0x85EBCA6Bu;
  return static_cast<uint32_t>(product >> 32) ^ static_cast<uint32_t>(product);
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
// Selects, no branches: a sign decides half of a row's keys, and a mispredicted branch per key
// cost the CPU reference more than the rest of its top-k.
LS_HOST_DEVICE inline uint64_t rank_key(uint32_t bits, int32_t id) {
  const uint32_t magnitude = bits & 0x7FFFFFFFu;
  bits = magnitude == 0 ? 0u : bits;                       // −0 ranks as +0
  const uint32_t flip = (0u - (bits >> 31)) | 0x80000000u;  // negative: all bits; else the sign
  const uint32_t ordered = magnitude > 0x7F800000u ? 0u : bits ^ flip;  // NaN 0; −inf 0x007FFFFF
  return (static_cast<uint64_t>(ordered) << 32) | static_cast<uint32_t>(~static_cast<uint32_t>(id));
}

}  // namespace digest

}  // namespace ls
