// BucketMover against two in-process servers through a faulting transport:
// every call of a move that fails for a while (refused, its reply lost) is
// made again, and the move ends with every row where it belongs, once.
#include "shard/bucket_mover.h"

#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include <atomic>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "common/bytes.h"
#include "hetps/version.h"
#include "server/ps_server.h"
#include "server/ps_service.h"
#include "support/faulty_stub.h"
#include "support/test_support.h"

namespace hetps {
namespace {

using testing::FaultPlan;
using testing::FaultyStubs;

JobConfig TwoServerJob() {
  JobConfig config;
  config.mode = ConsistencyMode::kAsync;
  config.cluster.ps_endpoints = {"127.0.0.1:1", "127.0.0.1:2"};
  config.cluster.workers = 1;
  TableConfig emb;
  emb.name = "emb";
  emb.kind = TableKind::kSparse;
  emb.dim = 4;
  emb.optimizer.type = "adagrad";
  emb.optimizer.learning_rate = 0.5f;
  emb.init.type = "uniform";
  config.tables = {emb};
  return config;
}

// A PsServer of `config` serving on a free loopback port, in process.
struct LocalServer {
  std::unique_ptr<PsServer> ps;
  std::unique_ptr<PsService> service;
  std::unique_ptr<grpc::Server> server;
  std::string endpoint;
};

LocalServer Serve(const JobConfig& config, uint32_t rank) {
  LocalServer local;
  auto ps = PsServer::Create(config, rank);
  EXPECT_TRUE(ps.ok()) << ps.status();
  if (!ps.ok()) return local;
  local.ps = std::move(*ps);
  local.service = std::make_unique<PsService>(local.ps.get());
  grpc::ServerBuilder builder;
  int port = 0;
  builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(),
                           &port);
  builder.RegisterService(local.service.get());
  local.server = builder.BuildAndStart();
  EXPECT_NE(local.server, nullptr);
  local.endpoint = "127.0.0.1:" + std::to_string(port);
  return local;
}

// Servers 0 (`from`) and 1 (`to`) of `config`, shut down at the end.
struct TwoServers {
  explicit TwoServers(const JobConfig& config)
      : from(Serve(config, 0)), to(Serve(config, 1)) {}
  ~TwoServers() {
    for (LocalServer* s : {&from, &to}) {
      if (!s->server) continue;
      s->service->CloseStreams();  // else Shutdown waits for clients' streams
      s->server->Shutdown();
    }
  }
  bool ok() const { return from.server && to.server; }
  std::vector<std::string> endpoints() const {
    return {from.endpoint, to.endpoint};
  }
  LocalServer from;
  LocalServer to;
};

// Rows of one of server 0's buckets, trained so that their weights, state
// and counts are their own, as they were before any move.
struct TrainedBucket {
  uint32_t bucket = 0;
  std::vector<uint64_t> keys;
  std::vector<std::vector<float>> rows;
};

TrainedBucket TrainBucket(PsServer& server) {
  TrainedBucket trained;
  const ShardMap first = server.shard_map();
  uint64_t key = 0;
  while (first.ServerOf(key) != 0) ++key;
  trained.bucket = first.BucketOf(key);
  for (uint64_t k = 0; trained.keys.size() < 5; ++k) {
    if (first.BucketOf(k) == trained.bucket) trained.keys.push_back(k);
  }
  std::vector<float> grads(trained.keys.size() * 4);
  for (size_t i = 0; i < grads.size(); ++i) grads[i] = 0.125f * (i % 7) - 0.25f;
  server.sparse_table("emb")->Push(trained.keys, grads);
  for (uint64_t k : trained.keys) {
    std::vector<float> row(4);
    EXPECT_TRUE(server.sparse_table("emb")->Lookup(k, row));
    trained.rows.push_back(row);
  }
  return trained;
}

// The bucket's rows are at `to` as they were, and gone from `from`.
void ExpectMovedOnce(const TrainedBucket& trained, PsServer& from,
                     PsServer& to) {
  EXPECT_EQ(to.shard_map().owner(trained.bucket), 1u);
  EXPECT_EQ(from.sparse_table("emb")->size(), 0u);
  EXPECT_EQ(to.sparse_table("emb")->size(), trained.keys.size());
  for (size_t i = 0; i < trained.keys.size(); ++i) {
    std::vector<float> row(4);
    ASSERT_TRUE(to.sparse_table("emb")->Lookup(trained.keys[i], row));
    EXPECT_EQ(row, trained.rows[i]) << "key " << trained.keys[i];
  }
}

// Two servers, server 0 holding a trained bucket (`trained`) that the
// test moves to server 1.
class MovedBucketTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(servers.ok());
    trained = TrainBucket(*from.ps);
  }

  TwoServers servers{TwoServerJob()};
  LocalServer& from = servers.from;
  LocalServer& to = servers.to;
  TrainedBucket trained;
};

