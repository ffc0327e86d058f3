// PsClient against a real server of this process, through stubs that fail
// calls on purpose (support/faulty_stub.h) and on a FakeClock: retries,
// back-off, lost replies and dead peers, without child processes and
// without sleeping.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <numeric>
#include <thread>

#include "client/ps_client_factory.h"
#include "gmock/gmock.h"
#include "hetps/version.h"
#include "node/server_node.h"
#include "support/fake_clock.h"
#include "support/faulty_stub.h"
#include "support/test_support.h"

namespace hetps {
namespace {

using ::testing::ElementsAre;
using testing::FakeClock;
using testing::FaultPlan;
using testing::FaultyStubs;
using ::testing::HasSubstr;
using testing::OneTableJob;

class PsClientTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto node = ServerNode::Start(OneTableJob(ConsistencyMode::kAsync), 0,
                                  "127.0.0.1:0");
    ASSERT_TRUE(node.ok()) << node.status();
    node_ = std::move(*node);
    endpoint_ = "127.0.0.1:" + std::to_string(node_->port());
    options_.endpoints = {endpoint_};
    options_.worker_id = 0;
    options_.rpc.initial_backoff_s = 0.1;
    options_.rpc.max_backoff_s = 0.25;
    options_.rpc.connect_deadline_s = 2;
  }

  absl::StatusOr<std::unique_ptr<PsClient>> Connect() {
    return PsClientFactory::Connect(options_, clock_,
                                    FaultyPsClientStubs(plan_));
  }

  absl::Duration Slept() const {
    const auto sleeps = clock_.sleeps();
    return std::accumulate(sleeps.begin(), sleeps.end(), absl::ZeroDuration());
  }

  std::unique_ptr<ServerNode> node_;
  std::string endpoint_;
  PsClientOptions options_;
  FakeClock clock_;
  FaultPlan plan_;
};

TEST_F(PsClientTest, UnavailableIsRetriedWithDoublingCappedBackOff) {
  auto client = Connect();
  ASSERT_TRUE(client.ok()) << client.status();
  plan_.Refuse("PullSparse", 3);
  const uint64_t key = 5;
  std::vector<float> row(2, -1.0f);
  ASSERT_TRUE((*client)->PullSparse("emb", {&key, 1}, row).ok());
  EXPECT_EQ(row, (std::vector<float>{0.0f, 0.0f}));
  EXPECT_EQ(plan_.calls("PullSparse"), 4);
  // 0.1, doubled to 0.2, capped at max_backoff_s.
  EXPECT_THAT(clock_.sleeps(),
              ElementsAre(absl::Milliseconds(100), absl::Milliseconds(200),
                          absl::Milliseconds(250)));
}

TEST_F(PsClientTest, ServerThatComesUpLateIsFoundWithinTheDeadline) {
  plan_.Refuse("GetTableInfo", 2);
  auto client = Connect();
  ASSERT_TRUE(client.ok()) << client.status();
  EXPECT_EQ(plan_.calls("GetTableInfo"), 3);
  EXPECT_EQ(Slept(), absl::Milliseconds(300));
}

// A server answers a request split by an older shard map with its own map
// along: the client splits the next requests by it without fetching it.
TEST_F(PsClientTest, ANewerMapComesWithTheAnswerNotAnotherCall) {
  auto client = Connect();
  ASSERT_TRUE(client.ok()) << client.status();
  const int fetched = plan_.calls("GetTableInfo");
  const ShardMap first = node_->ps().shard_map();
  ASSERT_TRUE(node_->ps().AdoptMap(first.WithOwners({})));
  const uint64_t key = 5;
  std::vector<float> row(2);
  ASSERT_TRUE((*client)->PullSparse("emb", {&key, 1}, row).ok());
  ASSERT_TRUE((*client)->PullSparse("emb", {&key, 1}, row).ok());
  const auto pulls = plan_.pull_requests();
  ASSERT_EQ(pulls.size(), 2u);
  EXPECT_EQ(pulls[0].map_version(), first.version());
  EXPECT_EQ(pulls[1].map_version(), first.version() + 1);
  EXPECT_EQ(plan_.calls("GetTableInfo"), fetched);
}

