// core/host_barrier.h: no party passes a round before every party arrived in it, and an abort
// releases the waiters (they throw) instead of leaving them blocked.
#include "core/host_barrier.h"

#include "core/check.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <thread>
#include <vector>

namespace ls {
namespace {

TEST(HostBarrier, NoPartyLeavesARoundBeforeEveryPartyArrivedInIt) {
  constexpr int32_t kParties = 3;
  constexpr int32_t kRounds = 2000;
  HostBarrier barrier(kParties);
  // arrivals[round]: parties that reached the barrier in that round. A party that left round r
  // early would see fewer than kParties there.
  std::vector<std::atomic<int32_t>> arrivals(kRounds);
  std::atomic<int32_t> early_leaves{0};
  std::vector<std::thread> threads;
  for (int32_t p = 0; p < kParties; ++p) {
    threads.emplace_back([&, p] {
      for (int32_t round = 0; round < kRounds; ++round) {
        if ((round + p) % 7 == 0) std::this_thread::yield();  // vary who arrives last
        arrivals[static_cast<size_t>(round)].fetch_add(1);
        barrier.arrive_and_wait();
        if (arrivals[static_cast<size_t>(round)].load() != kParties) early_leaves.fetch_add(1);
      }
    });
  }
  for (std::thread& t : threads) t.join();
  EXPECT_EQ(early_leaves.load(), 0);
  for (int32_t round = 0; round < kRounds; ++round) {
    ASSERT_EQ(arrivals[static_cast<size_t>(round)].load(), kParties) << "round " << round;
  }
}

TEST(HostBarrier, AnAbortReleasesTheWaitersWhoThrowAndARearmedBarrierMeetsAgain) {
  HostBarrier barrier(2);
  std::atomic<bool> threw{false};
  std::thread waiter([&] {
    try {
      barrier.arrive_and_wait();  // its peer never arrives: only the abort ends the wait
    } catch (const HostBarrierAborted&) {
      threw = true;
    }
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(20));  // let it block (either order works)
  barrier.abort();
  waiter.join();
  EXPECT_TRUE(threw.load());
  EXPECT_TRUE(barrier.aborted());
  EXPECT_THROW(barrier.arrive_and_wait(), HostBarrierAborted) << "arrivals after an abort";
  barrier.rearm();
  EXPECT_FALSE(barrier.aborted());
  std::atomic<int32_t> passed{0};
  std::thread peer([&] {
    barrier.arrive_and_wait();
    passed.fetch_add(1);
  });
  barrier.arrive_and_wait();
  passed.fetch_add(1);
  peer.join();
  EXPECT_EQ(passed.load(), 2) << "the rearmed barrier's round: both parties pass";
}

TEST(HostBarrier, ABarrierOfNoPartiesIsRefused) {
  EXPECT_THROW(HostBarrier(0), Error);
}

}  // namespace
}  // namespace ls
