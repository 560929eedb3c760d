#include "core/page_allocator.h"

#include "core/check.h"

#include <fmt/format.h>

namespace ls {

PageAllocator::PageAllocator(int32_t pages_count, int32_t page_size)
    : pages_count_(pages_count), cache_(page_size) {
  LS_ASSERT(pages_count >= 2, "pages_count {}", pages_count);
  const size_t n = static_cast<size_t>(pages_count);
  references_.assign(n, 0);
  last_use_.assign(n, 0);
  depth_.assign(n, 0);
  for (int32_t page = pages_count - 1; page >= 1; --page) free_.push_back(page);
}

std::vector<int32_t> PageAllocator::allocate(int32_t count) {
  LS_ASSERT(count >= 0 && count <= available_count(), "allocate {} of {} available", count,
            available_count());
  std::vector<int32_t> pages;
  pages.reserve(static_cast<size_t>(count));
  for (int32_t i = 0; i < count; ++i) {
    int32_t page = 0;
    if (!free_.empty()) {
      page = free_.back();
      free_.pop_back();
    } else {
      page = std::get<2>(*evictable_.begin());
      evictable_.erase(evictable_.begin());
      cache_.erase(page);
      evicted_.push_back(page);
    }
    LS_ASSERT(references_[page] == 0, "page {} handed out with {} references", page,
              references_[page]);
    references_[page] = 1;
    ++held_count_;
    pages.push_back(page);
  }
  return pages;
}

void PageAllocator::retain(int32_t page) {
  LS_ASSERT(page >= 1 && page < pages_count_, "page {}", page);
  if (references_[page] == 0) {
    LS_ASSERT(cache_.contains(page), "retain of free page {}", page);
    evictable_.erase(evict_key(page));
    ++held_count_;
  }
  ++references_[page];
}

void PageAllocator::release(int32_t page) {
  LS_ASSERT(page >= 1 && page < pages_count_, "page {}", page);
  LS_ASSERT(references_[page] > 0, "double free of page {}", page);
  if (--references_[page] > 0) return;
  --held_count_;
  if (cache_.contains(page)) {
    evictable_.insert(evict_key(page));
  } else {
    free_.push_back(page);
  }
}

void PageAllocator::insert(std::span<const int32_t> tokens, std::span<const int32_t> pages,
                           int32_t full_pages) {
  for (int32_t i = 0; i < full_pages; ++i) {
    LS_ASSERT(references_[pages[i]] > 0, "caching page {} that nobody holds", pages[i]);
  }
  for (const auto& [page, depth] : cache_.insert(tokens, pages, full_pages)) depth_[page] = depth;
  touch(pages.first(static_cast<size_t>(full_pages)));
}

void PageAllocator::touch(std::span<const int32_t> pages) {
  ++clock_;
  for (int32_t page : pages) {
    LS_ASSERT(references_[page] > 0, "touch of unheld page {}", page);
    last_use_[page] = clock_;
  }
}

std::string PageAllocator::check() const {
  int32_t held = 0, cached_unheld = 0, free_marked = 0;
  std::vector<uint8_t> in_free(static_cast<size_t>(pages_count_), 0);
  for (int32_t page : free_) {
    if (page < 1 || page >= pages_count_) return fmt::format("free list holds page {}", page);
    if (in_free[page]) return fmt::format("page {} is on the free list twice", page);
    in_free[page] = 1;
  }
  for (int32_t page = 1; page < pages_count_; ++page) {
    const bool cached = cache_.contains(page);
    if (references_[page] > 0) ++held;
    if (references_[page] == 0 && cached) ++cached_unheld;
    if (in_free[page]) ++free_marked;
    if (in_free[page] && (references_[page] > 0 || cached)) {
      return fmt::format("page {} is free but has {} references, cached {}", page,
                         references_[page], cached);
    }
    if (references_[page] == 0 && cached && !evictable_.contains(evict_key(page))) {
      return fmt::format("unheld cached page {} is not evictable", page);
    }
  }
  if (held != held_count_) return fmt::format("held {} but counted {}", held, held_count_);
  if (cached_unheld != cached_count()) {
    return fmt::format("{} unheld cached pages but {} evictable", cached_unheld, cached_count());
  }
  if (free_marked + held + cached_unheld != pages_count_ - 1) {
    return fmt::format("free {} + held {} + cached {} != pages_count − 1 = {}", free_marked, held,
                       cached_unheld, pages_count_ - 1);
  }
  return {};
}

}  // namespace ls
