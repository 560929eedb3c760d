// The prefix cache's recurrent-state checkpoints on a model with Mamba layers (issue 19): a pool of
// state slots, sized at start-up (mamba_slots_count − B: the slots past the B working slots), each
// free, pending (a planned step snapshots a request's state at a page boundary into it) or
// attached to the cached page that ends at that boundary. A prefix hit on such a model may stop
// only at a page with a checkpoint attached: the hit copies the checkpoint into the new request's
// working slot. A checkpoint is dropped with its page when the page is evicted, and the least
// recently used attached one is taken when a pending one needs a slot and none is free.
// Deterministic: ordered containers only.
#pragma once

#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <utility>
#include <vector>

namespace ls {

class StateCheckpoints {
 public:
  // Slots [first_slot, first_slot + count).
  StateCheckpoints(int32_t first_slot, int32_t count);

  int32_t count() const { return count_; }
  int32_t free_count() const { return static_cast<int32_t>(free_.size()); }
  int32_t attached_count() const { return static_cast<int32_t>(page_of_slot_.size()); }

  // A slot for a pending checkpoint: a free one, else the least recently used attached one (its
  // page then offers no hit); −1 when every slot is pending.
  int32_t take();
  // Gives back a pending slot.
  void give_back(int32_t slot);
  // A pending slot now holds the state at the end of cached page `page`, which has none.
  void attach(int32_t slot, int32_t page);
  // The checkpoint at the end of `page`, or −1.
  int32_t slot_of(int32_t page) const;
  // A hit used the checkpoint of `page`: the last to be taken.
  void touch(int32_t page);
  // `page` left the prefix cache: its checkpoint, if any, is free again.
  void drop_page(int32_t page);

  std::vector<int32_t> attached_pages() const;
  // Empty when the free, attached and `pending` slots partition the pool; else what is wrong.
  std::string check(const std::set<int32_t>& pending) const;

 private:
  void detach(int32_t slot);

  int32_t first_slot_;
  int32_t count_;
  std::set<int32_t> free_;
  std::map<int32_t, int32_t> slot_of_page_;
  std::map<int32_t, int32_t> page_of_slot_;
  std::map<int32_t, uint64_t> last_use_;        // attached slot → its last attach or hit
  std::set<std::pair<uint64_t, int32_t>> lru_;  // (last use, attached slot)
  uint64_t clock_ = 0;
};

}  // namespace ls