TEST_F(PsClientTest, DeadServerFailsAtTheDeadlineNamingIt) {
  auto client = Connect();
  ASSERT_TRUE(client.ok()) << client.status();
  plan_.SetDead(true);
  const uint64_t key = 5;
  std::vector<float> row(2);
  const absl::Status s = (*client)->PullSparse("emb", {&key, 1}, row);
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(s.message(), HasSubstr("PS server 0 at " + endpoint_ +
                                     " unreachable for 2.0 s "
                                     "(client.connect_deadline_s = 2)"));
  EXPECT_THAT(s.message(), HasSubstr("injected fault"));
  // The back-off never oversleeps the deadline.
  EXPECT_EQ(Slept(), absl::Seconds(2));
}

// A push whose reply is lost reached the server: the retry is recognised
// (same worker, same clock) and the gradient applied once.
TEST_F(PsClientTest, PushWhoseReplyWasLostIsAppliedOnce) {
  auto client = Connect();
  ASSERT_TRUE(client.ok()) << client.status();
  plan_.LoseReply("Push", 1);
  const uint64_t key = 9;
  const std::vector<float> grad = {1.0f, 2.0f};
  const TableGrad grads[] = {{"emb", {&key, 1}, grad}};
  ASSERT_TRUE((*client)->Push(grads, 1).ok());
  EXPECT_EQ(plan_.calls("Push"), 2);
  EXPECT_EQ((*client)->clock(), 1u);
  std::vector<float> row(2);
  ASSERT_TRUE(node_->ps().sparse_table("emb")->Lookup(key, row));
  EXPECT_EQ(row, (std::vector<float>{-1.0f, -2.0f}));  // sgd, lr 1, once
}

// A NaN/Inf gradient is refused whole by the client: no server sees a part
// of the push (none could apply its half), and the clock does not move.
TEST_F(PsClientTest, NonFiniteGradientsAreRefusedBeforeAnythingIsSent) {
  auto client = Connect();
  ASSERT_TRUE(client.ok()) << client.status();
  const uint64_t key = 9;
  const std::vector<float> grad = {0.0f, NAN};
  const TableGrad grads[] = {{"emb", {&key, 1}, grad}};
  const absl::Status s = (*client)->Push(grads, 1);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(),
              HasSubstr("non-finite gradient value nan at index 1"));
  EXPECT_EQ(plan_.calls("Push"), 0);
  EXPECT_EQ((*client)->clock(), 0u);

  // Found as the rows are copied for the servers, the caller's index named.
  const uint64_t keys[] = {3, 4, 5};
  const std::vector<float> later = {1, 2, 3, 4, -INFINITY, 6};
  const TableGrad later_grads[] = {{"emb", keys, later}};
  const absl::Status unique = (*client)->Push(later_grads, 1, KeySet::kUnique);
  EXPECT_EQ(unique.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(unique.message(),
              HasSubstr("non-finite gradient value -inf at index 4"));

  // Finite values of a repeated key whose sum is not.
  const uint64_t twice[] = {7, 7};
  const float big = std::numeric_limits<float>::max();
  const std::vector<float> huge = {big, 1, big, 1};
  const TableGrad huge_grads[] = {{"emb", twice, huge}};
  const absl::Status summed = (*client)->Push(huge_grads, 1);
  EXPECT_EQ(summed.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(summed.message(),
              HasSubstr("table 'emb': the gradients of a repeated key sum to "
                        "a non-finite value"));
  EXPECT_EQ(plan_.calls("Push"), 0);
  EXPECT_EQ((*client)->clock(), 0u);
}

// A server's other error is not retried: it comes back at once, prefixed
// with the server.
TEST_F(PsClientTest, OtherErrorsAreNotRetried) {
  auto client = Connect();
  ASSERT_TRUE(client.ok()) << client.status();
  const uint64_t key = 9;
  const std::vector<float> grad = {1.0f, 0.0f};
  const TableGrad grads[] = {{"emb", {&key, 1}, grad}};
  // A push of zero samples: the server refuses it.
  const absl::Status s = (*client)->Push(grads, 0);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("batch_size must be >= 1"));
  EXPECT_THAT(s.message(), HasSubstr("server 0 (" + endpoint_ + ")"));
  EXPECT_EQ(plan_.calls("Push"), 1);
  EXPECT_TRUE(clock_.sleeps().empty());
}

// A sync server with one sgd table (a whole step from the first round) and
// a client of it through faulty stubs, on the real clock.
class PsClientPullAheadTest : public ::testing::Test {
 protected:
  void SetUp() override {
    JobConfig config = OneTableJob(ConsistencyMode::kSync);
    auto node = ServerNode::Start(config, 0, "127.0.0.1:0");
    ASSERT_TRUE(node.ok()) << node.status();
    node_ = std::move(*node);
    options_.endpoints = {"127.0.0.1:" + std::to_string(node_->port())};
    options_.worker_id = 0;
  }

