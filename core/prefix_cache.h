// The prefix cache's content index (seed spec §8): full KV pages keyed by a chained content hash,
// hash(page i) = XXH3-64(tokens of page i, seed = hash(page i − 1)), so a page is found only when
// every token before it matches too. It maps hashes to pages and knows nothing of references or
// eviction order; the PageAllocator owns those.
#pragma once

#include <cstdint>
#include <map>
#include <span>
#include <vector>

namespace ls {

class PrefixCache {
 public:
  explicit PrefixCache(int32_t page_size);

  // Hash of one full page given the hash of the page before it (kRootHash for page 0).
  static uint64_t chain_hash(uint64_t parent_hash, std::span<const int32_t> page_tokens);
  static constexpr uint64_t kRootHash = 0;

  // Cached pages holding tokens[0, n·P) in order, n <= pages_max: the longest cached prefix.
  std::vector<int32_t> match(std::span<const int32_t> tokens, int32_t pages_max) const;
  // Caches pages[i] as tokens[i·P, (i+1)·P) for i < full_pages, skipping contents already cached.
  // Returns the pages newly cached with their chain depth (0 = the first page).
  std::vector<std::pair<int32_t, int32_t>> insert(std::span<const int32_t> tokens,
                                                  std::span<const int32_t> pages,
                                                  int32_t full_pages);
  bool contains(int32_t page) const { return hash_of_page_.contains(page); }
  void erase(int32_t page);
  int32_t pages_count() const { return static_cast<int32_t>(hash_of_page_.size()); }

 private:
  struct Entry {
    uint64_t parent_hash = 0;
    std::vector<int32_t> tokens;  // [P] kept to rule out hash collisions
    int32_t page = 0;
  };
  const Entry* find(uint64_t hash, uint64_t parent_hash, std::span<const int32_t> tokens) const;

  int32_t page_size_;
  std::map<uint64_t, Entry> by_hash_;
  std::map<int32_t, uint64_t> hash_of_page_;
};

}  // namespace ls
