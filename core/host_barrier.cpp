#include "core/host_barrier.h"

#include "core/check.h"

namespace ls {

HostBarrier::HostBarrier(int32_t parties) : parties_(parties) {
  LS_REQUIRE(parties >= 1, "a host barrier of {} parties", parties);
}

void HostBarrier::arrive_and_wait() {
  std::unique_lock lock(mutex_);
  if (aborted_) throw HostBarrierAborted();
  if (++arrived_ == parties_) {
    arrived_ = 0;
    ++round_;
    all_arrived_.notify_all();
    return;
  }
  const uint64_t round = round_;
  all_arrived_.wait(lock, [&] { return round_ != round || aborted_; });
  if (round_ == round) throw HostBarrierAborted();  // released by abort, not by the last arrival
}

void HostBarrier::abort() {
  const std::lock_guard lock(mutex_);
  aborted_ = true;
  all_arrived_.notify_all();
}

void HostBarrier::rearm() {
  const std::lock_guard lock(mutex_);
  aborted_ = false;
  arrived_ = 0;
}

bool HostBarrier::aborted() const {
  const std::lock_guard lock(mutex_);
  return aborted_;
}

}  // namespace ls