  absl::StatusOr<std::unique_ptr<PsClient>> Connect() {
    return PsClientFactory::Connect(options_, Clock::Real(),
                                    FaultyPsClientStubs(plan_));
  }

  // Pulls `kKey`'s row into `row_` for the push after the next, on a
  // thread of its own (it waits at the server), its outcome into `*ahead`.
  std::thread PullAhead(PsClient& c, absl::Status* ahead) {
    return std::thread([this, &c, ahead] {
      *ahead = c.PullSparse("emb", {&kKey, 1}, row_, KeySet::kUnique,
                            RowSource::kServers, nullptr, /*for_push=*/1);
    });
  }

  // Push 0: the gradient {1, 2} of `kKey`'s row.
  absl::Status PushOne(PsClient& c) {
    const std::vector<float> grad = {1.0f, 2.0f};
    const TableGrad grads[] = {{"emb", {&kKey, 1}, grad}};
    return c.Push(grads, 1);
  }

  static constexpr uint64_t kKey = 4;
  std::vector<float> row_ = std::vector<float>(2, 9.0f);
  std::unique_ptr<ServerNode> node_;
  PsClientOptions options_;
  FaultPlan plan_;
};

// A pull for the push after the next (train.prefetch): in sync the rows of
// the next step exist once the round of this step's push closes, so the
// pull, sent before that push, is answered with the push applied. Only one
// step ahead.
TEST_F(PsClientPullAheadTest, ASyncPullAheadIsAnsweredWithThePushAfterIt) {
  auto client = Connect();
  ASSERT_TRUE(client.ok()) << client.status();
  PsClient& c = **client;
  absl::Status ahead;
  std::thread pull = PullAhead(c, &ahead);
  // The pull waits at the server for round 0, which this push closes.
  ASSERT_TRUE(testing::WaitFor(
      [&] { return node_->ps().aggregator_stats().pulls() >= 1; }));
  ASSERT_TRUE(PushOne(c).ok());
  pull.join();
  ASSERT_TRUE(ahead.ok()) << ahead;
  EXPECT_EQ(row_, (std::vector<float>{-1.0f, -2.0f}));  // sgd, lr 1

  // The clock is 1 now: rows for push 1 are an ordinary pull; for push 0
  // (made) or 3 (two ahead) they are refused.
  EXPECT_TRUE(c.PullSparse("emb", {&kKey, 1}, row_, KeySet::kUnique,
                           RowSource::kServers, nullptr, 1)
                  .ok());
  for (uint64_t for_push : {0u, 3u}) {
    const absl::Status s =
        c.PullSparse("emb", {&kKey, 1}, row_, KeySet::kUnique,
                     RowSource::kServers, nullptr, for_push);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << for_push;
    EXPECT_THAT(s.message(), HasSubstr("at most one step ahead"));
  }
}

// A pull ahead that fails after its worker's push went through (the server
// went away meanwhile) is sent again as a pull at the clock that push
// reached: sent as before — clock 0, one ahead — a restarted sync server,
// which lost push 0, would hold it for that push forever.
TEST_F(PsClientPullAheadTest,
       APullAheadSentAgainAfterItsPushCarriesTheNewClock) {
  options_.rpc.initial_backoff_s = 0.01;
  absl::Notification pushed;
  plan_.RefuseWhen("PullSparse", &pushed);
  auto client = Connect();
  ASSERT_TRUE(client.ok()) << client.status();
  PsClient& c = **client;
  absl::Status ahead;
  std::thread pull = PullAhead(c, &ahead);
  // Its first try is held in the stub while the push goes through.
  ASSERT_TRUE(testing::WaitFor([&] { return plan_.calls("PullSparse") >= 1; }));
  ASSERT_TRUE(PushOne(c).ok());
  pushed.Notify();
  pull.join();
  ASSERT_TRUE(ahead.ok()) << ahead;
  EXPECT_EQ(row_, (std::vector<float>{-1.0f, -2.0f}));
  const std::vector<rpc::PullSparseRequest> sent = plan_.pull_requests();
  ASSERT_EQ(sent.size(), 2u);
  EXPECT_EQ(sent[0].clock(), 0u);
  EXPECT_EQ(sent[0].ahead(), 1u);
  EXPECT_EQ(sent[1].clock(), 1u);
  EXPECT_EQ(sent[1].ahead(), 0u);
}

