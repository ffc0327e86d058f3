// The worker's hot-row cache (client.hot_rows): which rows it keeps, and
// PsClient reading them instead of pulling while their version is within
// the bound, against a real server of this process whose own record of the
// lag is checked.
#include "client/hot_row_cache.h"

#include <gtest/gtest.h>

#include "client/ps_client_factory.h"
#include "common/channel.h"
#include "node/server_node.h"

namespace hetps {
namespace {

HotRowsConfig Config(double hot_share, uint64_t max_rows = 100) {
  HotRowsConfig config;
  config.enabled = true;
  config.hot_share = hot_share;
  config.max_rows = max_rows;
  return config;
}

TEST(HotRowCacheTest, RowsInAShareOfThePullsAreHot) {
  HotRowCache cache(Config(0.2));
  // Key 1 in every pull, key 2 in one of ten.
  for (int i = 0; i < 100; ++i) {
    std::vector<uint64_t> keys{1, 1000 + static_cast<uint64_t>(i)};
    if (i % 10 == 0) keys.push_back(2);
    cache.Observe(0, keys);
  }
  EXPECT_TRUE(cache.IsHot(0, 1));
  EXPECT_FALSE(cache.IsHot(0, 2));
  EXPECT_FALSE(cache.IsHot(1, 1)) << "another table's key 1";
}

TEST(HotRowCacheTest, ReadsOnlyRowsWithinTheBoundAndKeepsAtMostMaxRows) {
  HotRowCache cache(Config(0.2, /*max_rows=*/2));
  const std::vector<float> row{1.5f, -2.0f};
  cache.Store(0, 7, /*version=*/10, row);
  cache.Store(0, 8, 11, row);
  cache.Store(0, 9, 12, row);  // no room
  EXPECT_EQ(cache.rows(0), 2u);
  std::vector<float> out(2, 0.0f);
  auto kept = cache.Read(0, 7, /*known=*/12, /*bound=*/2, out);
  ASSERT_TRUE(kept.has_value());
  EXPECT_EQ(kept->version, 10u);
  EXPECT_EQ(kept->lag, 2u) << "without max_drift a row's bound is the servers'";
  EXPECT_EQ(out, row);
  EXPECT_EQ(cache.Read(0, 7, 13, 2, out), std::nullopt) << "3 applies behind";
  EXPECT_EQ(cache.Read(0, 9, 0, 2, out), std::nullopt);
  // A refresh keeps the slot and takes the new version.
  cache.Store(0, 7, 20, std::vector<float>{3.0f, 4.0f});
  kept = cache.Read(0, 7, 20, 2, out);
  ASSERT_TRUE(kept.has_value());
  EXPECT_EQ(kept->version, 20u);
  EXPECT_EQ(out, (std::vector<float>{3.0f, 4.0f}));
  cache.Expire(0, [](uint64_t, uint64_t version) { return version < 15; });
  EXPECT_EQ(cache.rows(0), 1u);
  cache.Store(0, 9, 12, row);  // room again
  EXPECT_TRUE(cache.Read(0, 9, 12, 2, out).has_value());
}

// max_drift 0.1: a row's own bound is the applies in which it moves a tenth
// of its length, at the pace between the worker's last two reads of it.
TEST(HotRowCacheTest, ARowsBoundFollowsHowFastItMoves) {
  HotRowsConfig config = Config(0.2);
  config.max_drift = 0.1;
  HotRowCache cache(config);
  std::vector<float> out(2);
  const uint64_t bound = 50;
  // Seen once: no pace yet, read again from the server at the next apply.
  cache.Store(0, 1, 0, std::vector<float>{3.0f, 4.0f});
  ASSERT_TRUE(cache.Read(0, 1, 0, bound, out).has_value());
  EXPECT_EQ(cache.Read(0, 1, 1, bound, out), std::nullopt);
  // Moved by 0.5 (a tenth of its length 5) in 4 applies: bound 4.
  cache.Store(0, 1, 4, std::vector<float>{3.3f, 4.4f});
  auto kept = cache.Read(0, 1, 8, bound, out);
  ASSERT_TRUE(kept.has_value());
  EXPECT_EQ(kept->lag, 4u);
  EXPECT_EQ(out, (std::vector<float>{3.3f, 4.4f}));
  EXPECT_EQ(cache.Read(0, 1, 9, bound, out), std::nullopt);
  // About a quarter of that pace: moved 0.1375, 2.45% of its new length
  // 5.61, in 4 applies: bound 0.1 * 4 / 0.0245 = 16.3, so 16.
  cache.Store(0, 1, 8, std::vector<float>{3.3f, 4.4f + 0.1375f});
  kept = cache.Read(0, 1, 8, bound, out);
  ASSERT_TRUE(kept.has_value());
  EXPECT_EQ(kept->lag, 16u);
  // A row that did not move at all is read up to the servers' bound.
  cache.Store(0, 1, 9, std::vector<float>{3.3f, 4.4f + 0.1375f});
  kept = cache.Read(0, 1, 9, bound, out);
  ASSERT_TRUE(kept.has_value());
  EXPECT_EQ(kept->lag, bound);
  // A read at the version already kept tells nothing and changes nothing.
  cache.Store(0, 1, 9, std::vector<float>{100.0f, 100.0f});
  ASSERT_TRUE(cache.Read(0, 1, 9, bound, out).has_value());
  EXPECT_EQ(out[0], 3.3f);
  // A row seen for the first time starts with the table's typical bound:
  // the moving average over 64 measures of 4, 16 and 1024 (the unmoved
  // row, counted up to 1024) from 0 is 16.3.
  cache.Store(0, 2, 9, std::vector<float>{1.0f, 1.0f});
  kept = cache.Read(0, 2, 9, bound, out);
  ASSERT_TRUE(kept.has_value());
  EXPECT_EQ(kept->lag, 16u);
}

JobConfig AsyncJob(uint32_t workers) {
  JobConfig config;
  config.mode = ConsistencyMode::kAsync;
  config.cluster.ps_endpoints = {"127.0.0.1:1"};
  config.cluster.workers = workers;
  config.client.hot_rows = Config(0.2);
  config.client.hot_rows.max_lag = 2;
  TableConfig emb;
  emb.name = "emb";
  emb.kind = TableKind::kSparse;
  emb.dim = 1;
  emb.optimizer.type = "sgd";
  emb.optimizer.learning_rate = 1.0f;
  emb.init.type = "zero";
  config.tables = {emb};
  return config;
}

class HotRowClientTest : public ::testing::Test {
 protected:
  explicit HotRowClientTest(
      HotRowsConfig hot_rows = AsyncJob(2).client.hot_rows)
      : hot_rows_(hot_rows) {}

