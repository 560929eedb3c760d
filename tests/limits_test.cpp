// core/limits.h: one table of limits that ExecutorConfig, SchedulerConfig and the simulator's
// parameters embed, and that validate(), the CLI and the Python binding read. Expected ranges
// are written here by hand (the ones DESIGN.md and the seed spec give), not read from the table.
#include "core/check.h"
#include "core/limits.h"
#include "core/scheduler.h"
#include "sim/params.h"
#include "sim/world.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <vector>

namespace ls {
namespace {

using ::testing::HasSubstr;
using ::testing::ThrowsMessage;

struct Expected {
  std::string_view name;
  int64_t min, max;
};
constexpr Expected kExpected[] = {
    {"max_batch_rows", 1, 4096},     {"context_length", 2, 1 << 24}, {"page_size", 1, 4096},
    {"pages_count", 2, 1 << 26},     {"verify_width", 1, 16},        {"prefill_chunk_tokens", 1, 1 << 20},
    {"host_pages_count", 0, 1 << 26}, {"mamba_slots_count", 0, 1 << 16},
};

TEST(Limits, EachFieldIsRefusedJustOutsideItsRangeAndAcceptedAtItsEnds) {
  ASSERT_EQ(std::size(kLimitFields), std::size(kExpected));
  std::vector<int32_t Limits::*> members;
  for (size_t i = 0; i < std::size(kExpected); ++i) {
    const LimitField& field = kLimitFields[i];
    const Expected& e = kExpected[i];
    ASSERT_EQ(field.name, e.name);
    EXPECT_EQ(std::count(members.begin(), members.end(), field.member), 0) << field.name << " twice";
    members.push_back(field.member);
    EXPECT_EQ(&limit_field(field.member), &field);
    for (const int64_t ok : {e.min, e.max}) {
      Limits limits;
      limits.*field.member = static_cast<int32_t>(ok);
      EXPECT_NO_THROW(limits.validate()) << field.name << " = " << ok;
    }
    for (const int64_t bad : {e.min - 1, e.max + 1}) {
      Limits limits;
      limits.*field.member = static_cast<int32_t>(bad);
      EXPECT_THAT([&] { limits.validate(); },
                  ThrowsMessage<Error>(HasSubstr(fmt::format("{} must be in [{}, {}], got {}", e.name,
                                                             e.min, e.max, bad))));
    }
  }
}

// L = 1 admits no request (a prompt needs a token and room for the one it generates), so the
// executor refuses it as the CLI always did.
TEST(Limits, AContextOfOneTokenIsRefusedByTheExecutorAndTheScheduler) {
  ExecutorConfig executor;
  executor.context_length = 1;
  EXPECT_THAT([&] { executor.validate(); }, ThrowsMessage<Error>(HasSubstr("context_length")));
  SchedulerConfig scheduler;
  scheduler.context_length = 1;
  EXPECT_THAT([&] { Scheduler s(scheduler); }, ThrowsMessage<Error>(HasSubstr("context_length")));
}

// The former converters copied field by field; the embedded Limits carries every one of them.
TEST(Limits, TheSchedulerAndTheSimulatorRunTheLimitsTheyHold) {
  SchedulerConfig sc;
  sc.max_batch_rows = 3, sc.context_length = 77, sc.page_size = 8, sc.pages_count = 41;
  sc.verify_width = 4, sc.prefill_chunk_tokens = 19, sc.host_pages_count = 5;
  const ExecutorConfig ec = executor_config_for(sc);
  EXPECT_EQ(ec.max_batch_rows, 3);
  EXPECT_EQ(ec.context_length, 77);
  EXPECT_EQ(ec.page_size, 8);
  EXPECT_EQ(ec.pages_count, 41);
  EXPECT_EQ(ec.verify_width, 4);
  EXPECT_EQ(ec.prefill_chunk_tokens, 19);
  EXPECT_EQ(ec.host_pages_count, 5);
  const sim::SimParams p = sim::derive_params(12, sim::SimOverrides{});
  const SchedulerConfig from_sim = sim::scheduler_config_for(p);
  EXPECT_EQ(from_sim.overlap, p.overlap);
  EXPECT_EQ(from_sim.mixed_batches, p.mixed_batches);
  EXPECT_EQ(from_sim.prefix_cache, p.prefix_cache);
  EXPECT_TRUE(static_cast<const Limits&>(sim::executor_config_for(p)) == static_cast<const Limits&>(p));
}

}  // namespace
}  // namespace ls
