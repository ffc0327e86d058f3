#include "server/server_pace.h"

#include <gtest/gtest.h>

#include "gmock/gmock.h"
#include "support/fake_clock.h"

namespace hetps {
namespace {

using ::testing::ElementsAre;
using testing::FakeClock;
using ::testing::HasSubstr;

TEST(ServerPaceTest, RealMachineSleepsNever) {
  FakeClock clock;
  ServerPace pace(nullptr, clock, clock.Now());
  EXPECT_EQ(pace.Pace(absl::Milliseconds(3)), absl::Milliseconds(3));
  EXPECT_TRUE(clock.sleeps().empty());
  EXPECT_EQ(pace.Describe(), "real machine (not emulated)");
}

TEST(ServerPaceTest, HalfSpeedDoublesTheServiceTimeAndQueuesTheExtra) {
  FakeClock clock;
  const ServerProfileConfig profile{.ranks = {1}, .speed = 0.5, .slowdowns = {}};
  ServerPace pace(&profile, clock, clock.Now());
  EXPECT_EQ(pace.Pace(absl::Milliseconds(4)), absl::Milliseconds(8));
  // FakeClock's sleeps move time on: the second request starts after the
  // first one's extra, so it waits only its own.
  EXPECT_EQ(pace.Pace(absl::Milliseconds(2)), absl::Milliseconds(4));
  EXPECT_THAT(clock.sleeps(),
              ElementsAre(absl::Milliseconds(4), absl::Milliseconds(2)));
  EXPECT_THAT(pace.Describe(), HasSubstr("50% speed"));
}

TEST(ServerPaceTest, ConcurrentExtrasAreLaidEndToEnd) {
  // Two requests finishing at the same instant: the second one's extra
  // starts when the first one's ends (one emulated CPU), so it sleeps both.
  FakeClock clock;
  const ServerProfileConfig profile{.ranks = {0}, .speed = 0.25, .slowdowns = {}};
  ServerPace pace(&profile, clock, clock.Now());
  const absl::Time t0 = clock.Now();
  pace.Pace(absl::Milliseconds(1));  // extra 3 ms, until t0 + 3 ms
  clock.Advance(-absl::Milliseconds(3));  // back to t0: "at the same time"
  ASSERT_EQ(clock.Now(), t0);
  pace.Pace(absl::Milliseconds(1));
  EXPECT_THAT(clock.sleeps(),
              ElementsAre(absl::Milliseconds(3), absl::Milliseconds(6)));
}

TEST(ServerPaceTest, SlowDownsMultiplyTheSpeed) {
  FakeClock clock;
  const ServerProfileConfig profile{
      .ranks = {0},
      .speed = 0.5,
      .slowdowns = {{.from_s = 10, .to_s = 20, .factor = 0.5}}};
  const absl::Time start = clock.Now();
  ServerPace pace(&profile, clock, start);
  EXPECT_EQ(pace.Speed(start + absl::Seconds(9)), 0.5);
  EXPECT_EQ(pace.Speed(start + absl::Seconds(10)), 0.25);
  EXPECT_EQ(pace.Speed(start + absl::Seconds(20)), 0.5);
  clock.Advance(absl::Seconds(15));
  EXPECT_EQ(pace.Pace(absl::Milliseconds(1)), absl::Milliseconds(4));
}

}  // namespace
}  // namespace hetps
