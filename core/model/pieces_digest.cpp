#include "core/model/pieces_digest.h"

#include "core/check.h"
#include "core/host_threads.h"

#include <xxhash.h>

#include <algorithm>
#include <bit>
#include <memory>
#include <vector>

namespace ls {

// The block digests are hashed as they sit in memory: little-endian u64s only on such a host.
static_assert(std::endian::native == std::endian::little, "blocks digest assumes little-endian");

namespace {

class Xxh3Stream {
 public:
  Xxh3Stream() : state_(XXH3_createState()) {
    LS_ASSERT(state_ != nullptr, "XXH3_createState failed");
    const XXH_errorcode reset = XXH3_64bits_reset(state_.get());
    LS_ASSERT(reset == XXH_OK, "XXH3_64bits_reset failed");
  }
  void update(std::span<const std::byte> bytes) {
    if (bytes.empty()) return;
    const XXH_errorcode status = XXH3_64bits_update(state_.get(), bytes.data(), bytes.size());
    LS_ASSERT(status == XXH_OK, "XXH3_64bits_update of {} bytes failed", bytes.size());
  }
  uint64_t digest() const { return XXH3_64bits_digest(state_.get()); }

 private:
  struct Free {
    void operator()(XXH3_state_t* state) const { XXH3_freeState(state); }
  };
  std::unique_ptr<XXH3_state_t, Free> state_;
};

// Where each piece starts in the stream, and the stream's length last.
std::vector<uint64_t> piece_starts(BytePieces pieces) {
  std::vector<uint64_t> starts;
  starts.reserve(pieces.size() + 1);
  uint64_t at = 0;
  for (const std::span<const std::byte> piece : pieces) {
    starts.push_back(at);
    at += piece.size();
  }
  starts.push_back(at);
  return starts;
}

// XXH3-64 of the stream's bytes [begin, end).
uint64_t range_digest(BytePieces pieces, const std::vector<uint64_t>& starts, uint64_t begin,
                      uint64_t end) {
  Xxh3Stream stream;
  // The last piece that starts at or before `begin` (empty pieces before it are skipped).
  size_t i = static_cast<size_t>(std::upper_bound(starts.begin(), starts.end() - 1, begin) -
                                 starts.begin()) - 1;
  for (uint64_t at = begin; at < end; ++i) {
    const uint64_t from = at - starts[i];
    const uint64_t count = std::min<uint64_t>(pieces[i].size() - from, end - at);
    stream.update(pieces[i].subspan(from, count));
    at += count;
  }
  return stream.digest();
}

}  // namespace

uint64_t xxh3_stream_digest(BytePieces pieces) {
  Xxh3Stream stream;
  for (const std::span<const std::byte> piece : pieces) stream.update(piece);
  return stream.digest();
}

uint64_t xxh3_blocks_digest(BytePieces pieces, uint64_t block_bytes, int32_t threads) {
  LS_ASSERT(block_bytes > 0 && threads > 0, "blocks of {} bytes on {} threads", block_bytes,
            threads);
  const std::vector<uint64_t> starts = piece_starts(pieces);
  const uint64_t total = starts.back();
  const uint64_t blocks = (total + block_bytes - 1) / block_bytes;
  std::vector<uint64_t> digests(blocks);
  const auto workers =
      static_cast<int32_t>(std::min<uint64_t>(threads, std::max<uint64_t>(blocks, 1)));
  in_thread_runs(static_cast<int64_t>(blocks), workers, [&](int64_t begin, int64_t end, int32_t) {
    for (int64_t b = begin; b < end; ++b) {
      const uint64_t first = static_cast<uint64_t>(b) * block_bytes;
      digests[b] = range_digest(pieces, starts, first, std::min(first + block_bytes, total));
    }
  });
  return XXH3_64bits(digests.data(), digests.size() * sizeof(uint64_t));
}

}  // namespace ls
