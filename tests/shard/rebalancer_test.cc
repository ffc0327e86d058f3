#include "shard/rebalancer.h"

#include <gtest/gtest.h>

#include <set>

#include "gmock/gmock.h"

namespace hetps {
namespace {

using ::testing::HasSubstr;
using ::testing::IsEmpty;

// Every bucket touched `rows` times (`hot` buckets `hot_rows` times); a row
// costs server s `cost[s]` seconds.
std::vector<ServerPeriod> Periods(const ShardMap& map,
                                  const std::vector<double>& cost,
                                  uint64_t rows,
                                  const std::vector<uint32_t>& hot = {},
                                  uint64_t hot_rows = 0) {
  std::vector<ServerPeriod> out(map.num_servers());
  for (ServerPeriod& p : out) {
    p.known = true;
    p.bucket_rows.assign(map.num_buckets(), 0);
    p.stored_bytes = 1 << 20;
  }
  for (uint32_t b = 0; b < map.num_buckets(); ++b) {
    const uint32_t s = map.owner(b);
    const bool is_hot = std::find(hot.begin(), hot.end(), b) != hot.end();
    out[s].bucket_rows[b] = is_hot ? hot_rows : rows;
    out[s].rows_service_s += out[s].bucket_rows[b] * cost[s];
  }
  return out;
}

// The servers' loads with `plan` applied, by the same model.
std::vector<double> LoadsAfter(const ShardMap& map,
                               const std::vector<ServerPeriod>& periods,
                               const std::vector<double>& cost,
                               const RebalancePlan& plan) {
  std::vector<uint32_t> owner(map.num_buckets());
  for (uint32_t b = 0; b < map.num_buckets(); ++b) owner[b] = map.owner(b);
  for (const BucketMove& m : plan.moves) {
    EXPECT_EQ(owner[m.bucket], m.from);
    owner[m.bucket] = m.to;
  }
  std::vector<double> load(map.num_servers(), 0);
  for (uint32_t b = 0; b < map.num_buckets(); ++b) {
    load[owner[b]] += periods[map.owner(b)].bucket_rows[b] * cost[owner[b]];
  }
  return load;
}

// Plans the same period twice: moves need the load over the trigger in two
// periods in a row.
RebalancePlan PlanSustained(Rebalancer& rebalancer, const ShardMap& map,
                            const std::vector<ServerPeriod>& periods) {
  const RebalancePlan first = rebalancer.Plan(map, periods);
  EXPECT_THAT(first.moves, IsEmpty());
  return rebalancer.Plan(map, periods);
}

double MaxOverMean(const std::vector<double>& load) {
  double sum = 0, max = 0;
  for (double l : load) {
    sum += l;
    max = std::max(max, l);
  }
  return max / (sum / load.size());
}

TEST(RebalancerTest, EvenServersAndRowsMoveNothing) {
  const ShardMap map = ShardMap::Uniform(4, 256);
  Rebalancer rebalancer{ShardingConfig{}};
  const RebalancePlan plan =
      rebalancer.Plan(map, Periods(map, {1e-6, 1e-6, 1e-6, 1e-6}, 100));
  EXPECT_THAT(plan.moves, IsEmpty());
  EXPECT_DOUBLE_EQ(plan.before, 1.0);
  EXPECT_THAT(plan.reason, HasSubstr("balanced"));
}

TEST(RebalancerTest, AHalfSpeedServerGivesBucketsToTheOthers) {
  // Server 1 takes twice as long per row: with equal buckets its load is
  // 2/1.5 = 1.33 of the mean. A third of its buckets must go.
  const ShardMap map = ShardMap::Uniform(2, 256);
  const std::vector<double> cost = {1e-6, 2e-6};
  const auto periods = Periods(map, cost, 100);
  Rebalancer rebalancer{ShardingConfig{}};
  const RebalancePlan plan = PlanSustained(rebalancer, map, periods);
  EXPECT_NEAR(plan.before, 4.0 / 3.0, 1e-9);
  ASSERT_FALSE(plan.moves.empty());
  for (const BucketMove& m : plan.moves) {
    EXPECT_EQ(m.from, 1u);
    EXPECT_EQ(m.to, 0u);
  }
  // 128 × 2 = 256 units against 128: moving k gives 256 - 2k vs 128 + k
  // (even at k = 42.7); max/mean (256 - 2k) / ((384 - k) / 2) reaches the
  // target 1.05 at k = 37, where the plan stops.
  EXPECT_EQ(plan.moves.size(), 37u);
  const double after = MaxOverMean(LoadsAfter(map, periods, cost, plan));
  EXPECT_NEAR(plan.after, after, 1e-9);
  EXPECT_LE(after, 1.05);
}

TEST(RebalancerTest, HotBucketsSpreadOverTheServers) {
  // Four hot buckets, all owned by server 0 (buckets 0, 4, 8, 12 of 4
  // servers), each 50× a cold one: one each is balanced.
  const ShardMap map = ShardMap::Uniform(4, 64);
  const std::vector<double> cost(4, 1e-6);
  const auto periods = Periods(map, cost, 100, {0, 4, 8, 12}, 5000);
  Rebalancer rebalancer{ShardingConfig{}};
  const RebalancePlan plan = PlanSustained(rebalancer, map, periods);
  EXPECT_GT(plan.before, 2.0);
  std::set<uint32_t> to;
  for (const BucketMove& m : plan.moves) to.insert(m.to);
  EXPECT_EQ(to, (std::set<uint32_t>{1, 2, 3}));
  EXPECT_LE(MaxOverMean(LoadsAfter(map, periods, cost, plan)), 1.10);
}

TEST(RebalancerTest, ABucketHotterThanTheMeanIsNamed) {
  // One bucket alone carries more than a server's fair share: moving it
  // only moves the problem, and the reason says what would help.
  const ShardMap map = ShardMap::Uniform(2, 16);
  const auto periods = Periods(map, {1e-6, 1e-6}, 10, {3}, 10000);
  Rebalancer rebalancer{ShardingConfig{}};
  const RebalancePlan plan = PlanSustained(rebalancer, map, periods);
  EXPECT_THAT(plan.reason, HasSubstr("bucket 3 alone"));
  EXPECT_THAT(plan.reason, HasSubstr("hot_rows"));
}

TEST(RebalancerTest, TheByteCapBoundsAPeriod) {
  // Each bucket of server 1 holds 1 MiB / 128 = 8 KiB: a 64 KiB cap moves 8.
  const ShardMap map = ShardMap::Uniform(2, 256);
  const std::vector<double> cost = {1e-6, 2e-6};
  ShardingConfig config;
  config.max_moved_mb = 64.0 / 1024;
  Rebalancer rebalancer{config};
  const RebalancePlan plan = PlanSustained(rebalancer, map, Periods(map, cost, 100));
  EXPECT_EQ(plan.moves.size(), 8u);
  EXPECT_EQ(plan.bytes, 64u * 1024);
  EXPECT_THAT(plan.reason, HasSubstr("byte cap"));
}

TEST(RebalancerTest, AMovedBucketIsHeldForSomePeriods) {
  // The moves made, then the loads flip (server 0 now the slow one): the
  // buckets that just moved to it stay for hold_periods, others go back.
  const ShardMap map = ShardMap::Uniform(2, 256);
  ShardingConfig config;
  config.hold_periods = 1;
  Rebalancer rebalancer{config};
  const RebalancePlan first =
      PlanSustained(rebalancer, map, Periods(map, {1e-6, 2e-6}, 100));
  ASSERT_FALSE(first.moves.empty());
  std::vector<std::pair<uint32_t, uint32_t>> owners;
  std::set<uint32_t> moved;
  for (const BucketMove& m : first.moves) {
    owners.emplace_back(m.bucket, m.to);
    moved.insert(m.bucket);
  }
  const ShardMap after = map.WithOwners(owners);
  EXPECT_EQ(after.version(), map.version() + 1);
  // Still over the trigger: the next period plans at once.
  const auto flipped = Periods(after, {2e-6, 1e-6}, 100);
  const RebalancePlan second = rebalancer.Plan(after, flipped);
  ASSERT_FALSE(second.moves.empty()) << second.reason;
  for (const BucketMove& m : second.moves) {
    EXPECT_EQ(m.from, 0u);
    EXPECT_FALSE(moved.count(m.bucket)) << m.bucket;
  }
  // Two periods after their move they are free again (the second plan was
  // not carried out).
  const RebalancePlan later = rebalancer.Plan(after, flipped);
  EXPECT_TRUE(std::any_of(later.moves.begin(), later.moves.end(),
                          [&](const BucketMove& m) {
                            return moved.count(m.bucket) > 0;
                          }));
}

TEST(RebalancerTest, APlanNobodyCarriedOutHoldsNothing) {
  // Advice only (the map never changes): the same period planned again
  // gives the same plan.
  const ShardMap map = ShardMap::Uniform(2, 256);
  Rebalancer rebalancer{ShardingConfig{}};
  const auto periods = Periods(map, {1e-6, 2e-6}, 100);
  const RebalancePlan first = PlanSustained(rebalancer, map, periods);
  const RebalancePlan second = rebalancer.Plan(map, periods);
  ASSERT_FALSE(first.moves.empty());
  ASSERT_EQ(first.moves.size(), second.moves.size());
  for (size_t i = 0; i < first.moves.size(); ++i) {
    EXPECT_EQ(first.moves[i].bucket, second.moves[i].bucket);
  }
}

TEST(RebalancerTest, AOnePeriodSpikeMovesNothing) {
  const ShardMap map = ShardMap::Uniform(2, 256);
  Rebalancer rebalancer{ShardingConfig{}};
  const RebalancePlan spike =
      rebalancer.Plan(map, Periods(map, {1e-6, 2e-6}, 100));
  EXPECT_THAT(spike.moves, IsEmpty());
  EXPECT_THAT(spike.reason, HasSubstr("moves after 2 in a row"));
  rebalancer.Plan(map, Periods(map, {1e-6, 1e-6}, 100));
  EXPECT_THAT(rebalancer.Plan(map, Periods(map, {1e-6, 2e-6}, 100)).moves,
              IsEmpty());
}

TEST(RebalancerTest, BelowTheTriggerNothingMoves) {
  // 1.08 of the mean is under the default trigger of 1.10.
  const ShardMap map = ShardMap::Uniform(2, 256);
  Rebalancer rebalancer{ShardingConfig{}};
  const RebalancePlan plan =
      rebalancer.Plan(map, Periods(map, {1e-6, 1.17e-6}, 100));
  EXPECT_THAT(plan.moves, IsEmpty());
  EXPECT_NEAR(plan.before, 1.17 / 1.085, 1e-9);
}

TEST(RebalancerTest, AServerWithoutARecordStopsThePlan) {
  const ShardMap map = ShardMap::Uniform(2, 16);
  auto periods = Periods(map, {1e-6, 3e-6}, 100);
  periods[1].known = false;
  Rebalancer rebalancer{ShardingConfig{}};
  const RebalancePlan plan = rebalancer.Plan(map, periods);
  EXPECT_THAT(plan.moves, IsEmpty());
  EXPECT_THAT(plan.reason, HasSubstr("server 1 has no load record"));
}

TEST(RebalancerTest, APeriodIsTheDifferenceOfTwoAccessRecords) {
  rpc::AccessStats before, now;
  // Bucket 2 served before and since; bucket 5 only since.
  before.add_buckets(2);
  before.add_pulled_rows(10);
  before.add_pushed_rows(5);
  before.add_bytes(60);
  before.add_service_ns(1000);
  before.set_service_s(3e-6);
  now.add_buckets(2);
  now.add_pulled_rows(30);
  now.add_pushed_rows(15);
  now.add_bytes(180);
  now.add_service_ns(4000);
  now.add_buckets(5);
  now.add_pulled_rows(7);
  now.add_pushed_rows(0);
  now.add_bytes(28);
  now.add_service_ns(2000);
  now.set_service_s(10e-6);
  const ServerPeriod p = AccessPeriod(now, before, 8, 4096);
  EXPECT_TRUE(p.known);
  ASSERT_EQ(p.bucket_rows.size(), 8u);
  EXPECT_EQ(p.bucket_rows[2], 30u);
  EXPECT_EQ(p.bucket_rows[5], 7u);
  EXPECT_EQ(p.bucket_rows[0], 0u);
  EXPECT_NEAR(p.rows_service_s, 5e-6, 1e-12);
  // 7 µs in the period, 5 of them the buckets': 2 µs that do not move.
  EXPECT_NEAR(p.other_service_s, 2e-6, 1e-12);
  EXPECT_EQ(p.stored_bytes, 4096u);
  // A bucket out of range (a record from another map) is left out.
  now.add_buckets(99);
  now.add_pulled_rows(1);
  now.add_pushed_rows(1);
  now.add_bytes(8);
  now.add_service_ns(1);
  EXPECT_EQ(AccessPeriod(now, before, 8, 0).bucket_rows.size(), 8u);
}

}  // namespace
}  // namespace hetps
