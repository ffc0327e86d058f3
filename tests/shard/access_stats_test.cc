#include "shard/access_stats.h"

#include <gtest/gtest.h>

#include <map>
#include <random>
#include <thread>
#include <vector>

#include "shard/shard_map.h"
#include "support/fake_clock.h"

namespace hetps {
namespace {

TEST(HotKeysTest, HeavyKeysAreHeldWithinTheErrorBound) {
  // (estimates: never under the truth, over it by at most error())
  HotKeys sketch(16, 1024);
  std::map<uint64_t, double> truth;
  std::mt19937_64 random(7);
  // Keys 0..3 take a quarter of the stream each time round; the rest is a
  // long tail of keys seen once or twice.
  for (int i = 0; i < 4000; ++i) {
    const uint64_t key = i % 2 == 0 ? i % 8 / 2 : 100 + random() % 3000;
    sketch.Offer(0, key, 1);
    truth[key] += 1;
  }
  const auto top = sketch.Top(4);
  ASSERT_EQ(top.size(), 4u);
  std::vector<uint64_t> keys;
  for (const auto& e : top) {
    keys.push_back(e.key);
    // Never under the truth, never over it by more than the error.
    EXPECT_GE(e.count, truth[e.key]);
    EXPECT_LE(e.count - sketch.error(), truth[e.key]);
  }
  std::sort(keys.begin(), keys.end());
  EXPECT_EQ(keys, (std::vector<uint64_t>{0, 1, 2, 3}));
  EXPECT_EQ(sketch.size(), 16u);
}

TEST(HotKeysTest, TablesKeepTheirKeysApartAndHalvingHalves) {
  HotKeys sketch(4, 64);
  sketch.Offer(0, 5, 10);
  sketch.Offer(1, 5, 4);
  sketch.Halve();
  const auto top = sketch.Top(10);
  ASSERT_EQ(top.size(), 2u);
  EXPECT_EQ(top[0].table, 0u);
  EXPECT_DOUBLE_EQ(top[0].count, 5);
  EXPECT_EQ(top[1].table, 1u);
  EXPECT_DOUBLE_EQ(top[1].count, 2);
}

// Every row of every recorded request lands in its bucket's totals, from
// several threads at once; requests of tables the server does not hold
// are not counted.
TEST(AccessRecorderTest, BucketTotalsAreExactUnderConcurrentRequests) {
  testing::FakeClock clock;
  constexpr uint32_t kBuckets = 64;
  AccessRecorder recorder(kBuckets, {"user", "item"}, clock);
  constexpr int kThreads = 4, kRequests = 200;
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&recorder, t] {
      for (int r = 0; r < kRequests; ++r) {
        std::vector<uint64_t> keys;
        for (uint64_t k = 0; k < 50; ++k) keys.push_back(k * 7 + t);
        recorder.Record(r % 2 ? Access::kPush : Access::kPull,
                        r % 3 ? "user" : "item", keys, 16,
                        absl::Microseconds(50));
        recorder.Record(Access::kPull, "dense", keys, 16,
                        absl::Microseconds(7));
      }
    });
  }
  for (auto& thread : threads) thread.join();
  std::vector<uint64_t> pulled(kBuckets), pushed(kBuckets);
  for (int t = 0; t < kThreads; ++t) {
    for (int r = 0; r < kRequests; ++r) {
      for (uint64_t k = 0; k < 50; ++k) {
        (r % 2 ? pushed : pulled)[BucketOfKey(k * 7 + t, kBuckets)] += 1;
      }
    }
  }
  rpc::AccessStats stats;
  recorder.ToProto(&stats);
  ASSERT_GT(stats.buckets_size(), 0);
  uint64_t rows = 0;
  for (int i = 0; i < stats.buckets_size(); ++i) {
    const uint32_t b = stats.buckets(i);
    EXPECT_EQ(stats.pulled_rows(i), pulled[b]) << "bucket " << b;
    EXPECT_EQ(stats.pushed_rows(i), pushed[b]) << "bucket " << b;
    EXPECT_EQ(stats.bytes(i), 16 * (pulled[b] + pushed[b]));
    rows += stats.pulled_rows(i) + stats.pushed_rows(i);
  }
  EXPECT_EQ(rows, uint64_t{kThreads} * kRequests * 50);
  const AccessTotals totals = SumAccess(stats);
  EXPECT_EQ(totals.rows(), rows);
  EXPECT_EQ(totals.bytes, 16 * rows);
  EXPECT_EQ(totals.buckets, static_cast<uint32_t>(stats.buckets_size()));
  // Each request's 50 µs shared by its buckets (rounded down per bucket);
  // the unknown table's count in the total only.
  const double requests = kThreads * kRequests;
  EXPECT_LE(totals.bucket_service_s, requests * 50e-6 + 1e-12);
  EXPECT_GE(totals.bucket_service_s, requests * 49e-6);
  EXPECT_NEAR(stats.service_s(), requests * 57e-6, 1e-9);
}

