// The two forms of a weight digest (core/model/pieces_digest.h) against XXH3 applied by hand to
// the bytes laid end to end: the pieces and threads are how the digest is computed, never what.
#include "core/model/pieces_digest.h"

#include <gtest/gtest.h>
#include <xxhash.h>

#include <algorithm>
#include <cstddef>
#include <random>
#include <span>
#include <vector>

namespace ls {
namespace {

using Bytes = std::vector<std::byte>;

Bytes random_bytes(size_t count, uint32_t seed) {
  std::mt19937 rng(seed);
  Bytes bytes(count);
  for (std::byte& b : bytes) b = static_cast<std::byte>(rng() & 0xff);
  return bytes;
}

// `bytes` cut at `cuts` (sorted, within it; repeated cuts make empty pieces).
std::vector<std::span<const std::byte>> cut(const Bytes& bytes, std::vector<size_t> cuts) {
  std::sort(cuts.begin(), cuts.end());
  std::vector<std::span<const std::byte>> pieces;
  size_t at = 0;
  for (const size_t c : cuts) {
    pieces.push_back(std::span(bytes).subspan(at, c - at));
    at = c;
  }
  pieces.push_back(std::span(bytes).subspan(at));
  return pieces;
}

// The blocks form by its definition: XXH3-64 of each block of the whole, then of their digests.
uint64_t blocks_by_hand(const Bytes& whole, size_t block_bytes) {
  std::vector<uint64_t> digests;
  for (size_t at = 0; at < whole.size(); at += block_bytes) {
    digests.push_back(XXH3_64bits(whole.data() + at, std::min(block_bytes, whole.size() - at)));
  }
  return XXH3_64bits(digests.data(), digests.size() * sizeof(uint64_t));
}

TEST(PiecesDigest, EachFormIsItsDefinitionOverTheBytesEndToEnd) {
  const Bytes whole = random_bytes(10'007, 7);
  const std::vector<std::vector<size_t>> cuttings = {
      {}, {0}, {10'007}, {1, 1, 1}, {999, 1000, 1001}, {4096, 4096, 8191}, {3, 5000, 5000, 10'006}};
  for (const std::vector<size_t>& cuts : cuttings) {
    const auto pieces = cut(whole, cuts);
    EXPECT_EQ(xxh3_stream_digest(pieces), XXH3_64bits(whole.data(), whole.size()));
    for (const size_t block : {size_t{1}, size_t{7}, size_t{1000}, size_t{4096}, whole.size(),
                               whole.size() + 5}) {
      const uint64_t expected = blocks_by_hand(whole, block);
      for (const int32_t threads : {1, 2, 3, 7}) {
        EXPECT_EQ(xxh3_blocks_digest(pieces, block, threads), expected)
            << cuts.size() << " cuts, blocks of " << block << ", " << threads << " threads";
      }
    }
  }
}

TEST(PiecesDigest, NoBytesDigestAsNothing) {
  const Bytes none;
  const auto pieces = cut(none, {0, 0});
  EXPECT_EQ(xxh3_stream_digest(pieces), XXH3_64bits(nullptr, 0));
  EXPECT_EQ(xxh3_blocks_digest(pieces, 16, 3), XXH3_64bits(nullptr, 0));
}

// Every byte counts, in every block: one bit flipped anywhere changes the digest.
TEST(PiecesDigest, ABitFlippedInAnyBlockChangesTheBlocksDigest) {
  Bytes whole = random_bytes(5000, 11);
  const uint64_t base = xxh3_blocks_digest(cut(whole, {1234, 2500}), 1000, 3);
  for (const size_t at : {size_t{0}, size_t{999}, size_t{1000}, size_t{2499}, size_t{4999}}) {
    whole[at] ^= std::byte{1};
    EXPECT_NE(xxh3_blocks_digest(cut(whole, {1234, 2500}), 1000, 3), base) << "byte " << at;
    whole[at] ^= std::byte{1};
  }
}

}  // namespace
}  // namespace ls