  void SetUp() override {
    JobConfig job = AsyncJob(2);
    job.client.hot_rows = hot_rows_;
    auto node = ServerNode::Start(job, 0, "127.0.0.1:0");
    ASSERT_TRUE(node.ok()) << node.status();
    node_ = std::move(*node);
  }

  std::unique_ptr<PsClient> Client(uint32_t worker) {
    PsClientOptions options;
    options.endpoints = {"127.0.0.1:" + std::to_string(node_->port())};
    options.worker_id = worker;
    options.rpc.hot_rows = hot_rows_;
    options.push_to_all_servers = false;
    auto client = PsClient::Connect(options);
    EXPECT_TRUE(client.ok()) << client.status();
    return client.ok() ? std::move(*client) : nullptr;
  }

  float Pull(PsClient& client, uint64_t key) {
    float value = -100;
    EXPECT_TRUE(client.PullSparse("emb", {&key, 1}, {&value, 1}).ok());
    return value;
  }

  void Push(PsClient& client, uint64_t key, float grad) {
    ASSERT_TRUE(
        client.Push(std::vector<TableGrad>{{"emb", {&key, 1}, {&grad, 1}}}, 1)
            .ok());
  }

  const HotRowsConfig hot_rows_;
  std::unique_ptr<ServerNode> node_;
};

// max_lag 2: a kept row is read while the server is at most 2 applies past
// it, then pulled again; the server records each push's lag.
TEST_F(HotRowClientTest, KeptRowsAreReadWithinTheBoundThenPulledAgain) {
  auto client = Client(0);
  ASSERT_NE(client, nullptr);
  EXPECT_EQ(Pull(*client, 7), 0.0f);  // pulled, kept at version 0
  EXPECT_EQ(client->pull_stats().pulled_rows, 1u);
  Push(*client, 7, 1.0f);  // applied: the server holds -1 (apply 1)
  EXPECT_EQ(Pull(*client, 7), 0.0f) << "the kept copy, one apply old";
  Push(*client, 7, 1.0f);  // -2 (apply 2)
  EXPECT_EQ(Pull(*client, 7), 0.0f) << "two applies old: still in bound";
  Push(*client, 7, 1.0f);  // -3 (apply 3)
  EXPECT_EQ(Pull(*client, 7), -3.0f) << "three applies old: pulled again";
  const PullStats stats = client->pull_stats();
  EXPECT_EQ(stats.pulled_rows, 2u);
  EXPECT_EQ(stats.cached_rows, 2u);
  EXPECT_EQ(stats.pulled_bytes, 2u * (8 + 4));
  Push(*client, 7, 1.0f);  // computed on a fresh row: no lag to record

  const AggregatorStats record = node_->ps().Info().stats();
  EXPECT_EQ(record.read_lag_bound(), 2u);
  // The pushes after the second and third pulls read the version-0 copy
  // when the server was 1 and 2 applies past it.
  EXPECT_EQ(record.cached_pushes(), 2u);
  ASSERT_GE(record.read_lag_counts_size(), 3);
  EXPECT_EQ(record.read_lag_counts(1), 1u);
  EXPECT_EQ(record.read_lag_counts(2), 1u);
  EXPECT_EQ(record.max_read_lag(), 2u);
  EXPECT_EQ(record.read_lag_violations(), 0u);
}

// An evaluation reads the servers' rows even where a copy is kept.
TEST_F(HotRowClientTest, PullsFromTheServersReadNoCopy) {
  auto client = Client(0);
  ASSERT_NE(client, nullptr);
  EXPECT_EQ(Pull(*client, 7), 0.0f);
  Push(*client, 7, 1.0f);
  EXPECT_EQ(Pull(*client, 7), 0.0f) << "the kept copy";
  const uint64_t key = 7;
  float value = 0;
  ASSERT_TRUE(client
                  ->PullSparse("emb", {&key, 1}, {&value, 1}, KeySet::kUnique,
                               RowSource::kServers)
                  .ok());
  EXPECT_EQ(value, -1.0f);
  EXPECT_EQ(client->pull_stats().pulled_rows, 2u);
  EXPECT_EQ(client->pull_stats().cached_rows, 1u);
}

// Another worker's pushes move the server on while this one does not know:
// the pull's reply says how far, and the copy over the bound is pulled again
// in the same call.
TEST_F(HotRowClientTest, ACopyFoundOverTheBoundByThePullIsPulledAgain) {
  auto a = Client(0);
  auto b = Client(1);
  ASSERT_NE(a, nullptr);
  ASSERT_NE(b, nullptr);
  // Versions are the server's applies, not the row's updates: key 8, never
  // pushed, is as far over the bound as key 7.
  std::vector<uint64_t> keys{7, 8};
  std::vector<float> rows(2);
  ASSERT_TRUE(a->PullSparse("emb", keys, rows).ok());
  for (int i = 0; i < 3; ++i) Push(*b, 7, 1.0f);
  ASSERT_TRUE(a->PullSparse("emb", keys, rows).ok());
  EXPECT_EQ(rows[0], -3.0f);
  EXPECT_EQ(a->pull_stats().refetched_rows, 2u);
  EXPECT_EQ(a->pull_stats().cached_rows, 0u);
}

// max_drift 0.5 within a bound of 8 applies: each row is read from its copy
// for as many applies as it takes to move half its length at its own pace.
class DriftClientTest : public HotRowClientTest {
 protected:
  static HotRowsConfig ByDrift() {
    HotRowsConfig config = Config(0.2);
    config.max_lag = 8;
    config.max_drift = 0.5;
    return config;
  }
  DriftClientTest() : HotRowClientTest(ByDrift()) {}

