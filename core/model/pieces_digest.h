// Digests of one byte stream given as pieces in order (the canonical weight stream of
// core/model/weights.cpp: the config's text, then every tensor's fp32 bytes), in the two forms a
// trace header can name (WeightsDigestForm).
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>

namespace ls {

using BytePieces = std::span<const std::span<const std::byte>>;

// XXH3-64 of the pieces' bytes end to end, in one pass (one core).
uint64_t xxh3_stream_digest(BytePieces pieces);

// The pieces' bytes end to end, cut into blocks of `block_bytes` (the last one shorter): each
// block's XXH3-64, the blocks in contiguous runs on `threads` cores, and then XXH3-64 of those
// digests in block order as little-endian u64s. The value depends on the bytes and block_bytes
// alone, never on `threads` or on where the pieces are cut; no bytes digest as XXH3-64 of nothing.
uint64_t xxh3_blocks_digest(BytePieces pieces, uint64_t block_bytes, int32_t threads);

}  // namespace ls