// A key in every request of 1000 keys is found from 32 sampled keys a
// request, with its share of the requests, and forgotten at the half-life.
TEST(AccessRecorderTest, AKeyInEveryRequestIsTheHottest) {
  testing::FakeClock clock;
  AccessRecorder recorder(256, {"item"}, clock);
  std::mt19937_64 random(3);
  constexpr int kRequests = 640;
  for (int r = 0; r < kRequests; ++r) {
    std::vector<uint64_t> keys{42};
    while (keys.size() < 1000) keys.push_back(1000 + random() % 1000000);
    std::shuffle(keys.begin(), keys.end(), random);
    recorder.Record(Access::kPull, "item", keys, 32, absl::ZeroDuration());
  }
  rpc::AccessStats stats;
  recorder.ToProto(&stats, 3);
  ASSERT_EQ(stats.hot_keys_size(), 3);
  const rpc::HotKey& top = stats.hot_keys(0);
  EXPECT_EQ(top.table(), "item");
  EXPECT_EQ(top.key(), 42u);
  // Sampled one key in ~32: the estimate is near 640, the share near 1;
  // a key in every request of 1000 is 1/1000 of the keys.
  EXPECT_GT(top.requests() - top.error(), 0.7 * kRequests);
  EXPECT_LT(top.requests() - top.error(), 1.3 * kRequests);
  EXPECT_GT(top.share(), 0.7);
  // Tail keys are in one request each: their estimates are sampling weight
  // plus the sketch's error.
  EXPECT_LT(stats.hot_keys(1).share(), 0.3);
  EXPECT_LE(stats.hot_keys(1).requests(), 32 * 2 + top.error());
  EXPECT_EQ(stats.half_life_s(), 10);

  // One half-life later the counts are halved; the share stays.
  clock.Advance(absl::Seconds(10));
  recorder.Record(Access::kPull, "item", std::vector<uint64_t>{7}, 32,
                  absl::ZeroDuration());
  rpc::AccessStats later;
  recorder.ToProto(&later, 1);
  EXPECT_EQ(later.hot_keys(0).key(), 42u);
  EXPECT_NEAR(later.hot_keys(0).requests(), top.requests() / 2, 1e-9);
  EXPECT_GT(later.hot_keys(0).share(), 0.7);
}

// A request of more keys than are counted is counted from evenly spaced
// keys, each for the spacing's rows: one request's total is its rows to
// within the spacing, and `stride` requests of the same keys are counted
// exactly, bucket by bucket.
TEST(AccessRecorderTest, ALargeRequestsBucketsAreExactOverItsSpacing) {
  testing::FakeClock clock;
  constexpr uint32_t kBuckets = 64;
  AccessRecorder recorder(kBuckets, {"item"}, clock);
  constexpr size_t kKeys = 10 * AccessRecorder::kCountedKeysPerRequest + 7;
  constexpr uint64_t kStride = 11;  // ⌈kKeys / kCountedKeysPerRequest⌉
  std::mt19937_64 random(5);
  std::vector<uint64_t> keys(kKeys);
  for (uint64_t& key : keys) key = random();
  std::vector<uint64_t> truth(kBuckets);
  for (uint64_t key : keys) ++truth[BucketOfKey(key, kBuckets)];

  auto pulled = [&recorder] {
    rpc::AccessStats stats;
    recorder.ToProto(&stats);
    std::map<uint32_t, uint64_t> rows;
    for (int i = 0; i < stats.buckets_size(); ++i) {
      EXPECT_EQ(stats.bytes(i), 8 * stats.pulled_rows(i));
      rows[stats.buckets(i)] = stats.pulled_rows(i);
    }
    return rows;
  };
  recorder.Record(Access::kPull, "item", keys, 8, absl::Microseconds(10));
  uint64_t total = 0;
  for (const auto& [bucket, rows] : pulled()) {
    EXPECT_EQ(rows % kStride, 0u) << "bucket " << bucket;
    total += rows;
  }
  EXPECT_GT(total + kStride, kKeys);
  EXPECT_LT(total, kKeys + kStride);

  for (uint64_t r = 1; r < kStride; ++r) {
    recorder.Record(Access::kPull, "item", keys, 8, absl::Microseconds(10));
  }
  const std::map<uint32_t, uint64_t> rows = pulled();
  for (uint32_t b = 0; b < kBuckets; ++b) {
    const auto it = rows.find(b);
    EXPECT_EQ(it == rows.end() ? 0 : it->second, kStride * truth[b])
        << "bucket " << b;
  }
}

}  // namespace
}  // namespace hetps
