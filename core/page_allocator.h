// Device KV pages for the scheduler: reference counts, a free list, and the prefix cache's pages
// that no request holds, evicted in LRU order (leaves of a chain first) when the free list runs
// dry. Page 0 is the dummy page and is never handed out. Deterministic: no decision depends on an
// unordered container.
#pragma once

#include "core/prefix_cache.h"

#include <cstdint>
#include <set>
#include <span>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

namespace ls {

class PageAllocator {
 public:
  PageAllocator(int32_t pages_count, int32_t page_size);

  // Pages an allocation can get now: free ones plus cached ones nobody holds.
  int32_t available_count() const { return free_count() + cached_count(); }
  int32_t free_count() const { return static_cast<int32_t>(free_.size()); }
  int32_t cached_count() const { return static_cast<int32_t>(evictable_.size()); }
  int32_t held_count() const { return held_count_; }
  int32_t references_of(int32_t page) const { return references_[page]; }
  bool is_cached(int32_t page) const { return cache_.contains(page); }

  // `count` pages with one reference each; evicts when needed. count <= available_count().
  std::vector<int32_t> allocate(int32_t count);
  // The cached pages evicted since the last call (what hangs off them, a checkpoint, goes too).
  std::vector<int32_t> take_evicted() { return std::exchange(evicted_, {}); }
  void retain(int32_t page);
  void release(int32_t page);

  std::vector<int32_t> match(std::span<const int32_t> tokens, int32_t pages_max) const {
    return cache_.match(tokens, pages_max);
  }
  // Caches the first `full_pages` pages of a request (it holds them) as the content of `tokens`.
  void insert(std::span<const int32_t> tokens, std::span<const int32_t> pages, int32_t full_pages);
  // Marks held pages as just used, for the LRU order once they are released.
  void touch(std::span<const int32_t> pages);

  // Empty when the free list, the evictable set and the counts agree; else what is wrong.
  std::string check() const;

 private:
  using EvictKey = std::tuple<uint64_t, int32_t, int32_t>;  // (last use, −depth, page)
  EvictKey evict_key(int32_t page) const { return {last_use_[page], -depth_[page], page}; }

  int32_t pages_count_;
  PrefixCache cache_;
  std::vector<int32_t> free_;        // stack; the top is handed out first
  std::set<EvictKey> evictable_;     // cached pages with no reference
  std::vector<int32_t> references_;  // [pages_count]
  std::vector<uint64_t> last_use_;   // [pages_count]
  std::vector<int32_t> depth_;       // [pages_count] chain depth while cached
  uint64_t clock_ = 0;
  int32_t held_count_ = 0;
  std::vector<int32_t> evicted_;
};

}  // namespace ls