TEST_F(MovedBucketTest, CallsThatFailForAWhileAreMadeAgainAndNoRowIsLost) {
  const uint32_t bucket = trained.bucket;
  const std::vector<uint64_t>& keys = trained.keys;

  FaultPlan plan;
  plan.Refuse("PrepareMove", 1);
  plan.Refuse("AdoptShardMap", 2);
  plan.LoseReply("HandOver", 1);
  plan.LoseReply("TakeOver", 1);
  BucketMover mover(servers.endpoints(), ConsistencyMode::kAsync,
                    FaultyStubs(plan));
  auto moved = mover.Move({{bucket, 1}});
  ASSERT_TRUE(moved.ok()) << moved.status();
  EXPECT_EQ(moved->buckets, 1u);
  EXPECT_EQ(moved->rows, keys.size());
  EXPECT_EQ(plan.calls("HandOver"), 3);  // the copy twice, the give-up
  EXPECT_EQ(plan.calls("TakeOver"), 2);
  EXPECT_EQ(from.ps->map_version(), 3u);
  EXPECT_EQ(to.ps->map_version(), 3u);
  ExpectMovedOnce(trained, *from.ps, *to.ps);
}

// The old owner gives a bucket up (and refuses its reads from then on)
// only once the new owner has the settled map, whose version its answers
// tell the clients: a client that then reads the bucket at the old owner
// by the handover map is rare, where before every read of it was refused
// there until an answer of the new owner came with the settled map (the
// slowest pulls of a move: docs/BENCHMARKS.md §12, "Refused reads").
TEST_F(MovedBucketTest, TheNewOwnerHasTheSettledMapBeforeTheOldOneGivesUp) {
  const uint64_t first = from.ps->map_version();
  FaultPlan plan;
  // (old owner's, new owner's) map versions as each HandOver is made.
  std::vector<std::pair<uint64_t, uint64_t>> versions;
  plan.OnCall("HandOver", [&] {
    versions.emplace_back(from.ps->map_version(), to.ps->map_version());
  });
  BucketMover mover(servers.endpoints(), ConsistencyMode::kAsync,
                    FaultyStubs(plan));
  auto moved = mover.Move({{trained.bucket, 1}});
  ASSERT_TRUE(moved.ok()) << moved.status();
  ASSERT_EQ(versions.size(), 2u) << "the copy, the give-up";
  // The copy: both hold the handover map.
  EXPECT_EQ(versions[0], std::make_pair(first + 1, first + 1));
  // The give-up: the new owner has the settled map, the old one not yet.
  EXPECT_EQ(versions[1], std::make_pair(first + 1, first + 2));
  EXPECT_EQ(from.ps->map_version(), first + 2);
  ExpectMovedOnce(trained, *from.ps, *to.ps);
}

