#include "worker/device_profile.h"

#include <gtest/gtest.h>

#include "gmock/gmock.h"

namespace hetps {
namespace {

using ::testing::HasSubstr;
using Clock = DeviceProfile::Clock;

TEST(DeviceProfileTest, RealMachineEmulatesNothing) {
  const DeviceProfile real(nullptr, 1000, Clock::now());
  EXPECT_FALSE(real.emulated());
  EXPECT_TRUE(real.CheckMemory(1u << 30).ok());
  EXPECT_EQ(real.SpeedFactor(Clock::now()), 1.0);
  const auto t0 = Clock::now();
  real.Pace(1000000, t0);
  real.Throttle(1 << 30, t0);
  EXPECT_LT(std::chrono::duration<double>(Clock::now() - t0).count(), 0.05);
}

TEST(DeviceProfileTest, SlowDownScheduleAndLabel) {
  DeviceProfileConfig p{
      .ranks = {0},
      .throughput = 1000,
      .memory_mb = 2,
      .bandwidth_mbps = 100,
      .slowdowns = {{.from_s = 20, .to_s = 40, .factor = 0.3}}};
  const auto start = Clock::now();
  const DeviceProfile dev(&p, 1024, start);
  EXPECT_TRUE(dev.emulated());
  EXPECT_EQ(dev.SpeedFactor(start + std::chrono::seconds(19)), 1.0);
  EXPECT_EQ(dev.SpeedFactor(start + std::chrono::seconds(20)), 0.3);
  EXPECT_EQ(dev.SpeedFactor(start + std::chrono::seconds(39)), 0.3);
  EXPECT_EQ(dev.SpeedFactor(start + std::chrono::seconds(40)), 1.0);
  EXPECT_THAT(dev.Describe(),
              HasSubstr("emulated device: 1000 samples/s, 2 MB, 100 Mbit/s, "
                        "30% speed from 20 s to 40 s"));
}

TEST(DeviceProfileTest, OversizedBatchFailsAsOutOfMemory) {
  DeviceProfileConfig p{.ranks = {0}, .memory_mb = 1, .slowdowns = {}};
  const DeviceProfile dev(&p, 1024, Clock::now());
  EXPECT_TRUE(dev.CheckMemory(1024).ok());  // exactly 1 MB
  const absl::Status oom = dev.CheckMemory(1025);
  EXPECT_EQ(oom.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(oom.message(),
              HasSubstr("emulated out of memory: a batch of 1025"));
}

TEST(DeviceProfileTest, PaceAndThrottleTakeTheEmulatedTime) {
  DeviceProfileConfig p{
      .ranks = {0}, .throughput = 1000, .bandwidth_mbps = 8, .slowdowns = {}};
  const DeviceProfile dev(&p, 0, Clock::now());
  auto t0 = Clock::now();
  dev.Pace(50, t0);  // 50 samples at 1000/s: 50 ms
  double took = std::chrono::duration<double>(Clock::now() - t0).count();
  EXPECT_GE(took, 0.050);
  EXPECT_LT(took, 0.5);
  t0 = Clock::now();
  dev.Throttle(40000, t0);  // 320 kbit at 8 Mbit/s: 40 ms
  took = std::chrono::duration<double>(Clock::now() - t0).count();
  EXPECT_GE(took, 0.040);
  EXPECT_LT(took, 0.5);
}

}  // namespace
}  // namespace hetps