// A pull of rows on two servers, one of whose buckets its old owner gave
// up: that server refuses as "moved", and only its rows are asked for
// again (of the bucket's new owner); the other server's answer stands.
TEST(PsClientMovesTest, APullRefusedAsMovedAsksAgainOnlyForItsRows) {
  JobConfig config = OneTableJob(ConsistencyMode::kAsync);
  config.cluster.ps_endpoints = {"127.0.0.1:1", "127.0.0.1:2"};
  std::vector<std::unique_ptr<ServerNode>> nodes;
  PsClientOptions options;
  for (uint32_t rank : {0u, 1u}) {
    auto node = ServerNode::Start(config, rank, "127.0.0.1:0");
    ASSERT_TRUE(node.ok()) << node.status();
    options.endpoints.push_back("127.0.0.1:" + std::to_string((*node)->port()));
    nodes.push_back(std::move(*node));
  }
  PsServer& new_owner = nodes[0]->ps();
  PsServer& old_owner = nodes[1]->ps();
  const ShardMap v1 = old_owner.shard_map();
  uint64_t moving = 1;
  while (v1.ServerOf(moving) != 1) ++moving;
  uint64_t staying = 1;
  while (v1.ServerOf(staying) != 0) ++staying;
  options.worker_id = 0;
  FaultPlan plan;
  auto client = PsClientFactory::Connect(options, Clock::Real(),
                                         FaultyPsClientStubs(plan));
  ASSERT_TRUE(client.ok()) << client.status();
  PsClient& c = **client;
  // Push 0 (sgd, lr 1): the rows become minus the gradients.
  const std::vector<uint64_t> keys = {moving, staying};
  const std::vector<float> grad = {1, 2, 3, 4};
  const TableGrad grads[] = {{"emb", keys, grad}};
  ASSERT_TRUE(c.Push(grads, 1).ok());

  // The moving key's bucket goes to server 0 from clock 1 on: its rows
  // arrive there, and server 1 gives it up.
  const uint32_t bucket = v1.BucketOf(moving);
  auto v2 =
      v1.WithHandover({{bucket, 0}}, {{0, {.incarnation = 0, .clock = 1}}});
  ASSERT_TRUE(v2.ok()) << v2.status();
  ASSERT_TRUE(new_owner.AdoptMap(*v2));
  ASSERT_TRUE(old_owner.AdoptMap(*v2));
  rpc::HandOverRequest hand;
  hand.set_protocol_version(kProtocolVersion);
  hand.add_buckets(bucket);
  rpc::TakeOverRequest take;
  take.set_protocol_version(kProtocolVersion);
  grpc::ServerContext hand_ctx, take_ctx, give_ctx;
  ASSERT_TRUE(old_owner.HandOver(&hand_ctx, &hand, take.mutable_rows()).ok());
  rpc::TakeOverResponse taken;
  ASSERT_TRUE(new_owner.TakeOver(&take_ctx, &take, &taken).ok());
  ASSERT_EQ(taken.rows(), 1u);
  hand.set_give_up(true);
  rpc::MovedRows none;
  ASSERT_TRUE(old_owner.HandOver(&give_ctx, &hand, &none).ok());

  const size_t before = plan.pull_requests().size();
  const uint64_t retries = c.pull_stats().moved_retries;
  std::vector<float> rows(4, 9.0f);
  ASSERT_TRUE(c.PullSparse("emb", keys, rows).ok());
  EXPECT_EQ(rows, (std::vector<float>{-1, -2, -3, -4}));
  EXPECT_EQ(c.pull_stats().moved_retries - retries, 2u)
      << "server 1 refused twice";
  // Split by map 1, the moving row is refused by server 1 (and again as
  // its owner by that map), then read at server 0 by map 2. Server 1 is
  // asked along each time (the pull is its gate), server 0 for the
  // staying row once only.
  const std::vector<rpc::PullSparseRequest> sent = plan.pull_requests();
  ASSERT_GT(sent.size(), before + 2);
  int staying_asked = 0;
  std::vector<uint64_t> last;
  for (size_t i = before; i < sent.size(); ++i) {
    std::vector<uint64_t> k(sent[i].keys().size() / sizeof(uint64_t));
    if (k.empty()) continue;  // a server asked along, for its gate
    std::memcpy(k.data(), sent[i].keys().data(), sent[i].keys().size());
    for (uint64_t key : k) staying_asked += key == staying;
    last = k;
  }
  EXPECT_EQ(staying_asked, 1);
  EXPECT_THAT(last, ElementsAre(moving));
}

}  // namespace
}  // namespace hetps
