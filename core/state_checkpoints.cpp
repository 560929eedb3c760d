#include "core/state_checkpoints.h"

#include "core/check.h"

#include <fmt/format.h>

namespace ls {

StateCheckpoints::StateCheckpoints(int32_t first_slot, int32_t count)
    : first_slot_(first_slot), count_(count) {
  LS_ASSERT(first_slot >= 0 && count >= 0, "checkpoint slots [{}, +{})", first_slot, count);
  for (int32_t i = 0; i < count; ++i) free_.insert(first_slot + i);
}

int32_t StateCheckpoints::take() {
  if (free_.empty() && !lru_.empty()) detach(lru_.begin()->second);
  if (free_.empty()) return -1;
  const int32_t slot = *free_.begin();
  free_.erase(free_.begin());
  return slot;
}

void StateCheckpoints::give_back(int32_t slot) {
  LS_ASSERT(slot >= first_slot_ && slot < first_slot_ + count_ && !free_.contains(slot) &&
                !page_of_slot_.contains(slot),
            "give back of checkpoint slot {}", slot);
  free_.insert(slot);
}

void StateCheckpoints::attach(int32_t slot, int32_t page) {
  LS_ASSERT(!slot_of_page_.contains(page) && !page_of_slot_.contains(slot) && !free_.contains(slot),
            "attach of slot {} to page {}", slot, page);
  slot_of_page_[page] = slot;
  page_of_slot_[slot] = page;
  last_use_[slot] = ++clock_;
  lru_.insert({clock_, slot});
}

int32_t StateCheckpoints::slot_of(int32_t page) const {
  const auto it = slot_of_page_.find(page);
  return it == slot_of_page_.end() ? -1 : it->second;
}

void StateCheckpoints::touch(int32_t page) {
  const int32_t slot = slot_of(page);
  LS_ASSERT(slot >= 0, "touch of page {} without a checkpoint", page);
  lru_.erase({last_use_[slot], slot});
  last_use_[slot] = ++clock_;
  lru_.insert({clock_, slot});
}

void StateCheckpoints::drop_page(int32_t page) {
  const int32_t slot = slot_of(page);
  if (slot >= 0) detach(slot);
}

void StateCheckpoints::detach(int32_t slot) {
  const int32_t page = page_of_slot_.at(slot);
  lru_.erase({last_use_.at(slot), slot});
  last_use_.erase(slot);
  slot_of_page_.erase(page);
  page_of_slot_.erase(slot);
  free_.insert(slot);
}

std::vector<int32_t> StateCheckpoints::attached_pages() const {
  std::vector<int32_t> pages;
  for (const auto& [page, slot] : slot_of_page_) pages.push_back(page);
  return pages;
}

std::string StateCheckpoints::check(const std::set<int32_t>& pending) const {
  std::set<int32_t> seen(free_);
  for (const auto& [slot, page] : page_of_slot_) {
    if (!seen.insert(slot).second) return fmt::format("checkpoint slot {} is free and attached", slot);
    if (slot_of_page_.count(page) != 1 || slot_of_page_.at(page) != slot) {
      return fmt::format("checkpoint slot {} and page {} disagree", slot, page);
    }
  }
  for (const int32_t slot : pending) {
    if (!seen.insert(slot).second) return fmt::format("pending checkpoint slot {} is also free or attached", slot);
  }
  if (static_cast<int32_t>(seen.size()) != count_ || lru_.size() != page_of_slot_.size()) {
    return fmt::format("checkpoint slots: {} accounted of {}", seen.size(), count_);
  }
  return {};
}

}  // namespace ls
