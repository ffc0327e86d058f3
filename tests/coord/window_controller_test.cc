#include "coord/window_controller.h"

#include <gtest/gtest.h>

#include "gmock/gmock.h"

namespace hetps {
namespace {

using ::testing::HasSubstr;

JobConfig TenWorkers() {
  JobConfig config;
  config.cluster.workers = 10;
  config.mode = ConsistencyMode::kSemiAsync;
  return config;
}

TEST(WindowControllerTest, InitialWindowFromKnownThroughputs) {
  // SPEC §2: 3 workers at 1000 samples/s and 7 at 300 → 5100 / 300 = 17.
  JobConfig config = TenWorkers();
  std::vector<double> t = {1000, 1000, 1000, 300, 300, 300, 300, 300, 300, 300};
  EXPECT_EQ(InitialWindow(config, t), 17u);
  // From the device profiles, the same.
  config.device_profiles = {
      {.ranks = {0, 1, 2}, .throughput = 1000, .slowdowns = {}},
      {.ranks = {3, 4, 5, 6, 7, 8, 9}, .throughput = 300, .slowdowns = {}}};
  EXPECT_EQ(ProfiledThroughputs(config), t);
  EXPECT_EQ(InitialWindow(config, ProfiledThroughputs(config)), 17u);
}

TEST(WindowControllerTest, InitialWindowWithoutThroughputsOrConfigured) {
  JobConfig config = TenWorkers();
  EXPECT_EQ(InitialWindow(config, std::vector<double>(10, 0.0)), 20u);
  std::vector<double> one_unknown(10, 500.0);
  one_unknown[4] = 0;
  EXPECT_EQ(InitialWindow(config, one_unknown), 20u);
  config.window = 6;  // configured: wins
  EXPECT_EQ(InitialWindow(config, one_unknown), 6u);
  config.window = 0;
  config.semi_async.window_max = 12;  // clamped
  EXPECT_EQ(InitialWindow(config, one_unknown), 12u);
}

// A period where the queue fills to the window and applies there.
WindowSignals Healthy() {
  return {.pushes = 100,
          .pushes_into_empty = 6,
          .pulls = 100,
          .ssp_waits = 10,
          .ssp_wait_s = 0.1,
          .worker_s = 20,
          .applies = 6,
          .applies_by_time = 0};
}

TEST(WindowControllerTest, GrowsWhenTheQueueIsUsuallyEmpty) {
  SemiAsyncConfig config;
  WindowController wc(config, 8);
  EXPECT_FALSE(wc.Adjust(Healthy()).has_value());
  WindowSignals empty = Healthy();
  empty.pushes_into_empty = 60;
  auto change = wc.Adjust(empty);
  ASSERT_TRUE(change.has_value());
  EXPECT_EQ(change->from, 8u);
  EXPECT_EQ(change->to, 12u);
  EXPECT_THAT(change->reason, HasSubstr("empty at 60% of pushes (60 of 100)"));
  EXPECT_EQ(wc.window(), 12u);
}

TEST(WindowControllerTest, GrowsWhenWorkersSpendTimeHeldAtTheBound) {
  SemiAsyncConfig config;
  WindowController wc(config, 2);
  WindowSignals waits = Healthy();
  waits.ssp_waits = 30;
  waits.ssp_wait_s = 0.9;  // 4.5% of 20 worker-seconds: not yet
  EXPECT_FALSE(wc.Adjust(waits).has_value());
  waits.ssp_wait_s = 3;  // 15%
  auto change = wc.Adjust(waits);
  ASSERT_TRUE(change.has_value());
  EXPECT_EQ(change->to, 3u);  // at least +1
  EXPECT_THAT(change->reason,
              HasSubstr("15% of their time held at the staleness bound (30 of "
                        "100 pulls waited)"));
}

TEST(WindowControllerTest, ShrinksWhenTheQueueKeepsGrowing) {
  SemiAsyncConfig config;
  WindowController wc(config, 20);
  WindowSignals growing = Healthy();
  growing.applies = 10;
  growing.applies_by_time = 8;
  auto change = wc.Adjust(growing);
  ASSERT_TRUE(change.has_value());
  EXPECT_EQ(change->to, 15u);
  EXPECT_THAT(change->reason, HasSubstr("time bound"));
  // Repeated, it keeps shrinking down to window_min and stops there.
  for (int i = 0; i < 20; ++i) wc.Adjust(growing);
  EXPECT_EQ(wc.window(), static_cast<uint32_t>(config.window_min));
  EXPECT_FALSE(wc.Adjust(growing).has_value());
}

TEST(WindowControllerTest, QuietPeriodsChangeNothing) {
  SemiAsyncConfig config;
  WindowController wc(config, 8);
  EXPECT_FALSE(wc.Adjust({.pushes = 3, .pushes_into_empty = 3}).has_value());
  // Growth stops at window_max.
  config.window_max = 9;
  WindowController capped(config, 8);
  WindowSignals empty = Healthy();
  empty.pushes_into_empty = 90;
  EXPECT_EQ(capped.Adjust(empty)->to, 9u);
  EXPECT_FALSE(capped.Adjust(empty).has_value());
}

}  // namespace
}  // namespace hetps
