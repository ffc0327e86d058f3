#include "coord/window_controller.h"

#include <gtest/gtest.h>

#include <tuple>

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
          .worker_wait_s = {{0, 0.05}, {1, 0.05}},
          .period_s = 2,
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

TEST(WindowControllerTest, GrowsWhenAWorkerSpendsTimeHeldAtTheBound) {
  SemiAsyncConfig config;
  WindowController wc(config, 2);
  WindowSignals waits = Healthy();
  waits.ssp_waits = 30;
  waits.worker_wait_s[7] = 0.058;  // 2.9% of its 2 s: not yet
  EXPECT_FALSE(wc.Adjust(waits).has_value());
  // One worker held 4% of the period grows the window although all ten
  // together were held well under 1% of theirs: a fast worker waiting on
  // slow ones is the case an average hides.
  waits.worker_wait_s[7] = 0.08;
  auto change = wc.Adjust(waits);
  ASSERT_TRUE(change.has_value());
  EXPECT_EQ(change->to, 3u);  // at least +1
  EXPECT_THAT(change->reason,
              HasSubstr("worker 7 spent 4.0% of its time held at the "
                        "staleness bound (all workers 0.9%; 30 of 100 pulls "
                        "waited)"));
}

// A worker's pulls wait on every server at once: its time held is the most
// any server held it, not the sum.
TEST(WindowControllerTest, PerWorkerWaitsAreTheMostHoldingServersAndDiffed) {
  rpc::TableInfoResponse a;
  rpc::TableInfoResponse b;
  for (auto [info, wait3, wait5] :
       {std::tuple{&a, 0.5, 0.25}, std::tuple{&b, 0.75, 0.0}}) {
    info->mutable_stats()->set_pushes(10);
    rpc::WorkerClock* c = info->mutable_stats()->add_clocks();
    c->set_worker(3);
    c->set_ssp_wait_seconds(wait3);
    c = info->mutable_stats()->add_clocks();
    c->set_worker(5);
    c->set_ssp_wait_seconds(wait5);
  }
  const WindowSignals first = SumSignals({a, std::nullopt, b});
  EXPECT_EQ(first.pushes, 20u);
  EXPECT_DOUBLE_EQ(first.worker_wait_s.at(3), 0.75);
  EXPECT_DOUBLE_EQ(first.worker_wait_s.at(5), 0.25);
  a.mutable_stats()->set_pushes(30);
  a.mutable_stats()->mutable_clocks(0)->set_ssp_wait_seconds(2.5);
  const WindowSignals period = SignalsSince(SumSignals({a, b}), first);
  EXPECT_EQ(period.pushes, 20u);
  EXPECT_DOUBLE_EQ(period.worker_wait_s.at(3), 1.75);
  EXPECT_DOUBLE_EQ(period.worker_wait_s.at(5), 0.0);
}

TEST(WindowControllerTest, GrowsBeforeADriftingLeadReachesTheWindow) {
  SemiAsyncConfig config;
  WindowController wc(config, 17);
  WindowSignals drift = Healthy();
  drift.leader = 2;
  drift.lead = 12;
  drift.lead_change = 2;  // 12 + 2 × 2 < 17: not yet
  EXPECT_FALSE(wc.Adjust(drift).has_value());
  drift.lead = 13;  // 13 + 2 × 2 = 17: reaches it within two periods
  auto change = wc.Adjust(drift);
  ASSERT_TRUE(change.has_value());
  EXPECT_EQ(change->to, 26u);
  EXPECT_THAT(change->reason,
              HasSubstr("worker 2 leads the slowest live worker by 13 clocks, "
                        "2 more than a period ago"));
  // A lead that is large but holds still needs nothing (if it held a
  // worker at the bound, the wait rule says so).
  drift.lead = 25;
  drift.lead_change = 0;
  EXPECT_FALSE(wc.Adjust(drift).has_value());
  drift.lead_change = -3;
  EXPECT_FALSE(wc.Adjust(drift).has_value());
  // A queue that the time bound applies says the window is larger than the
  // pushes need (a straggler's step outlasts the bound), drift or not.
  drift.lead = 30;
  drift.lead_change = 5;
  drift.applies = 10;
  drift.applies_by_time = 8;
  change = wc.Adjust(drift);
  ASSERT_TRUE(change.has_value());
  EXPECT_EQ(change->to, 20u);  // 26 × 3/4, rounded
  EXPECT_THAT(change->reason, HasSubstr("time bound"));
}

TEST(WindowControllerTest, TheLeadIsAmongLiveWorkersAndChangesByPeriod) {
  rpc::TableInfoResponse a;
  rpc::TableInfoResponse b;
  // Worker 4 left (its clock stays where it stopped): not counted.
  for (auto [w, ca, cb] : {std::tuple{0u, 30u, 31u}, std::tuple{1u, 24u, 22u},
                           std::tuple{4u, 3u, 3u}}) {
    rpc::WorkerClock* c = a.mutable_stats()->add_clocks();
    c->set_worker(w);
    c->set_clock(ca);
    c = b.mutable_stats()->add_clocks();
    c->set_worker(w);
    c->set_clock(cb);
  }
  WindowSignals last;
  last.lead = 4;
  WindowSignals total = SumSignals({a, b});
  FillLead({a, b}, {0, 1}, total);
  EXPECT_EQ(total.leader, 0u);
  EXPECT_EQ(total.lead, 7u);  // 31 - 24: each worker's largest clock
  const WindowSignals period = SignalsSince(total, last);
  EXPECT_EQ(period.lead, 7u);
  EXPECT_EQ(period.lead_change, 3);
  // A live worker no server has seen yet is at clock 0.
  FillLead({a, b}, {0, 1, 7}, total);
  EXPECT_EQ(total.lead, 31u);
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
  WindowSignals quiet;
  quiet.pushes = 3;
  quiet.pushes_into_empty = 3;
  EXPECT_FALSE(wc.Adjust(quiet).has_value());
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