  std::vector<float> Pull(PsClient& client) {
    std::vector<uint64_t> keys{7, 8};
    std::vector<float> rows(2, -100);
    EXPECT_TRUE(client.PullSparse("emb", keys, rows).ok());
    return rows;
  }
};

TEST_F(DriftClientTest, EachRowIsReadFromItsCopyAsLongAsItsOwnPaceAllows) {
  auto client = Client(0);
  ASSERT_NE(client, nullptr);
  // Key 7 takes a push (one apply) before every pull; key 8 never moves.
  EXPECT_EQ(Pull(*client), (std::vector<float>{0, 0}));  // kept, bound 0
  Push(*client, 7, 1.0f);  // apply 1
  // Both pulled again (no pace known yet). Key 7 moved its whole length in
  // an apply (bound 0.5 * 1 / 1 = 0); key 8 did not move (bound 8).
  EXPECT_EQ(Pull(*client), (std::vector<float>{-1, 0}));
  EXPECT_EQ(client->pull_stats().pulled_rows, 4u);
  Push(*client, 7, 1.0f);  // apply 2
  // Key 7 pulled (-2: it moved half its length, bound 0.5 * 1 / 0.5 = 1),
  // key 8 read from its copy.
  EXPECT_EQ(Pull(*client), (std::vector<float>{-2, 0}));
  EXPECT_EQ(client->pull_stats().pulled_rows, 5u);
  EXPECT_EQ(client->pull_stats().cached_rows, 1u);
  Push(*client, 7, 1.0f);  // apply 3: the server holds -3
  // Both from their copies: key 7's is one apply old, its bound.
  EXPECT_EQ(Pull(*client), (std::vector<float>{-2, 0}));
  EXPECT_EQ(client->pull_stats().pulled_rows, 5u);
  EXPECT_EQ(client->pull_stats().cached_rows, 3u);
  Push(*client, 7, 1.0f);  // apply 4: key 7's copy is 2 applies old
  EXPECT_EQ(Pull(*client), (std::vector<float>{-4, 0}));
  EXPECT_EQ(client->pull_stats().pulled_rows, 6u);
  EXPECT_EQ(client->pull_stats().cached_rows, 4u);

  // The servers' record: the oldest copy a push used was key 8's, read at
  // apply 1, in the step whose pull the server answered at apply 3.
  const AggregatorStats record = node_->ps().Info().stats();
  EXPECT_EQ(record.read_lag_bound(), 8u);
  EXPECT_EQ(record.max_read_lag(), 2u);
  EXPECT_EQ(record.read_lag_violations(), 0u);
}

}  // namespace
}  // namespace hetps
