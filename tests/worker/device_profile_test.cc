#include "worker/device_profile.h"

#include <gtest/gtest.h>

#include "gmock/gmock.h"
#include "support/fake_clock.h"

namespace hetps {
namespace {

using ::testing::ElementsAre;
using testing::FakeClock;
using ::testing::HasSubstr;

TEST(DeviceProfileTest, RealMachineEmulatesNothing) {
  FakeClock clock;
  const DeviceProfile real(nullptr, 1000, clock, clock.Now());
  EXPECT_FALSE(real.emulated());
  EXPECT_TRUE(real.CheckMemory(1u << 30).ok());
  EXPECT_EQ(real.SpeedFactor(clock.Now()), 1.0);
  real.Pace(1000000, clock.Now());
  real.Throttle(1 << 30, clock.Now());
  EXPECT_TRUE(clock.sleeps().empty());
}

TEST(DeviceProfileTest, SlowDownScheduleAndLabel) {
  FakeClock clock;
  DeviceProfileConfig p{
      .ranks = {0},
      .throughput = 1000,
      .memory_mb = 2,
      .bandwidth_mbps = 100,
      .slowdowns = {{.from_s = 20, .to_s = 40, .factor = 0.3}}};
  const absl::Time start = clock.Now();
  const DeviceProfile dev(&p, 1024, clock, start);
  EXPECT_TRUE(dev.emulated());
  EXPECT_EQ(dev.SpeedFactor(start + absl::Seconds(19)), 1.0);
  EXPECT_EQ(dev.SpeedFactor(start + absl::Seconds(20)), 0.3);
  EXPECT_EQ(dev.SpeedFactor(start + absl::Seconds(39)), 0.3);
  EXPECT_EQ(dev.SpeedFactor(start + absl::Seconds(40)), 1.0);
  EXPECT_THAT(dev.Describe(),
              HasSubstr("emulated device: 1000 samples/s, 2 MB, 100 Mbit/s, "
                        "30% speed from 20 s to 40 s"));
}

TEST(DeviceProfileTest, OversizedBatchFailsAsOutOfMemory) {
  FakeClock clock;
  DeviceProfileConfig p{.ranks = {0}, .memory_mb = 1, .slowdowns = {}};
  const DeviceProfile dev(&p, 1024, clock, clock.Now());
  EXPECT_TRUE(dev.CheckMemory(1024).ok());  // exactly 1 MB
  const absl::Status oom = dev.CheckMemory(1025);
  EXPECT_EQ(oom.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(oom.message(),
              HasSubstr("emulated out of memory: a batch of 1025"));
}

// The sleeps are exactly what the emulated device still owes: the batch's
// time minus what the real work already took.
TEST(DeviceProfileTest, PaceAndThrottleSleepOffTheEmulatedTime) {
  FakeClock clock;
  DeviceProfileConfig p{
      .ranks = {0},
      .throughput = 1000,
      .bandwidth_mbps = 8,
      .slowdowns = {{.from_s = 10, .to_s = 20, .factor = 0.5}}};
  const absl::Time start = clock.Now();
  const DeviceProfile dev(&p, 0, clock, start);
  absl::Time began = clock.Now();
  clock.Advance(absl::Milliseconds(10));  // the real compute took 10 ms
  dev.Pace(50, began);                    // 50 samples at 1000/s: 50 ms
  began = clock.Now();
  dev.Throttle(40000, began);  // 320 kbit at 8 Mbit/s: 40 ms
  clock.Advance(absl::Seconds(10) - (clock.Now() - start));
  began = clock.Now();
  dev.Pace(50, began);  // inside the slow-down: half speed, 100 ms
  EXPECT_THAT(clock.sleeps(),
              ElementsAre(absl::Milliseconds(40), absl::Milliseconds(40),
                          absl::Milliseconds(100)));
}

}  // namespace
}  // namespace hetps
