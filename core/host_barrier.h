// A meeting point of a fixed set of host threads that can be called off: every party's
// arrive_and_wait() returns once all parties arrived (then the barrier is ready for its next
// round), or throws HostBarrierAborted in every waiter once a party called abort() (a party that
// failed and will never arrive). std::barrier has no way to release its waiters without arriving.
// The tensor-parallel ranks sharing one GPU meet here around each collective
// (kernels/tp_collectives.cpp says why).
#pragma once

#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <stdexcept>

namespace ls {

// What a waiter of an aborted barrier throws: the party that aborted reports the real failure.
class HostBarrierAborted : public std::runtime_error {
 public:
  HostBarrierAborted() : std::runtime_error("a party of the host barrier failed before arriving") {}
};

class HostBarrier {
 public:
  explicit HostBarrier(int32_t parties);
  HostBarrier(const HostBarrier&) = delete;
  HostBarrier& operator=(const HostBarrier&) = delete;

  int32_t parties() const { return parties_; }
  // Blocks until every party arrived in this round. Throws HostBarrierAborted when the barrier
  // is aborted, before or while waiting.
  void arrive_and_wait();
  // Releases every waiter (they throw) and makes every later arrive_and_wait throw, until rearm.
  void abort();
  // Ready for use again after an abort, with no party arrived. Only while no party waits.
  void rearm();
  bool aborted() const;

 private:
  const int32_t parties_;
  mutable std::mutex mutex_;
  std::condition_variable all_arrived_;
  int32_t arrived_ = 0;
  uint64_t round_ = 0;
  bool aborted_ = false;
};

}  // namespace ls
