// LiveSet keeps the live workers' clocks ordered for SlowestLiveClock:
// checked against the definition (the smallest ClockOf over the live
// workers but `except`, 0 when none) through random clocks, joins and
// leaves.
#include <gtest/gtest.h>

#include <limits>
#include <random>
#include <vector>

#include "server/aggregator_modes.h"

namespace hetps {
namespace {

using aggregator_internal::LiveSet;

uint64_t Slowest(const LiveSet& live, uint32_t except) {
  uint64_t slowest = std::numeric_limits<uint64_t>::max();
  for (uint32_t w : live.workers()) {
    if (w != except) slowest = std::min(slowest, live.ClockOf(w));
  }
  return slowest == std::numeric_limits<uint64_t>::max() ? 0 : slowest;
}

TEST(LiveSetTest, SlowestLiveClockFollowsClocksJoinsAndLeaves) {
  constexpr uint32_t kWorkers = 12;
  LiveSet live(kWorkers);
  std::mt19937 rng(7);
  uint64_t epoch = 0;
  const uint32_t none = std::numeric_limits<uint32_t>::max();
  for (int step = 0; step < 20000; ++step) {
    const uint32_t w = rng() % (kWorkers + 2);  // some never live
    switch (rng() % 8) {
      case 0: {  // a new live set: each worker in or out
        std::vector<uint32_t> members;
        for (uint32_t m = 0; m < kWorkers; ++m) {
          if (rng() % 3 != 0) members.push_back(m);
        }
        ASSERT_TRUE(live.Update(++epoch, members));
        // An older epoch changes nothing.
        EXPECT_FALSE(live.Update(epoch - 1, {}));
        break;
      }
      default: {
        // Clocks move on by a little, often to a value others hold too;
        // an older clock is ignored.
        const uint64_t to = live.ClockOf(w) + rng() % 3;
        const bool grows = to > live.ClockOf(w);
        EXPECT_EQ(live.NoteClock(w, to), grows);
        if (rng() % 4 == 0) {
          EXPECT_FALSE(live.NoteClock(w, to / 2));
        }
        break;
      }
    }
    ASSERT_EQ(live.SlowestLiveClock(), Slowest(live, none)) << step;
    ASSERT_EQ(live.SlowestLiveClock(w), Slowest(live, w)) << step;
  }
}

TEST(LiveSetTest, AloneOrEmptyTheSlowestIsZero) {
  LiveSet live(1);
  EXPECT_TRUE(live.NoteClock(0, 5));
  EXPECT_EQ(live.SlowestLiveClock(), 5u);
  EXPECT_EQ(live.SlowestLiveClock(0), 0u);  // nobody else
  ASSERT_TRUE(live.Update(1, {}));
  EXPECT_EQ(live.SlowestLiveClock(), 0u);
  // A worker that comes back brings its clock.
  ASSERT_TRUE(live.Update(2, {0}));
  EXPECT_EQ(live.SlowestLiveClock(), 5u);
}

}  // namespace
}  // namespace hetps