// The coordinator (and its mover) can die in the middle of a move; server
// 0 restarted takes the running servers' map, the handover open in it,
// and a new mover finishes it from that map: here the first mover's
// TakeOver never gets through, after the old owner handed the rows over.
TEST_F(MovedBucketTest, AHandoverLeftOpenIsFinishedByAnotherMover) {
  const uint64_t first_version = from.ps->map_version();

  FaultPlan plan;
  plan.Refuse("TakeOver", 1000000);
  BucketMover dying(servers.endpoints(), ConsistencyMode::kAsync,
                    FaultyStubs(plan), absl::Milliseconds(300));
  auto failed = dying.Move({{trained.bucket, 1}});
  ASSERT_FALSE(failed.ok());
  EXPECT_NE(failed.status().message().find("TakeOver on server 1"),
            std::string::npos)
      << failed.status();
  EXPECT_GE(plan.calls("HandOver"), 1);
  const ShardMap open = to.ps->shard_map();
  ASSERT_EQ(open.version(), first_version + 1);
  ASSERT_TRUE(open.pending().contains(trained.bucket));
  EXPECT_EQ(to.ps->sparse_table("emb")->size(), 0u);

  BucketMover next(servers.endpoints(), ConsistencyMode::kAsync,
                   GrpcParameterServerStubs(64 << 20, Credentials()));
  auto finished = next.FinishOpen(open);
  ASSERT_TRUE(finished.ok()) << finished.status();
  EXPECT_EQ(finished->buckets, 1u);
  EXPECT_EQ(finished->rows, trained.keys.size());
  EXPECT_TRUE(finished->map->pending().empty());
  EXPECT_EQ(from.ps->map_version(), first_version + 2);
  EXPECT_EQ(to.ps->map_version(), first_version + 2);
  ExpectMovedOnce(trained, *from.ps, *to.ps);
  // Nothing left open: finishing again moves nothing.
  auto again = next.FinishOpen(*finished->map);
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(again->buckets, 0u);
}

// The mover stops after the new owner adopted the settled map and before
// the old owner gave the bucket up (step 6 never gets through): the old
// owner still holds the handover map and the rows. The next mover, given
// the newest map (the settled one, nothing pending in it), brings the old
// owner to it, and the old owner drops the rows. Before, a map with no
// handover open was taken as done, and the old owner kept the older map:
// every later move failed ("the servers hold different shard maps").
TEST_F(MovedBucketTest, AServerLeftOnAnOlderMapIsBroughtToTheNewest) {
  const uint64_t first = from.ps->map_version();

  FaultPlan plan;
  int handovers = 0;
  plan.OnCall("HandOver", [&] {
    if (++handovers == 2) plan.Refuse("HandOver", 1000000);  // the give-up
  });
  BucketMover dying(servers.endpoints(), ConsistencyMode::kAsync,
                    FaultyStubs(plan), absl::Milliseconds(300));
  auto failed = dying.Move({{trained.bucket, 1}});
  ASSERT_FALSE(failed.ok());
  EXPECT_NE(failed.status().message().find("HandOver on server 0"),
            std::string::npos)
      << failed.status();
  const ShardMap newest = to.ps->shard_map();
  ASSERT_EQ(newest.version(), first + 2);
  ASSERT_TRUE(newest.pending().empty());
  ASSERT_EQ(from.ps->map_version(), first + 1) << "still handing over";

  BucketMover next(servers.endpoints(), ConsistencyMode::kAsync,
                   GrpcParameterServerStubs(64 << 20, Credentials()));
  auto finished = next.FinishOpen(newest);
  ASSERT_TRUE(finished.ok()) << finished.status();
  EXPECT_EQ(finished->buckets, 0u);
  EXPECT_EQ(from.ps->map_version(), first + 2);
  ExpectMovedOnce(trained, *from.ps, *to.ps);
  // A move after it finds both servers on one map.
  auto back = next.Move({{trained.bucket, 0}});
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(from.ps->shard_map().owner(trained.bucket), 0u);
}

