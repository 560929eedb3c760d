// The CPU reference's threads: how many cores this process may use, and the one way its work is
// split over them (contiguous runs, each item on one thread, so a result never depends on the
// split).
#pragma once

#include <cstdint>
#include <thread>
#include <vector>

namespace ls {

// The cores this process may run on (its CPU affinity; std::thread::hardware_concurrency() where
// that is unknown), at least 1.
int32_t host_cores();

// f(begin, end, thread) for `threads` near-equal contiguous runs [begin, end) of [0, items), the
// first on the calling thread, the others each on a thread of their own, all joined on return.
template <typename F>
void in_thread_runs(int64_t items, int32_t threads, const F& f) {
  const auto begin_of = [=](int32_t i) { return items * i / threads; };
  std::vector<std::jthread> pool;  // joined when it goes, before anything the threads read
  pool.reserve(static_cast<size_t>(threads - 1));
  for (int32_t i = 1; i < threads; ++i) {
    pool.emplace_back([=, &f] { f(begin_of(i), begin_of(i + 1), i); });
  }
  f(begin_of(0), begin_of(1), 0);
}

}  // namespace ls
