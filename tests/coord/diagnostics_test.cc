#include "coord/diagnostics.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace hetps {
namespace {

using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ::testing::SizeIs;

// A period at `now_s` with `workers` workers, each live, having trained
// `samples` samples (half positive, 3 keys each) at `rate` samples/s.
DiagnosticsPeriod Period(double now_s, int workers, uint64_t samples,
                         double rate) {
  DiagnosticsPeriod p;
  p.now_s = now_s;
  for (int w = 0; w < workers; ++w) {
    DiagnosticsPeriod::Worker worker;
    worker.rank = w;
    worker.live = true;
    worker.progress.set_step(static_cast<uint64_t>(now_s * 10) + 1);
    worker.progress.set_samples(samples);
    worker.progress.set_positives(samples / 2);
    worker.progress.set_feature_keys(samples * 3);
    worker.progress.set_compute_samples_per_s(rate);
    p.workers.push_back(worker);
  }
  return p;
}

TEST(DiagnosticsTest, AHealthyRunRaisesNothing) {
  Diagnostics d;
  for (int t = 0; t < 10; ++t) {
    DiagnosticsPeriod p = Period(2.0 * t, 4, 5000 * (t + 1), 1000);
    p.servers.push_back(DiagnosticsPeriod::Server{.cpu_s = 0.5 * t, .cpus = 2});
    d.Observe(p);
  }
  EXPECT_THAT(d.List(), IsEmpty());
}

TEST(DiagnosticsTest, ASaturatedServerIsRaisedAfterTwoPeriodsInARow) {
  Diagnostics d;
  double cpu = 0;
  const auto observe = [&](double now_s, double used_s) {
    cpu += used_s;
    DiagnosticsPeriod p = Period(now_s, 2, 0, 0);
    p.servers.push_back(DiagnosticsPeriod::Server{.cpu_s = 1, .cpus = 4});
    p.servers.push_back(DiagnosticsPeriod::Server{.cpu_s = cpu, .cpus = 1});
    d.Observe(p);
  };
  observe(0, 0);
  observe(2, 1.9);  // 95% of one CPU: once
  observe(4, 0.2);  // a quiet period breaks the streak
  observe(6, 1.9);
  EXPECT_THAT(d.List(), IsEmpty());
  observe(8, 1.95);
  const auto list = d.List();
  ASSERT_THAT(list, SizeIs(1));
  EXPECT_EQ(list[0].kind(), "server_saturated");
  EXPECT_EQ(list[0].subject(), "server 1");
  EXPECT_THAT(list[0].message(),
              HasSubstr("used 98% of the 1 CPUs it may use"));
  EXPECT_EQ(list[0].first_s(), 8);
  EXPECT_TRUE(list[0].active());
  // It stays listed, no longer active, once the server has room again.
  observe(10, 0.1);
  ASSERT_THAT(d.List(), SizeIs(1));
  EXPECT_FALSE(d.List()[0].active());
  EXPECT_EQ(d.List()[0].last_s(), 8);
}

TEST(DiagnosticsTest, AServerThrottledByItsQuotaIsSaturated) {
  Diagnostics d;
  const auto observe = [&](double now_s, uint64_t periods, uint64_t throttled) {
    DiagnosticsPeriod p = Period(now_s, 2, 0, 0);
    // A tenth of a CPU, of which it uses a little over half.
    p.servers.push_back(
        DiagnosticsPeriod::Server{.cpu_s = 0.06 * now_s,
                                  .cpus = 0.1,
                                  .quota_periods = periods,
                                  .throttled_periods = throttled});
    d.Observe(p);
  };
  observe(0, 0, 0);
  observe(2, 20, 9);  // 9 of 20: below half
  observe(4, 40, 19);
  EXPECT_THAT(d.List(), IsEmpty());
  observe(6, 60, 29);  // 10 of 20, twice in a row
  const auto list = d.List();
  ASSERT_THAT(list, SizeIs(1));
  EXPECT_THAT(list[0].message(),
              HasSubstr("ran out of its CPU quota (0.1 CPUs) in 10 of 20 "
                        "scheduler periods, using 60% of it"));
}

TEST(DiagnosticsTest, AWindowThatCannotFollowTheRulesIsRaised) {
  Diagnostics d;
  for (int t = 0; t < 2; ++t) {
    DiagnosticsPeriod p = Period(2.0 * t, 2, 0, 0);
    p.window = 1;
    p.window_verdict =
        WindowVerdict{.grow = true, .reason = "too small: the queue was empty"};
    p.window_can_move = true;  // the controller grows it: nothing to say
    d.Observe(p);
  }
  EXPECT_THAT(d.List(), IsEmpty());
  for (int t = 2; t < 4; ++t) {
    DiagnosticsPeriod p = Period(2.0 * t, 2, 0, 0);
    p.window = 500;
    p.window_verdict =
        WindowVerdict{.grow = false, .reason = "too large: the time bound"};
    p.window_can_move = false;
    d.Observe(p);
  }
  const auto list = d.List();
  ASSERT_THAT(list, SizeIs(1));
  EXPECT_EQ(list[0].kind(), "window_too_large");
  EXPECT_THAT(list[0].message(), HasSubstr("window 500 is too large"));
}

TEST(DiagnosticsTest, AWorkerBelowHalfItsProfileOrItsOwnMedianIsSlow) {
  Diagnostics d;
  for (int t = 0; t < 6; ++t) {
    DiagnosticsPeriod p = Period(2.0 * t, 2, 0, 900);
    // Worker 0 has a profile of 2000 samples/s and computes 900; worker 1
    // has none, computes 900 and then 400.
    p.workers[0].expected_samples_per_s = 2000;
    if (t >= 4) p.workers[1].progress.set_compute_samples_per_s(400);
    d.Observe(p);
  }
  const auto list = d.List();
  ASSERT_THAT(list, SizeIs(2));
  EXPECT_EQ(list[0].subject(), "worker 0");
  EXPECT_THAT(list[0].message(),
              HasSubstr("900 samples/s, 45% of the 2000 expected (its device "
                        "profile)"));
  EXPECT_EQ(list[1].subject(), "worker 1");
  EXPECT_THAT(list[1].message(),
              HasSubstr("400 samples/s, 44% of the 900 expected (its median "
                        "earlier in the run)"));
}

TEST(DiagnosticsTest, AWorkerThatStoppedTrainingIsNotSlow) {
  Diagnostics d;
  for (int t = 0; t < 4; ++t) {
    DiagnosticsPeriod p = Period(2.0 * t, 1, 0, 100);
    p.workers[0].expected_samples_per_s = 2000;
    p.workers[0].progress.set_step(7);  // no step since the first period
    d.Observe(p);
  }
  EXPECT_THAT(d.List(), IsEmpty());
}

TEST(DiagnosticsTest, ShardsSkewedByLabelOrFeaturesAreRaised) {
  Diagnostics d;
  DiagnosticsPeriod p = Period(2, 4, 3000, 1000);
  p.workers[1].progress.set_positives(3000);         // only positives
  p.workers[2].progress.set_feature_keys(3000 * 2);  // a column missing
  p.workers[3].progress.set_samples(500);            // too few to judge
  p.workers[3].progress.set_positives(0);
  d.Observe(p);
  const auto list = d.List();
  ASSERT_THAT(list, SizeIs(2));
  EXPECT_EQ(list[0].kind(), "skewed_shard");
  EXPECT_EQ(list[0].subject(), "worker 1");
  EXPECT_THAT(list[0].message(),
              HasSubstr("label rate 1.000 against the median worker's 0.500"));
  EXPECT_EQ(list[1].subject(), "worker 2");
  EXPECT_THAT(list[1].message(),
              HasSubstr("2.00 feature keys per sample against the median "
                        "worker's 3.00"));
}

TEST(DiagnosticsTest, AWorkersOwnWarningShowsAtOnce) {
  Diagnostics d;
  rpc::WorkerProgress progress;
  progress.add_warnings("over-compression: loss 0.7 at step 200");
  d.Reported(3, progress, 5.5);
  const auto list = d.List();
  ASSERT_THAT(list, SizeIs(1));
  EXPECT_EQ(list[0].kind(), "over_compression");
  EXPECT_EQ(list[0].subject(), "worker 3");
  EXPECT_EQ(list[0].first_s(), 5.5);
}

}  // namespace
}  // namespace hetps