TEST(BucketMoverTest, ACallThatKeepsFailingEndsTheMoveNamingTheServer) {
  TwoServers servers(TwoServerJob());
  ASSERT_TRUE(servers.ok());
  FaultPlan plan;
  plan.Refuse("PrepareMove", 1000);
  BucketMover mover(servers.endpoints(), ConsistencyMode::kAsync,
                    FaultyStubs(plan), absl::Milliseconds(300));
  auto moved = mover.Move({{0, 1}});
  ASSERT_FALSE(moved.ok());
  EXPECT_EQ(moved.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_NE(moved.status().message().find("PrepareMove on server 0"),
            std::string::npos)
      << moved.status();
  EXPECT_GT(plan.calls("PrepareMove"), 2);
}

// The cut lies as many clocks ahead as the fastest worker starts while a
// hold lasts, the hold taken as the median of the last ones: one slow hold
// (a connection made, a stall) does not push the next cuts to the cap.
TEST(BucketMoverTest, HoldAheadFollowsTheMedianHoldNotOneSlowOne) {
  const auto ms = [](int64_t n) { return absl::Milliseconds(n); };
  using Holds = std::vector<absl::Duration>;
  EXPECT_EQ(HoldAheadClocks(100, Holds{}), 0u);
  EXPECT_EQ(HoldAheadClocks(100, Holds{ms(10)}), 1u);
  EXPECT_EQ(HoldAheadClocks(100, Holds{ms(25)}), 3u);  // 2.5, rounded up
  EXPECT_EQ(HoldAheadClocks(100, Holds{ms(500), ms(10)}), 1u);
  EXPECT_EQ(HoldAheadClocks(100, Holds{ms(10), ms(500), ms(20)}), 2u);
  EXPECT_EQ(HoldAheadClocks(100, Holds{ms(500), ms(400), ms(20)}), 40u);
  EXPECT_EQ(HoldAheadClocks(1000, Holds{absl::Seconds(1)}), kMaxHoldAhead);
  EXPECT_EQ(HoldAheadClocks(5, Holds{ms(10)}), 0u);  // a twentieth of one
}

// A mover's first move makes its connections before the hold (a
// PrepareMove that holds nothing on every server), so that the hold's
// length, which sets the next cuts, is not theirs; later moves do not.
TEST_F(MovedBucketTest, AFirstMoveConnectsBeforeItsHold) {
  FaultPlan plan;
  BucketMover mover(servers.endpoints(), ConsistencyMode::kAsync,
                    FaultyStubs(plan));
  ASSERT_TRUE(mover.Move({{trained.bucket, 1}}).ok());
  const int first = plan.calls("PrepareMove");
  ASSERT_TRUE(mover.Move({{trained.bucket, 0}}).ok());
  const int second = plan.calls("PrepareMove") - first;
  EXPECT_EQ(first - second, 2);  // one more on each of the two servers
  EXPECT_EQ(from.ps->shard_map().owner(trained.bucket), 0u);
}

// A push of worker `worker` at `clock` of one row of `key`, split by map
// `map_version`.
rpc::PushRequest OneRowPush(uint32_t worker, uint64_t clock, uint64_t key,
                            uint64_t map_version) {
  rpc::PushRequest request;
  request.set_protocol_version(kProtocolVersion);
  request.set_worker_id(worker);
  request.set_clock(clock);
  request.set_batch_size(1);
  request.set_map_version(map_version);
  rpc::TableGradient* g = request.add_gradients();
  g->set_table("emb");
  g->set_dim(4);
  AssignBytes<uint64_t>(g->mutable_keys(), std::vector<uint64_t>{key});
  AssignBytes<float>(g->mutable_values(), std::vector<float>(4, 1.0f));
  return request;
}

grpc::Status Push(PsServer& server, const rpc::PushRequest& request) {
  grpc::ServerContext context;
  rpc::PushResponse response;
  return server.Push(&context, &request, &response);
}

// Worker 0's request at `clock`, split by map `map_version`, that carries
// no rows: it tells a server the worker's clock and map.
rpc::PushRequest EmptyPush(uint64_t clock, uint64_t map_version) {
  rpc::PushRequest request = OneRowPush(0, clock, 0, map_version);
  request.clear_gradients();
  return request;
}

// Worker 0's read of `keys` at `clock`, split by map `map_version`, from
// `server` over its gRPC port.
grpc::Status PullFrom(const LocalServer& server,
                      const std::vector<uint64_t>& keys, uint64_t clock,
                      uint64_t map_version, std::vector<float>* rows) {
  auto stub = rpc::ParameterServer::NewStub(
      grpc::CreateChannel(server.endpoint, grpc::InsecureChannelCredentials()));
  rpc::PullSparseRequest request;
  request.set_protocol_version(kProtocolVersion);
  request.set_table("emb");
  request.set_dim(4);
  request.set_worker_id(0);
  request.set_clock(clock);
  request.set_map_version(map_version);
  AssignBytes<uint64_t>(request.mutable_keys(), keys);
  grpc::ClientContext context;
  rpc::PullSparseResponse response;
  grpc::Status status = stub->PullSparse(&context, request, &response);
  rows->resize(response.values().size() / sizeof(float));
  std::memcpy(rows->data(), response.values().data(), response.values().size());
  return status;
}

// The old owner gives a bucket up only once every live worker has split a
// request by the settled map: until then it serves the bucket's reads
// split by an older one, which it would refuse once given up (the client
// then asks the new owner: two requests, the slowest pulls of a move,
// docs/BENCHMARKS.md §12).
TEST_F(MovedBucketTest, TheOldOwnerServesReadsUntilTheWorkersSplitByTheNewMap) {
  const uint64_t first = from.ps->map_version();
  const uint64_t handover = first + 1;
  const uint64_t settled = first + 2;
  ASSERT_TRUE(Push(*from.ps, EmptyPush(0, first)).ok());  // the cut: clock 1
  FaultPlan plan;
  std::atomic<int> handovers{0};  // the copy, then the give-up
  plan.OnCall("HandOver", [&] { ++handovers; });
  BucketMover mover(servers.endpoints(), ConsistencyMode::kAsync,
                    FaultyStubs(plan), absl::Seconds(30), absl::Seconds(30),
                    /*learn_timeout=*/absl::Seconds(60));
  absl::StatusOr<MoveReport> moved;
  std::thread move([&] { moved = mover.Move({{trained.bucket, 1}}); });
  ASSERT_TRUE(testing::WaitFor([&] {
    return from.ps->map_version() >= handover &&
           to.ps->map_version() >= handover;
  }));
  ASSERT_TRUE(Push(*from.ps, EmptyPush(1, handover)).ok());  // past the cut
  ASSERT_TRUE(
      testing::WaitFor([&] { return to.ps->map_version() >= settled; }));

  std::vector<float> rows;
  const grpc::Status read = PullFrom(from, trained.keys, 1, handover, &rows);
  EXPECT_TRUE(read.ok()) << read.error_message();
  ASSERT_EQ(rows.size(), trained.keys.size() * 4);
  for (size_t i = 0; i < trained.keys.size(); ++i) {
    EXPECT_EQ(
        std::vector<float>(rows.begin() + i * 4, rows.begin() + i * 4 + 4),
        trained.rows[i])
        << "key " << trained.keys[i];
  }
  EXPECT_EQ(handovers.load(), 1) << "given up before the worker split by "
                                    "the settled map";

  ASSERT_TRUE(Push(*from.ps, EmptyPush(2, settled)).ok());
  move.join();
  ASSERT_TRUE(moved.ok()) << moved.status();
  EXPECT_EQ(handovers.load(), 2);
  EXPECT_EQ(from.ps->map_version(), settled);
  ExpectMovedOnce(trained, *from.ps, *to.ps);
  // Given up and settled: the old map's read is refused now.
  EXPECT_EQ(PullFrom(from, trained.keys, 3, handover, &rows).error_code(),
            grpc::StatusCode::ABORTED);
}

// A worker that makes no request past the cut holds the give-up back for
// the mover's learn_timeout at most: the move ends all the same.
TEST_F(MovedBucketTest,
       AWorkerThatStopsRequestingHoldsTheGiveUpBackAMomentAtMost) {
  const uint64_t first = from.ps->map_version();
  ASSERT_TRUE(Push(*from.ps, EmptyPush(0, first)).ok());
  const absl::Duration learn_timeout = absl::Milliseconds(100);
  BucketMover mover(servers.endpoints(), ConsistencyMode::kAsync,
                    GrpcParameterServerStubs(64 << 20, Credentials()),
                    absl::Seconds(30), absl::Seconds(30), learn_timeout);
  absl::StatusOr<MoveReport> moved;
  std::thread move([&] { moved = mover.Move({{trained.bucket, 1}}); });
  ASSERT_TRUE(testing::WaitFor([&] {
    return from.ps->map_version() > first && to.ps->map_version() > first;
  }));
  ASSERT_TRUE(Push(*from.ps, EmptyPush(1, first + 1)).ok());
  move.join();
  ASSERT_TRUE(moved.ok()) << moved.status();
  EXPECT_GE(moved->learn, learn_timeout);
  EXPECT_EQ(from.ps->map_version(), first + 2);
  ExpectMovedOnce(trained, *from.ps, *to.ps);
}

// In semi_async, as in sync, a worker the cut does not name would be past
// it at once and could wait at the new owner for rows that move only once
// the others pass the cut, while they wait for it to come within the
// window: a move waits until every live worker has sent a request. And the
// cut is one clock for all, so that a worker waiting at the new owner
// (its clock one below the cut) lets every other reach the cut.
TEST(BucketMoverTest, SemiAsyncMovesWaitForEveryWorkerAndCutAllAtOneClock) {
  JobConfig config = TwoServerJob();
  config.mode = ConsistencyMode::kSemiAsync;
  config.cluster.workers = 2;
  TwoServers servers(config);
  ASSERT_TRUE(servers.ok());
  LocalServer& home = servers.from;
  LocalServer& other = servers.to;
  const ShardMap first = home.ps->shard_map();
  // A key that stays on server 0, and a bucket of server 0 that moves.
  uint64_t key = 0;
  while (first.ServerOf(key) != 0) ++key;
  uint32_t moving = 0;
  while (first.owner(moving) != 0 || moving == first.BucketOf(key)) ++moving;

  for (uint64_t clock = 0; clock < 4; ++clock) {
    ASSERT_TRUE(Push(*home.ps, OneRowPush(0, clock, key, 1)).ok());
  }
  BucketMover mover(servers.endpoints(), ConsistencyMode::kSemiAsync,
                    GrpcParameterServerStubs(64 << 20, Credentials()),
                    absl::Seconds(30), /*pass_timeout=*/absl::Seconds(10));
  auto refused = mover.Move({{moving, 1}});
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_NE(
      refused.status().message().find("live worker 1 has sent no request yet"),
      std::string::npos)
      << refused.status();
  EXPECT_EQ(home.ps->map_version(), first.version());

  ASSERT_TRUE(Push(*home.ps, OneRowPush(1, 0, key, 1)).ok());
  const uint64_t handover = first.version() + 1;
  absl::StatusOr<MoveReport> moved;
  std::thread move([&] { moved = mover.Move({{moving, 1}}); });
  // Both workers past the cut once the handover is in force everywhere:
  // seen at clocks 3 and 0, the cut is clock 4 for both.
  ASSERT_TRUE(testing::WaitFor([&] {
    return home.ps->map_version() >= handover &&
           other.ps->map_version() >= handover;
  }));
  ASSERT_TRUE(Push(*home.ps, OneRowPush(0, 4, key, handover)).ok());
  ASSERT_TRUE(Push(*home.ps, OneRowPush(1, 4, key, handover)).ok());
  move.join();
  ASSERT_TRUE(moved.ok()) << moved.status();
  EXPECT_EQ(moved->buckets, 1u);
  EXPECT_EQ(other.ps->shard_map().owner(moving), 1u);
  // Worker 1's requests at clocks 1-3 still went to the old owner: split
  // by the map before the handover, they hold.
  for (uint64_t clock = 1; clock < 4; ++clock) {
    EXPECT_TRUE(moved->map->SplitHolds(first.version(), {1, 0, clock}))
        << "clock " << clock;
  }
  EXPECT_FALSE(moved->map->SplitHolds(first.version(), {1, 0, 4}));
}

}  // namespace
}  // namespace hetps
