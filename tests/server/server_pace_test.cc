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
  EXPECT_EQ(pace.Pace(absl::Milliseconds(3), absl::Milliseconds(3)),
            absl::Milliseconds(3));
  EXPECT_TRUE(clock.sleeps().empty());
  EXPECT_EQ(pace.Describe(), "real machine (not emulated)");
}

TEST(ServerPaceTest, HalfSpeedDoublesTheServiceTimeAndQueuesTheExtra) {
  FakeClock clock;
  const ServerProfileConfig profile{
      .ranks = {1}, .speed = 0.5, .slowdowns = {}};
  ServerPace pace(&profile, clock, clock.Now());
  EXPECT_EQ(pace.Pace(absl::Milliseconds(4), absl::Milliseconds(4)),
            absl::Milliseconds(8));
  // FakeClock's sleeps move time on: the second request starts after the
  // first one's extra, so it waits only its own.
  EXPECT_EQ(pace.Pace(absl::Milliseconds(2), absl::Milliseconds(2)),
            absl::Milliseconds(4));
  EXPECT_THAT(clock.sleeps(),
              ElementsAre(absl::Milliseconds(4), absl::Milliseconds(2)));
  EXPECT_THAT(pace.Describe(), HasSubstr("50% speed"));
}

TEST(ServerPaceTest, OnlyTheTimeOnTheCpuIsStretched) {
  // 10 ms of wall time of which 1 ms on the CPU (the rest preempted or
  // waiting for a lock): the slower machine needs 1 ms more, not 10.
  FakeClock clock;
  const ServerProfileConfig profile{
      .ranks = {0}, .speed = 0.5, .slowdowns = {}};
  ServerPace pace(&profile, clock, clock.Now());
  EXPECT_EQ(pace.Pace(absl::Milliseconds(10), absl::Milliseconds(1)),
            absl::Milliseconds(11));
  EXPECT_THAT(clock.sleeps(), ElementsAre(absl::Milliseconds(1)));
}

TEST(ServerPaceTest, ABegunWorkIsPacedByThisThreadsCpuTime) {
  // Real CPU work between Begin and Pace: at a quarter of the speed the
  // extra is three times what this thread spent on the CPU (FakeClock's time
  // stands still, so the wall time is 0 and the service time the extra).
  FakeClock clock;
  const ServerProfileConfig profile{
      .ranks = {0}, .speed = 0.25, .slowdowns = {}};
  ServerPace pace(&profile, clock, clock.Now());
  const absl::Duration cpu_before = ThreadCpuTime();
  const ServerPace::Work work = pace.Begin();
  volatile uint64_t spin = 0;
  while (ThreadCpuTime() - work.cpu_began < absl::Milliseconds(2)) {
    spin = spin + 1;
  }
  const absl::Duration service = pace.Pace(work);
  const absl::Duration cpu = ThreadCpuTime() - cpu_before;
  ASSERT_EQ(clock.sleeps().size(), 1u);
  EXPECT_EQ(clock.sleeps()[0], service);
  EXPECT_GE(service, 3 * absl::Milliseconds(2));
  EXPECT_LE(service, 3 * cpu);
}

TEST(ServerPaceTest, ConcurrentExtrasAreLaidEndToEnd) {
  // Two requests finishing at the same instant: the second one's extra
  // starts when the first one's ends (one emulated CPU), so it sleeps both.
  FakeClock clock;
  const ServerProfileConfig profile{
      .ranks = {0}, .speed = 0.25, .slowdowns = {}};
  ServerPace pace(&profile, clock, clock.Now());
  const absl::Time t0 = clock.Now();
  pace.Pace(absl::Milliseconds(1),
            absl::Milliseconds(1));       // extra 3 ms, until t0 + 3 ms
  clock.Advance(-absl::Milliseconds(3));  // back to t0: "at the same time"
  ASSERT_EQ(clock.Now(), t0);
  pace.Pace(absl::Milliseconds(1), absl::Milliseconds(1));
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
  EXPECT_EQ(pace.Pace(absl::Milliseconds(1), absl::Milliseconds(1)),
            absl::Milliseconds(4));
}

}  // namespace
}  // namespace hetps
