// What a trace records of one logits row, defined once for every backend (trace/trace.capnp
// "DIGESTS" is the contract): the CPU reference computes it here, the CUDA backend in a kernel
// (kernels/logits_ops.cu) from the same per-element functions, so both give the same bits for the
// same logits bits. The functions are plain integer arithmetic so that they compile for the host
// and for the device alike.
//
// Digest of a row of V float32 values x[0..V) (the sanitised logits the sampler read):
//   u_i = the bits of x[i] (uint32)
//   p_i = (u_i XOR (i · 0x9E3779B1 mod 2^32)) · 0x85EBCA6B                  (a 64-bit product)
//   a_i = (p_i >> 32) XOR (p_i mod 2^32)
//   b_i = (u_i XOR 0x7F4A7C15) · (2i + 1)                                   (mod 2^32)
//   A = Σ a_i mod 2^32, B = Σ b_i mod 2^32
//   digest = fmix64(((A << 32) | B) XOR (V · 0x9E3779B97F4A7C15))
// The sums make the digest independent of the order in which a parallel reduction adds the terms
// (integer addition is associative). For a fixed i, b_i is a bijection of u_i (a product with an
// odd number), so every change of one value changes B; a_i folds the product's high half, which
// every bit of u_i reaches, so structured changes of many values (every sign flipped, say) move
// A by no fixed pattern. fmix64 is MurmurHash3's 64-bit finaliser. Each lane costs one or two
// multiplies: the digest runs over every logit of every recorded step (format 3; format 2's a_i
// was fmix32, two multiplies and six shift/xor steps).
//
// Top-k: the k largest (id, logit) pairs by the key (logit descending, lower id first on ties,
// NaN after every number, −0 equal to +0).
#pragma once

#include "core/ops/digest.h"

#include <cstdint>
#include <cstring>
#include <span>
#include <vector>

namespace ls {

struct TopLogit {
  int32_t id = 0;
  float logit = 0.0f;

  bool operator==(const TopLogit&) const = default;
};

namespace digest {

inline uint32_t bits_of(float x) {
  uint32_t u = 0;
  std::memcpy(&u, &x, sizeof u);
  return u;
}

}  // namespace digest

// The digest above over one row (the CPU reference of the device kernel).
// On CPUs with AVX-512, 16 logits an instruction (core/logits_digest.cpp).
uint64_t logits_row_digest(std::span<const float> row);
// The same digest by the portable loop alone (what a CPU without AVX-512 runs): for the tests
// that hold both paths to the definition.
uint64_t logits_row_digest_portable(std::span<const float> row);

// The digest of one recurrent-state slot (a model with Mamba layers; trace/trace.capnp
// "DIGESTS", mambaStateDigests): the digest above over the slot's N fp32 values in this fixed
// order — for each Mamba layer in layer order, its conv window [conv_dim, conv_kernel] (row-major,
// the oldest input first, as transformers keeps it) then its SSM state [heads, head_dim,
// state_size] — with V = N. A CUDA backend computes it from the same per-element functions.
inline uint64_t mamba_state_digest(std::span<const float> slot_state) {
  return logits_row_digest(slot_state);
}
// Rule 5, the NaN guard (core/ops/nan_guard.h), over one row in place: whether it held a NaN.
// On CPUs with AVX-512, 16 logits an instruction.
bool sanitise_logits_row(std::span<float> row);
// The same by the portable loop alone, for the tests that hold both paths to the definition.
bool sanitise_logits_row_portable(std::span<float> row);

// A recorded step's pass over one logits row: rule 5 in place (whether the row held a NaN), the
// digest above of the row as sanitised, and its top min(count, row size) pairs appended to `top`.
// What sanitise_logits_row, logits_row_digest and append_top_logits give one after the other; on
// CPUs with AVX-512 one pass over the row does the guard, the digest and the top-k's bound, and
// only the top-k's gather reads it again (core/top_logits.cpp).
bool sanitise_and_record_row(std::span<float> row, int32_t count, uint64_t& digest,
                             std::vector<TopLogit>& top);
// The same by the portable paths alone.
bool sanitise_and_record_row_portable(std::span<float> row, int32_t count, uint64_t& digest,
                                      std::vector<TopLogit>& top);

// Appends the top min(count, row size) pairs of `row` to `out`, best first.
// core/top_logits.cpp; on CPUs with AVX-512 its bounded path uses them.
void append_top_logits(std::span<const float> row, int32_t count, std::vector<TopLogit>& out);
// The same pairs by the portable path alone (what a CPU without AVX-512 runs): for the tests
// that hold both paths to the definition.
void append_top_logits_portable(std::span<const float> row, int32_t count,
                                std::vector<TopLogit>& out);

}  // namespace ls
