#include "coord/batch_planner.h"

#include <gtest/gtest.h>

#include "gmock/gmock.h"

namespace hetps {
namespace {

using ::testing::HasSubstr;

JobConfig Proportional(int workers, int batch) {
  JobConfig config;
  config.cluster.workers = workers;
  config.train.batch_size = batch;
  config.planner.batch_plan = "proportional";
  return config;
}

TEST(BatchPlannerTest, BatchesFollowThroughput) {
  const JobConfig config = Proportional(4, 100);
  BatchPlanner planner(config, 1024);
  ASSERT_TRUE(planner.Update({{.throughput = 1000},
                              {.throughput = 1000},
                              {.throughput = 300},
                              {.throughput = 300}}));
  // 400 samples per step split 1000:1000:300:300.
  EXPECT_EQ(planner.plan()[0].batch_size, 154u);
  EXPECT_EQ(planner.plan()[2].batch_size, 46u);
  EXPECT_EQ(planner.plan()[0].push_freq, 1u);
  EXPECT_THAT(planner.plan()[0].reason,
              HasSubstr("38% of the job's throughput"));
  EXPECT_EQ(planner.version(), 1u);
}

TEST(BatchPlannerTest, MemoryCapsTheBatchAndRaisesPushFreq) {
  const JobConfig config = Proportional(2, 100);
  // 1 MB at 10 KiB per sample holds 102 samples.
  EXPECT_EQ(MemoryCapBatch(1, 10240), 102u);
  EXPECT_EQ(MemoryCapBatch(0, 10240), std::numeric_limits<uint32_t>::max());
  BatchPlanner planner(config, 10240);
  ASSERT_TRUE(planner.Update({{.throughput = 900, .memory_mb = 1},
                              {.throughput = 100, .memory_mb = 0}}));
  // Worker 0 wants 180 but holds 102: two batches per push.
  EXPECT_EQ(planner.plan()[0].batch_size, 102u);
  EXPECT_EQ(planner.plan()[0].push_freq, 2u);
  EXPECT_THAT(planner.plan()[0].reason, HasSubstr("capped by 1 MB"));
  EXPECT_EQ(planner.plan()[1].batch_size, 20u);
  for (const WorkerPlan& p : planner.plan()) {
    EXPECT_LE(p.batch_size, MemoryCapBatch(1, 10240));
  }
}

TEST(BatchPlannerTest, EqualBatchesUntilEveryThroughputIsKnown) {
  const JobConfig config = Proportional(2, 64);
  BatchPlanner planner(config, 100);
  ASSERT_TRUE(planner.Update({{.throughput = 500}, {.throughput = 0}}));
  EXPECT_EQ(planner.plan()[0].batch_size, 64u);
  EXPECT_EQ(planner.plan()[1].batch_size, 64u);
  EXPECT_THAT(planner.plan()[1].reason, HasSubstr("until every throughput"));
}

TEST(BatchPlannerTest, ReplansOnlyPastTheThreshold) {
  JobConfig config = Proportional(2, 100);
  config.planner.replan_threshold = 0.2;
  BatchPlanner planner(config, 100);
  ASSERT_TRUE(planner.Update({{.throughput = 1000}, {.throughput = 1000}}));
  EXPECT_FALSE(planner.Update({{.throughput = 1150}, {.throughput = 900}}));
  EXPECT_EQ(planner.version(), 1u);
  // Worker 1 slows to 30%: re-planned.
  ASSERT_TRUE(planner.Update({{.throughput = 1000}, {.throughput = 300}}));
  EXPECT_EQ(planner.version(), 2u);
  EXPECT_EQ(planner.plan()[0].batch_size, 154u);
  EXPECT_EQ(planner.plan()[1].batch_size, 46u);
  // A worker leaving re-plans too: the survivor takes the whole step.
  ASSERT_TRUE(planner.Update(
      {{.throughput = 1000}, {.live = false, .throughput = 300}}));
  EXPECT_EQ(planner.plan()[0].batch_size, 100u);
}

TEST(BatchPlannerTest, FixedPlansAndProfileOverrides) {
  JobConfig config = Proportional(2, 50);
  config.planner.batch_plan = "fixed";
  config.device_profiles = {{.ranks = {1}, .batch_size = 7, .push_freq = 3, .slowdowns = {}}};
  BatchPlanner planner(config, 100);
  ASSERT_TRUE(planner.Update({{.throughput = 1000}, {.throughput = 100}}));
  EXPECT_EQ(planner.plan()[0].batch_size, 50u);
  EXPECT_EQ(planner.plan()[1].batch_size, 7u);
  EXPECT_EQ(planner.plan()[1].push_freq, 3u);
  // auto is proportional in semi_async only.
  config.planner.batch_plan = "auto";
  EXPECT_FALSE(config.ProportionalBatches());
  config.mode = ConsistencyMode::kSemiAsync;
  EXPECT_TRUE(config.ProportionalBatches());
}

}  // namespace
}  // namespace hetps
