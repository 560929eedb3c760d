#include "core/prefix_cache.h"

#include "core/check.h"

#include <xxhash.h>

#include <algorithm>

namespace ls {

PrefixCache::PrefixCache(int32_t page_size) : page_size_(page_size) {
  LS_ASSERT(page_size >= 1, "page_size {}", page_size);
}

uint64_t PrefixCache::chain_hash(uint64_t parent_hash, std::span<const int32_t> page_tokens) {
  return XXH3_64bits_withSeed(page_tokens.data(), page_tokens.size_bytes(), parent_hash);
}

const PrefixCache::Entry* PrefixCache::find(uint64_t hash, uint64_t parent_hash,
                                            std::span<const int32_t> tokens) const {
  const auto it = by_hash_.find(hash);
  if (it == by_hash_.end()) return nullptr;
  const Entry& entry = it->second;
  const bool same = entry.parent_hash == parent_hash &&
                    std::equal(tokens.begin(), tokens.end(), entry.tokens.begin(), entry.tokens.end());
  return same ? &entry : nullptr;
}

std::vector<int32_t> PrefixCache::match(std::span<const int32_t> tokens, int32_t pages_max) const {
  std::vector<int32_t> pages;
  const int32_t p = page_size_;
  const int32_t full = std::min(pages_max, static_cast<int32_t>(tokens.size()) / p);
  uint64_t parent = kRootHash;
  for (int32_t i = 0; i < full; ++i) {
    const std::span<const int32_t> page_tokens = tokens.subspan(static_cast<size_t>(i * p), p);
    const uint64_t hash = chain_hash(parent, page_tokens);
    const Entry* entry = find(hash, parent, page_tokens);
    if (entry == nullptr) break;
    pages.push_back(entry->page);
    parent = hash;
  }
  return pages;
}

std::vector<std::pair<int32_t, int32_t>> PrefixCache::insert(std::span<const int32_t> tokens,
                                                             std::span<const int32_t> pages,
                                                             int32_t full_pages) {
  const int32_t p = page_size_;
  LS_ASSERT(full_pages <= static_cast<int32_t>(pages.size()), "{} full pages of {}", full_pages,
            pages.size());
  LS_ASSERT(int64_t{full_pages} * p <= static_cast<int64_t>(tokens.size()), "{} full pages",
            full_pages);
  std::vector<std::pair<int32_t, int32_t>> added;
  uint64_t parent = kRootHash;
  for (int32_t i = 0; i < full_pages; ++i) {
    const std::span<const int32_t> page_tokens = tokens.subspan(static_cast<size_t>(i * p), p);
    const uint64_t hash = chain_hash(parent, page_tokens);
    // An equal content cached under another page stays; this page then remains uncached. A
    // different content under the same hash (a collision) keeps the older entry too.
    if (!by_hash_.contains(hash) && !contains(pages[i])) {
      by_hash_[hash] = Entry{parent, {page_tokens.begin(), page_tokens.end()}, pages[i]};
      hash_of_page_[pages[i]] = hash;
      added.emplace_back(pages[i], i);
    }
    parent = hash;
  }
  return added;
}

void PrefixCache::erase(int32_t page) {
  const auto it = hash_of_page_.find(page);
  LS_ASSERT(it != hash_of_page_.end(), "page {} is not cached", page);
  by_hash_.erase(it->second);
  hash_of_page_.erase(it);
}

}  // namespace ls
