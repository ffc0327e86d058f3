// The worker's hot-row cache (client.hot_rows): which rows it keeps, and
// PsClient reading them instead of pulling while their version is within
// the bound, against a real server of this process whose own record of the
// lag is checked.
#include "client/hot_row_cache.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "client/ps_client_factory.h"
#include "common/channel.h"
#include "node/server_node.h"
#include "support/test_support.h"

namespace hetps {
namespace {

HotRowsConfig Config(double hot_share, uint64_t max_rows = 100) {
  HotRowsConfig config;
  config.enabled = true;
  config.hot_share = hot_share;
  config.max_rows = max_rows;
  config.sample_drift = 0;  // the servers' bound alone, unless a test says
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
  EXPECT_EQ(kept->lag, 2u)
      << "without sample_drift a row's bound is the servers'";
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

// sample_drift 1: a row's own bound is the applies in which its drift
// (relative to its length, at the pace between the worker's last two reads
// of it) times its weight (its share of a push's samples times the push's
// rows) reaches 1.
TEST(HotRowCacheTest, ARowsBoundFollowsHowFastItMovesAndHowMuchItIsUsed) {
  HotRowsConfig config = Config(0.2);
  config.sample_drift = 1;
  HotRowCache cache(config);
  std::vector<float> out(2);
  const uint64_t bound = 2000;
  // Seen once: no pace yet, so the typical bound (none measured: 0).
  cache.Store(0, 1, 0, std::vector<float>{3.0f, 4.0f});
  ASSERT_TRUE(cache.Read(0, 1, 0, bound, out).has_value());
  EXPECT_EQ(cache.Read(0, 1, 1, bound, out), std::nullopt);
  // A push of 4 rows over 8 samples, key 1 used 3 times: weight
  // 3 / 8 * 4 = 1.5. Keys not kept are passed over.
  cache.NotePush(0, std::vector<uint64_t>{1, 5, 6, 7},
                 std::vector<uint32_t>{3, 1, 1, 2}, 8);
  EXPECT_EQ(cache.Read(0, 1, 1, bound, out), std::nullopt) << "no pace yet";
  // Moved by 0.5, 1/11 of its new length 5.5, in 4 applies: pace 1/44 an
  // apply, times weight 1.5: bound 44 / 1.5 = 29.3 applies.
  cache.Store(0, 1, 4, std::vector<float>{3.3f, 4.4f});
  auto kept = cache.Read(0, 1, 4 + 29, bound, out);
  ASSERT_TRUE(kept.has_value());
  EXPECT_EQ(kept->lag, 29u);
  EXPECT_EQ(out, (std::vector<float>{3.3f, 4.4f}));
  EXPECT_EQ(cache.Read(0, 1, 4 + 30, bound, out), std::nullopt);
  // Used less: once in a push of 3 rows over 8 samples, weight 0.375, 4
  // times less: bound 117.3 — within the servers' bound, which still holds.
  cache.NotePush(0, std::vector<uint64_t>{1, 5, 6},
                 std::vector<uint32_t>{1, 3, 1}, 8);
  kept = cache.Read(0, 1, 4 + 117, bound, out);
  ASSERT_TRUE(kept.has_value());
  EXPECT_EQ(kept->lag, 117u);
  EXPECT_EQ(cache.Read(0, 1, 4 + 118, bound, out), std::nullopt);
  kept = cache.Read(0, 1, 4 + 50, 50, out);
  ASSERT_TRUE(kept.has_value());
  EXPECT_EQ(kept->lag, 50u);
  EXPECT_EQ(cache.Read(0, 1, 4 + 51, 50, out), std::nullopt);
  // Without uses each key counts once: 1 / 4 * 3 rows, weight 0.75.
  cache.NotePush(0, std::vector<uint64_t>{1, 9, 10}, {}, 4);
  kept = cache.Read(0, 1, 4, bound, out);
  ASSERT_TRUE(kept.has_value());
  EXPECT_EQ(kept->lag, 58u);
  // A row that did not move at all is read up to the servers' bound.
  cache.Store(0, 1, 9, std::vector<float>{3.3f, 4.4f});
  kept = cache.Read(0, 1, 9, bound, out);
  ASSERT_TRUE(kept.has_value());
  EXPECT_EQ(kept->lag, bound);
  // A read at the version already kept tells nothing and changes nothing.
  cache.Store(0, 1, 9, std::vector<float>{100.0f, 100.0f});
  ASSERT_TRUE(cache.Read(0, 1, 9, bound, out).has_value());
  EXPECT_EQ(out[0], 3.3f);
  // A row seen for the first time starts with the table's typical bound:
  // the moving average over 64 measures of 29 and 1024 (the unmoved row,
  // counted up to 1024) from 0 is 16.5.
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

  // Waits until the server has applied `rounds` pushes: another worker's
  // async push is answered before its apply (PsServer::Push's
  // `answer_early`), and this worker's pulls do not wait for it.
  void AwaitApplied(uint64_t rounds) {
    ASSERT_TRUE(testing::WaitFor([&] {
      return node_->ps().applied_rounds() >= rounds;
    })) << node_->ps().applied_rounds()
        << " applied";
  }

  // The servers' record: two pushes from kept rows, one 1 apply and one 2
  // applies behind, none over the bound.
  static void ExpectOneLagOfOneAndOneOfTwo(const AggregatorStats& record) {
    EXPECT_EQ(record.cached_pushes(), 2u);
    ASSERT_GE(record.read_lag_counts_size(), 3);
    EXPECT_EQ(record.read_lag_counts(1), 1u);
    EXPECT_EQ(record.read_lag_counts(2), 1u);
    EXPECT_EQ(record.max_read_lag(), 2u);
    EXPECT_EQ(record.read_lag_violations(), 0u);
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
  ExpectOneLagOfOneAndOneOfTwo(record);
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
  AwaitApplied(3);
  ASSERT_TRUE(a->PullSparse("emb", keys, rows).ok());
  EXPECT_EQ(rows[0], -3.0f);
  EXPECT_EQ(a->pull_stats().refetched_rows, 2u);
  EXPECT_EQ(a->pull_stats().cached_rows, 0u);
}

// A pull ahead (train.prefetch) reads kept rows for the push after the
// next: that push carries their version, and the server judges its lag
// against that pull, while the push between is judged against its own
// step's pull, which the pull ahead, answered first, does not replace.
TEST_F(HotRowClientTest, KeptRowsReadAheadCountForThePushTheyServe) {
  auto a = Client(0);
  auto b = Client(1);
  ASSERT_NE(a, nullptr);
  ASSERT_NE(b, nullptr);
  EXPECT_EQ(Pull(*a, 7), 0.0f);  // kept at version 0
  Push(*a, 7, 1.0f);             // a's clock 0: apply 1, the server -1
  EXPECT_EQ(Pull(*a, 7), 0.0f) << "the step of clock 1 reads the copy";
  Push(*b, 9, 1.0f);  // apply 2
  AwaitApplied(2);
  const uint64_t key = 7;
  float value = -100;
  ASSERT_TRUE(a->PullSparse("emb", {&key, 1}, {&value, 1}, KeySet::kUnique,
                            RowSource::kCacheAllowed, nullptr,
                            /*for_push=*/a->clock() + 1)
                  .ok());
  EXPECT_EQ(value, 0.0f) << "read ahead from the copy, two applies old";
  EXPECT_EQ(a->pull_stats().cached_rows, 2u);
  Push(*a, 7, 1.0f);  // clock 1: its step's pull was answered at apply 1
  Push(*a, 7, 1.0f);  // clock 2: read ahead, answered at apply 2
  ExpectOneLagOfOneAndOneOfTwo(node_->ps().Info().stats());
}

// sample_drift 1 within a bound of 8 applies, each push carrying keys 7
// and 8 of one sample (weight 1 / 1 * 2 = 2 each): each row is read from
// its copy for as many applies as it takes to move half its length at its
// own pace.
class DriftClientTest : public HotRowClientTest {
 protected:
  static HotRowsConfig ByDrift() {
    HotRowsConfig config = Config(0.2);
    config.max_lag = 8;
    config.sample_drift = 1;
    return config;
  }
  DriftClientTest() : HotRowClientTest(ByDrift()) {}

  std::vector<float> Pull(PsClient& client) {
    std::vector<uint64_t> keys{7, 8};
    std::vector<float> rows(2, -100);
    EXPECT_TRUE(client.PullSparse("emb", keys, rows).ok());
    return rows;
  }

  // Key 7 moves by 1 (its gradient, summed), key 8 does not.
  void Push(PsClient& client, std::vector<uint64_t> keys,
            std::vector<float> grads) {
    ASSERT_TRUE(
        client.Push(std::vector<TableGrad>{{"emb", keys, grads}}, 1).ok());
  }
  void Push(PsClient& client) { Push(client, {7, 8}, {1.0f, 0.0f}); }
};

TEST_F(DriftClientTest, EachRowIsReadFromItsCopyAsLongAsItsOwnPaceAllows) {
  auto client = Client(0);
  ASSERT_NE(client, nullptr);
  // Key 7 takes a push (one apply) before every pull; key 8 never moves.
  EXPECT_EQ(Pull(*client), (std::vector<float>{0, 0}));  // kept, bound 0
  Push(*client);                                         // apply 1
  // Both pulled again (no pace known yet). Key 7 moved its whole length in
  // an apply (bound 1 / (1 * 2) = 0); key 8 did not move (bound 8).
  EXPECT_EQ(Pull(*client), (std::vector<float>{-1, 0}));
  EXPECT_EQ(client->pull_stats().pulled_rows, 4u);
  Push(*client);  // apply 2
  // Key 7 pulled (-2: it moved half its length, bound 1 / (0.5 * 2) = 1),
  // key 8 read from its copy.
  EXPECT_EQ(Pull(*client), (std::vector<float>{-2, 0}));
  EXPECT_EQ(client->pull_stats().pulled_rows, 5u);
  EXPECT_EQ(client->pull_stats().cached_rows, 1u);
  Push(*client);  // apply 3: the server holds -3
  // Both from their copies: key 7's is one apply old, its bound.
  EXPECT_EQ(Pull(*client), (std::vector<float>{-2, 0}));
  EXPECT_EQ(client->pull_stats().pulled_rows, 5u);
  EXPECT_EQ(client->pull_stats().cached_rows, 3u);
  Push(*client);  // apply 4: key 7's copy is 2 applies old
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

// The same pushes with key 7 twice in each (its gradient in two halves):
// the client counts both uses, key 7 weighs 2 / 1 * 2 = 4, and at the pace
// that let it be read from its copy above it is pulled every time.
TEST_F(DriftClientTest, ARowUsedTwiceInAPushWeighsTwice) {
  auto client = Client(0);
  ASSERT_NE(client, nullptr);
  EXPECT_EQ(Pull(*client), (std::vector<float>{0, 0}));
  for (float server = -1; server >= -3; --server) {
    Push(*client, {7, 8, 7}, {0.5f, 0.0f, 0.5f});
    EXPECT_EQ(Pull(*client)[0], server) << "bound 0: always pulled";
  }
  // Pulled: both rows twice, then key 7 alone twice; key 8 from its copy.
  EXPECT_EQ(client->pull_stats().pulled_rows, 6u);
  EXPECT_EQ(client->pull_stats().cached_rows, 2u);
}

// A push whose uses do not match its keys is refused whole.
TEST_F(DriftClientTest, UsesThatDoNotMatchTheKeysAreRefused) {
  auto client = Client(0);
  ASSERT_NE(client, nullptr);
  const std::vector<uint64_t> keys{7, 8};
  const std::vector<float> grads{1.0f, 1.0f};
  const std::vector<uint32_t> uses{1};
  const absl::Status s =
      client->Push(std::vector<TableGrad>{{"emb", keys, grads, uses}}, 1);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_THAT(std::string(s.message()), ::testing::HasSubstr("uses for 1"));
  EXPECT_EQ(Pull(*client), (std::vector<float>{0, 0})) << "nothing applied";
}

}  // namespace
}  // namespace hetps
