// Bad input against a real server on loopback: every malformed request gets
// its specific code and message, the tables stay unchanged, and the server
// keeps serving.
#include "server/ps_server.h"

#include <grpcpp/generic/generic_stub.h>
#include <gtest/gtest.h>

#include <atomic>
#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <thread>
#include <vector>

#include "absl/synchronization/notification.h"
#include "common/bytes.h"
#include "common/channel.h"
#include "compress/codec.h"
#include "config/table_schema.h"
#include "hetps.grpc.pb.h"
#include "hetps/ps_client.h"
#include "hetps/version.h"
#include "node/server_node.h"
#include "support/test_support.h"

namespace hetps {
namespace {

using ::testing::HasSubstr;

JobConfig TwoTableJob() {
  JobConfig config;
  config.mode = ConsistencyMode::kAsync;
  config.cluster.ps_endpoints = {"127.0.0.1:1"};  // rank 0 is this process
  config.cluster.workers = 1;
  config.server.max_keys_per_request = 1000;
  TableConfig emb;
  emb.name = "emb";
  emb.kind = TableKind::kSparse;
  emb.dim = 4;
  emb.optimizer.type = "sgd";
  emb.optimizer.learning_rate = 0.5f;
  emb.init.type = "zero";
  TableConfig dense = emb;
  dense.name = "dense";
  dense.kind = TableKind::kDense;
  dense.dim = 3;
  config.tables = {emb, dense};
  return config;
}

class PsServerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto node = ServerNode::Start(TwoTableJob(), 0, "127.0.0.1:0");
    ASSERT_TRUE(node.ok()) << node.status();
    node_ = std::move(*node);
    channel_ = MakeChannel("127.0.0.1:" + std::to_string(node_->port()),
                           64 << 20, Credentials());
    ps_ = rpc::ParameterServer::NewStub(channel_);
    coord_ = rpc::Coordinator::NewStub(channel_);
  }

  rpc::PushRequest GoodPush(std::vector<uint64_t> keys, float value) {
    rpc::PushRequest req;
    req.set_protocol_version(kProtocolVersion);
    req.set_worker_id(0);
    req.set_clock(clock_++);
    req.set_batch_size(1);
    rpc::TableGradient* g = req.add_gradients();
    g->set_table("emb");
    g->set_dim(4);
    AssignBytes<uint64_t>(g->mutable_keys(), keys);
    std::vector<float> values(keys.size() * 4, value);
    AssignBytes<float>(g->mutable_values(), values);
    return req;
  }

  grpc::Status Push(const rpc::PushRequest& req) {
    grpc::ClientContext ctx;
    rpc::PushResponse resp;
    return ps_->Push(&ctx, req, &resp);
  }

  std::vector<float> Row(uint64_t key) {
    std::vector<float> out(4, -99.0f);
    if (!node_->ps().sparse_table("emb")->Lookup(key, out)) return {};
    return out;
  }

  // After every refused request: nothing changed and good requests work.
  void ExpectUnchangedAndServing() {
    EXPECT_EQ(node_->ps().sparse_table("emb")->size(), 1u);
    EXPECT_EQ(Row(1), (std::vector<float>{-0.5f, -0.5f, -0.5f, -0.5f}));
    std::vector<float> dense(3);
    node_->ps().dense_table("dense")->Pull(dense);
    EXPECT_EQ(dense, (std::vector<float>{0, 0, 0}));
    grpc::ClientContext ctx;
    rpc::TableInfoRequest req;
    req.set_protocol_version(kProtocolVersion);
    rpc::TableInfoResponse resp;
    EXPECT_TRUE(ps_->GetTableInfo(&ctx, req, &resp).ok());
  }

  void ApplyOneGoodPush() {
    ASSERT_TRUE(Push(GoodPush({1}, 1.0f)).ok());
    ExpectUnchangedAndServing();
  }

  std::unique_ptr<ServerNode> node_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<rpc::ParameterServer::Stub> ps_;
  std::unique_ptr<rpc::Coordinator::Stub> coord_;
  uint64_t clock_ = 0;
};

// Issue 17.4: over the wire, sync pulls that wait for their round hold no
// server thread. 63 of 64 workers push round 0 and pull at clock 1; while
// all 63 wait, the process has no more threads than before them (within
// gRPC's own few); the last worker's push answers every one.
TEST(PsServerScaleTest, WaitingPullsHoldNoThreadOverTheWire) {
  constexpr uint32_t kWorkers = 64;
  JobConfig config = TwoTableJob();
  config.mode = ConsistencyMode::kSync;
  config.cluster.workers = kWorkers;
  config.train.warmup_rounds = 0;  // the first round takes a full step
  auto node = ServerNode::Start(config, 0, "127.0.0.1:0");
  ASSERT_TRUE(node.ok()) << node.status();
  auto stub = rpc::ParameterServer::NewStub(MakeChannel(
      "127.0.0.1:" + std::to_string((*node)->port()), 64 << 20, Credentials()));
  auto push = [&](uint32_t worker) {
    rpc::PushRequest req;
    req.set_protocol_version(kProtocolVersion);
    req.set_worker_id(worker);
    req.set_clock(0);
    req.set_batch_size(1);
    rpc::TableGradient* g = req.add_gradients();
    g->set_table("emb");
    g->set_dim(4);
    AssignBytes<uint64_t>(g->mutable_keys(), std::vector<uint64_t>{7});
    AssignBytes<float>(g->mutable_values(), std::vector<float>(4, 1.0f));
    grpc::ClientContext ctx;
    rpc::PushResponse resp;
    return stub->Push(&ctx, req, &resp);
  };
  for (uint32_t w = 0; w + 1 < kWorkers; ++w) ASSERT_TRUE(push(w).ok());

  struct Pull {
    grpc::ClientContext ctx;
    rpc::PullSparseRequest req;
    rpc::PullSparseResponse resp;
    absl::Notification done;
    grpc::Status status;
  };
  std::vector<std::unique_ptr<Pull>> pulls;
  const int threads_before = testing::ThreadsOfThisProcess();
  for (uint32_t w = 0; w + 1 < kWorkers; ++w) {
    auto pull = std::make_unique<Pull>();
    pull->req.set_protocol_version(kProtocolVersion);
    pull->req.set_worker_id(w);
    pull->req.set_clock(1);
    pull->req.set_table("emb");
    pull->req.set_dim(4);
    AssignBytes<uint64_t>(pull->req.mutable_keys(), std::vector<uint64_t>{7});
    Pull* p = pull.get();
    stub->async()->PullSparse(&p->ctx, &p->req, &p->resp, [p](grpc::Status s) {
      p->status = std::move(s);
      p->done.Notify();
    });
    pulls.push_back(std::move(pull));
  }
  // Every pull has reached the aggregator (and waits there).
  ASSERT_TRUE(testing::WaitFor([&] {
    return (*node)->ps().aggregator_stats().pulls() == kWorkers - 1;
  })) << "the pulls never all reached the server";
  EXPECT_LE(testing::ThreadsOfThisProcess(), threads_before + 8);
  for (const auto& pull : pulls) EXPECT_FALSE(pull->done.HasBeenNotified());

  ASSERT_TRUE(push(kWorkers - 1).ok());
  for (const auto& pull : pulls) {
    pull->done.WaitForNotification();
    ASSERT_TRUE(pull->status.ok()) << pull->status.error_message();
    std::vector<float> row(4);
    std::memcpy(row.data(), pull->resp.values().data(), 16);
    // The round's mean gradient (1.0) times the learning rate (0.5).
    EXPECT_EQ(row, (std::vector<float>{-0.5f, -0.5f, -0.5f, -0.5f}));
  }
}

// Bytes that parse as no request, sent to the methods that carry tensors
// (PullSparse is parsed by the service itself): refused, nothing changes.
TEST_F(PsServerTest, BytesThatAreNoRequestAreRefused) {
  ApplyOneGoodPush();
  grpc::GenericStub generic(channel_);
  const std::string garbage = "\x22\xff\xff\xff\x7f not a message";
  for (const char* method : {"/hetps.rpc.ParameterServer/PullSparse",
                             "/hetps.rpc.ParameterServer/Push"}) {
    grpc::Slice slice(garbage);
    grpc::ByteBuffer request(&slice, 1);
    grpc::ByteBuffer response;
    grpc::ClientContext ctx;
    absl::Notification done;
    grpc::Status status;
    generic.UnaryCall(&ctx, method, grpc::StubOptions(), &request, &response,
                      [&](grpc::Status s) {
                        status = std::move(s);
                        done.Notify();
                      });
    done.WaitForNotification();
    EXPECT_FALSE(status.ok()) << method;
    if (std::string(method).ends_with("PullSparse")) {
      EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
      EXPECT_THAT(status.error_message(), HasSubstr("not a PullSparseRequest"));
    }
    ExpectUnchangedAndServing();
  }
}

// A table's plans (SparseTable::plan_counts) are in GetTableInfo: pushes
// of the same 600 keys soon find the plan one of them kept, and every row
// takes every push.
TEST_F(PsServerTest, TableInfoCountsThePlansKeptAndFound) {
  std::vector<uint64_t> keys(600);
  for (uint64_t k = 0; k < keys.size(); ++k) keys[k] = k * 7919 + 11;
  auto plans = [&] {
    grpc::ClientContext ctx;
    rpc::TableInfoRequest req;
    req.set_protocol_version(kProtocolVersion);
    req.set_table("emb");
    rpc::TableInfoResponse resp;
    EXPECT_TRUE(ps_->GetTableInfo(&ctx, req, &resp).ok());
    EXPECT_EQ(resp.tables_size(), 1);
    return resp.tables_size() == 1 ? resp.tables(0) : rpc::TableInfo();
  };
  EXPECT_EQ(plans().plans_found(), 0u);
  int pushes = 0;
  while (pushes < 200 && plans().plans_found() == 0) {
    ASSERT_TRUE(Push(GoodPush(keys, 1.0f)).ok());
    ++pushes;
  }
  const rpc::TableInfo first = plans();
  ASSERT_EQ(first.plans_found(), 1u);
  EXPECT_GE(first.plans_kept(), 1u);
  for (int i = 0; i < 5; ++i) ASSERT_TRUE(Push(GoodPush(keys, 1.0f)).ok());
  pushes += 5;
  EXPECT_EQ(plans().plans_found(), 6u);
  for (uint64_t key : keys) {
    EXPECT_EQ(Row(key), std::vector<float>(4, -0.5f * pushes)) << key;
  }
}

TEST_F(PsServerTest, WrongDimensionIsInvalidArgument) {
  ApplyOneGoodPush();
  rpc::PushRequest req = GoodPush({2}, 1.0f);
  req.mutable_gradients(0)->set_dim(8);
  grpc::Status s = Push(req);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(s.error_message(), HasSubstr("'emb' has dim 4, push says 8"));
  ExpectUnchangedAndServing();

  grpc::ClientContext ctx;
  rpc::PullSparseRequest pull;
  pull.set_protocol_version(kProtocolVersion);
  pull.set_table("emb");
  pull.set_dim(2);
  rpc::PullSparseResponse resp;
  s = ps_->PullSparse(&ctx, pull, &resp);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(s.error_message(), HasSubstr("has dim 4, request says 2"));
}

// The server is async here: a restarted worker (incarnation 2, clock back
// at 0) continues at its next clock; its old process is refused.
TEST_F(PsServerTest, RestartedWorkerContinuesAndItsOldIncarnationIsRefused) {
  rpc::PushRequest first = GoodPush({1}, 1.0f);
  first.set_incarnation(1);
  ASSERT_TRUE(Push(first).ok());
  rpc::PushRequest restarted = GoodPush({1}, 1.0f);
  restarted.set_incarnation(2);
  restarted.set_clock(0);
  ASSERT_TRUE(Push(restarted).ok());
  // Applied, not taken for a retry of clock 0.
  EXPECT_EQ(Row(1), (std::vector<float>{-1.0f, -1.0f, -1.0f, -1.0f}));
  rpc::PushRequest old = GoodPush({1}, 1.0f);
  old.set_incarnation(1);
  grpc::Status s = Push(old);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_THAT(s.error_message(),
              HasSubstr("incarnation 1 was replaced by incarnation 2"));
  EXPECT_EQ(Row(1), (std::vector<float>{-1.0f, -1.0f, -1.0f, -1.0f}));
}

TEST_F(PsServerTest, UnknownTableIsNotFound) {
  ApplyOneGoodPush();
  rpc::PushRequest req = GoodPush({2}, 1.0f);
  req.mutable_gradients(0)->set_table("nope");
  grpc::Status s = Push(req);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_THAT(s.error_message(), HasSubstr("unknown table 'nope'"));
  ExpectUnchangedAndServing();
}

// A dense read along a sparse pull (PullSparseRequest.dense_table) is
// checked as a PullDense is, before anything is read.
TEST_F(PsServerTest, ADenseTableAlongASparsePullAndAheadAreChecked) {
  ApplyOneGoodPush();
  rpc::PullSparseRequest pull;
  pull.set_protocol_version(kProtocolVersion);
  pull.set_table("emb");
  pull.set_dim(4);
  pull.set_clock(1);
  AssignBytes<uint64_t>(pull.mutable_keys(), std::vector<uint64_t>{1});
  const auto expect_refused = [&](grpc::StatusCode code,
                                  const std::string& message) {
    grpc::ClientContext ctx;
    rpc::PullSparseResponse resp;
    grpc::Status s = ps_->PullSparse(&ctx, pull, &resp);
    EXPECT_EQ(s.error_code(), code);
    EXPECT_THAT(s.error_message(), HasSubstr(message));
  };
  pull.set_dense_table("nope");
  pull.set_dense_size(3);
  expect_refused(grpc::StatusCode::NOT_FOUND, "unknown dense table 'nope'");
  pull.set_dense_table("dense");
  pull.set_dense_size(5);
  expect_refused(grpc::StatusCode::INVALID_ARGUMENT,
                 "has size 3, request says 5");
  pull.set_dense_size(3);
  pull.set_ahead(2);  // a pull reads one step ahead at most
  expect_refused(grpc::StatusCode::INVALID_ARGUMENT, "ahead 2");
  pull.set_ahead(0);
  grpc::ClientContext ctx;
  rpc::PullSparseResponse resp;
  ASSERT_TRUE(ps_->PullSparse(&ctx, pull, &resp).ok());
  EXPECT_EQ(resp.values().size(), 4 * sizeof(float));
  EXPECT_EQ(resp.dense().offset(), 0u);
  EXPECT_EQ(resp.dense().values().size(), 3 * sizeof(float));
  ExpectUnchangedAndServing();
}

// Through PsClient on two servers: the rows and the dense slices a pull
// brings along are those PullSparse and PullDense bring on their own.
TEST(PsServerPullTest, ADenseTableAlongASparsePullMatchesPullingItAlone) {
  JobConfig config = TwoTableJob();
  config.cluster.ps_endpoints = testing::FreeEndpoints(2);
  config.tables[1].dim = 5;  // slices of 3 and 2
  std::vector<std::unique_ptr<ServerNode>> nodes;
  for (uint32_t rank = 0; rank < 2; ++rank) {
    auto node =
        ServerNode::Start(config, rank, config.cluster.ps_endpoints[rank]);
    ASSERT_TRUE(node.ok()) << node.status();
    nodes.push_back(std::move(*node));
  }
  PsClientOptions options;
  options.endpoints = config.cluster.ps_endpoints;
  auto client = PsClient::Connect(options);
  ASSERT_TRUE(client.ok()) << client.status();
  const std::vector<uint64_t> keys = {1, 2, 3, 4, 5, 6, 7, 8};
  std::vector<float> grads(keys.size() * 4), dense_grads(5);
  for (size_t i = 0; i < grads.size(); ++i) grads[i] = 0.25f * (i % 5);
  for (size_t i = 0; i < dense_grads.size(); ++i) dense_grads[i] = 1.0f + i;
  const TableGrad step[] = {{"emb", keys, grads}, {"dense", {}, dense_grads}};
  ASSERT_TRUE((*client)->Push(step, 1, KeySet::kUnique).ok());

  std::vector<float> rows(keys.size() * 4), dense(5);
  const PsClient::DenseAlong along{"dense", dense};
  ASSERT_TRUE((*client)
                  ->PullSparse("emb", keys, rows, KeySet::kUnique,
                               RowSource::kServers, &along)
                  .ok());
  std::vector<float> alone_rows(rows.size()), alone_dense(5);
  ASSERT_TRUE((*client)->PullSparse("emb", keys, alone_rows).ok());
  ASSERT_TRUE((*client)->PullDense("dense", alone_dense).ok());
  EXPECT_EQ(rows, alone_rows);
  EXPECT_EQ(dense, alone_dense);
  EXPECT_EQ(dense, (std::vector<float>{-0.5f, -1.0f, -1.5f, -2.0f, -2.5f}));
  // With no keys, the dense table still comes.
  std::vector<float> only_dense(5);
  const PsClient::DenseAlong only{"dense", only_dense};
  ASSERT_TRUE((*client)
                  ->PullSparse("emb", {}, {}, KeySet::kUnique,
                               RowSource::kServers, &only)
                  .ok());
  EXPECT_EQ(only_dense, alone_dense);
  // A wrong size or table is refused before anything is sent.
  std::vector<float> short_dense(4);
  const PsClient::DenseAlong wrong{"dense", short_dense};
  EXPECT_EQ((*client)
                ->PullSparse("emb", keys, rows, KeySet::kUnique,
                             RowSource::kServers, &wrong)
                .code(),
            absl::StatusCode::kInvalidArgument);
  const PsClient::DenseAlong unknown{"nope", dense};
  EXPECT_EQ((*client)
                ->PullSparse("emb", keys, rows, KeySet::kUnique,
                             RowSource::kServers, &unknown)
                .code(),
            absl::StatusCode::kNotFound);
}

// Worker ids index per-worker state on the server: one outside the job
// (the job has 1 worker) is refused on every request, and the read-only id
// may pull but not push.
TEST_F(PsServerTest, WorkerIdOutsideTheJobIsInvalidArgument) {
  ApplyOneGoodPush();
  rpc::PushRequest push = GoodPush({2}, 1.0f);
  push.set_worker_id(7);
  grpc::Status s = Push(push);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(s.error_message(),
              HasSubstr("worker_id 7 out of range: the job has 1 workers"));
  push.set_worker_id(kReaderId);
  s = Push(push);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(s.error_message(), HasSubstr("read-only"));
  rpc::PullSparseRequest pull;
  pull.set_protocol_version(kProtocolVersion);
  pull.set_table("emb");
  pull.set_dim(4);
  AssignBytes<uint64_t>(pull.mutable_keys(), std::vector<uint64_t>{1});
  pull.set_worker_id(1u << 30);
  {
    grpc::ClientContext ctx;
    rpc::PullSparseResponse resp;
    s = ps_->PullSparse(&ctx, pull, &resp);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  }
  pull.set_worker_id(kReaderId);
  {
    grpc::ClientContext ctx;
    rpc::PullSparseResponse resp;
    ASSERT_TRUE(ps_->PullSparse(&ctx, pull, &resp).ok());
    EXPECT_EQ(resp.values().size(), 4 * sizeof(float));
  }
  ExpectUnchangedAndServing();
}

TEST_F(PsServerTest, NonFiniteGradientsAreRefusedWhole) {
  ApplyOneGoodPush();
  for (float bad : {std::numeric_limits<float>::quiet_NaN(),
                    std::numeric_limits<float>::infinity(),
                    -std::numeric_limits<float>::infinity()}) {
    // Key 2 is fine, key 3 carries the bad value: neither may be applied.
    rpc::PushRequest req = GoodPush({2, 3}, 1.0f);
    std::string* values = req.mutable_gradients(0)->mutable_values();
    std::memcpy(values->data() + 6 * sizeof(float), &bad, sizeof bad);
    grpc::Status s = Push(req);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
    EXPECT_THAT(s.error_message(), HasSubstr("non-finite gradient"));
    EXPECT_THAT(s.error_message(), HasSubstr("at index 6"));
    ExpectUnchangedAndServing();
  }
}

// A gradient without keys or values (as the wire allows: the fields are
// simply absent) applies nothing and refuses nothing; its empty buffers are
// never read (UBSan found them passed on to memcpy; push_fuzzer).
TEST_F(PsServerTest, AGradientWithoutRowsAppliesNothing) {
  ApplyOneGoodPush();
  rpc::PushRequest req = GoodPush({}, 1.0f);
  ASSERT_TRUE(req.gradients(0).keys().empty());
  ASSERT_TRUE(req.gradients(0).values().empty());
  EXPECT_TRUE(Push(req).ok());
  ExpectUnchangedAndServing();
}

TEST_F(PsServerTest, OversizedRequestIsResourceExhausted) {
  ApplyOneGoodPush();
  std::vector<uint64_t> keys(1001);
  for (size_t i = 0; i < keys.size(); ++i) keys[i] = 100 + i;
  grpc::Status s = Push(GoodPush(keys, 1.0f));
  EXPECT_EQ(s.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_THAT(s.error_message(), HasSubstr("1001 keys, the limit is 1000"));
  ExpectUnchangedAndServing();
}

TEST_F(PsServerTest, KeyCountValueLengthMismatchIsInvalidArgument) {
  ApplyOneGoodPush();
  rpc::PushRequest req = GoodPush({2, 3}, 1.0f);
  req.mutable_gradients(0)->mutable_values()->resize(7 * sizeof(float));
  grpc::Status s = Push(req);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(s.error_message(),
              HasSubstr("2 keys × dim 4 need 8 values, push has 7"));
  ExpectUnchangedAndServing();

  req = GoodPush({2}, 1.0f);
  req.mutable_gradients(0)->mutable_keys()->resize(5);  // not whole keys
  s = Push(req);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(s.error_message(), HasSubstr("not a multiple of 8"));
  ExpectUnchangedAndServing();

  // Dense slice of the wrong length.
  req = GoodPush({2}, 1.0f);
  rpc::TableGradient* g = req.mutable_gradients(0);
  g->set_table("dense");
  g->clear_keys();
  std::vector<float> two(2, 1.0f);
  AssignBytes<float>(g->mutable_values(), two);
  s = Push(req);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(s.error_message(),
              HasSubstr("holds 3 values [0, 3), push has 2"));
  ExpectUnchangedAndServing();
}

// An encoded push: the rows of `keys` (all `value`) with `kind`, and the
// dense slice (0.5, 0, -0.5).
rpc::PushRequest EncodedPush(uint64_t clock, CodecKind kind,
                             const std::vector<uint64_t>& keys, float value) {
  rpc::PushRequest req;
  req.set_protocol_version(kProtocolVersion);
  req.set_worker_id(0);
  req.set_clock(clock);
  req.set_batch_size(1);
  const CodecSpec spec{.kind = kind};
  rpc::TableGradient* g = req.add_gradients();
  g->set_table("emb");
  g->set_dim(4);
  g->set_codec(static_cast<uint32_t>(kind));
  std::vector<float> rows(keys.size() * 4, value);
  EncodeRows(spec, 4, keys, rows, g->mutable_values());
  rpc::TableGradient* d = req.add_gradients();
  d->set_table("dense");
  d->set_codec(static_cast<uint32_t>(kind));
  const std::vector<float> dense = {0.5f, 0.0f, -0.5f};
  EncodeDense(spec, dense, d->mutable_values());
  return req;
}

TEST_F(PsServerTest, EncodedPushesAreDecodedAndApplied) {
  for (CodecKind kind :
       {CodecKind::kFp16, CodecKind::kInt8, CodecKind::kSparseInt8}) {
    SCOPED_TRACE(CodecName(kind));
    ASSERT_TRUE(Push(EncodedPush(clock_++, kind, {5, 6}, 1.0f)).ok());
  }
  // Three pushes of 1.0 (exact in every codec) at sgd lr 0.5.
  EXPECT_EQ(Row(5), (std::vector<float>{-1.5f, -1.5f, -1.5f, -1.5f}));
  EXPECT_EQ(Row(6), (std::vector<float>{-1.5f, -1.5f, -1.5f, -1.5f}));
  std::vector<float> dense(3);
  node_->ps().dense_table("dense")->Pull(dense);
  EXPECT_EQ(dense, (std::vector<float>{-0.75f, 0.0f, 0.75f}));
}

TEST_F(PsServerTest, CorruptEncodedPushesAreRefusedWhole) {
  ApplyOneGoodPush();
  const rpc::PushRequest good =
      EncodedPush(clock_, CodecKind::kInt8, {2, 3}, 1);
  struct Case {
    const char* what;
    std::function<void(rpc::PushRequest&)> corrupt;
    const char* message;
  };
  const Case cases[] = {
      {"truncated rows",
       [](rpc::PushRequest& r) {
         std::string* v = r.mutable_gradients(0)->mutable_values();
         v->resize(v->size() - 1);
       },
       "table 'emb': codec 2 payload"},
      {"truncated dense",
       [](rpc::PushRequest& r) {
         std::string* v = r.mutable_gradients(1)->mutable_values();
         v->resize(v->size() - 3);
       },
       "table 'dense': codec 2 payload"},
      {"bad magic",
       [](rpc::PushRequest& r) {
         (*r.mutable_gradients(0)->mutable_values())[0] = 0;
       },
       "table 'emb': codec 2 payload"},
      {"keys beside a payload",
       [](rpc::PushRequest& r) {
         AssignBytes<uint64_t>(r.mutable_gradients(0)->mutable_keys(),
                               std::vector<uint64_t>{2});
       },
       "carries its keys in its payload"},
      {"raw bytes called int8",
       [](rpc::PushRequest& r) {
         std::vector<float> raw(8, 1.0f);
         AssignBytes<float>(r.mutable_gradients(0)->mutable_values(), raw);
       },
       "table 'emb': codec 2 payload"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.what);
    rpc::PushRequest req = good;
    c.corrupt(req);
    const grpc::Status s = Push(req);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
    EXPECT_THAT(s.error_message(), HasSubstr(c.message));
    ExpectUnchangedAndServing();
  }
}

TEST_F(PsServerTest, ProtocolMismatchIsRefusedAtRegisterAndOnRequests) {
  ApplyOneGoodPush();
  grpc::ClientContext ctx;
  rpc::RegisterRequest reg;
  reg.set_protocol_version(kProtocolVersion + 1);
  reg.set_role(rpc::ROLE_WORKER);
  rpc::RegisterResponse reg_resp;
  grpc::Status s = coord_->Register(&ctx, reg, &reg_resp);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_THAT(s.error_message(), HasSubstr("protocol version mismatch"));

  rpc::PushRequest req = GoodPush({2}, 1.0f);
  req.set_protocol_version(kProtocolVersion + 1);
  s = Push(req);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_THAT(s.error_message(), HasSubstr("protocol version mismatch"));
  ExpectUnchangedAndServing();
}

TEST_F(PsServerTest, SchemaMismatchIsRefusedAtRegister) {
  grpc::ClientContext ctx;
  rpc::RegisterRequest reg;
  reg.set_protocol_version(kProtocolVersion);
  reg.set_role(rpc::ROLE_WORKER);
  for (const TableConfig& t : TwoTableJob().tables) {
    ToSchemaProto(t, reg.add_tables());
  }
  reg.mutable_tables(0)->set_dim(16);
  rpc::RegisterResponse resp;
  grpc::Status s = coord_->Register(&ctx, reg, &resp);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_THAT(s.error_message(), HasSubstr("schema mismatch for 'emb'"));
  EXPECT_THAT(s.error_message(), HasSubstr("dim 16"));
}

TEST(PsServerShardingTest, KeyOfAnotherServerIsRefused) {
  JobConfig config = TwoTableJob();
  config.cluster.ps_endpoints = {"127.0.0.1:1", "127.0.0.1:2"};
  auto server = PsServer::Create(config, 1);
  ASSERT_TRUE(server.ok()) << server.status();
  uint64_t foreign = 0;
  while ((*server)->shard_map().ServerOf(foreign) != 0) ++foreign;
  rpc::PushRequest req;
  req.set_protocol_version(kProtocolVersion);
  req.set_batch_size(1);
  rpc::TableGradient* g = req.add_gradients();
  g->set_table("emb");
  g->set_dim(4);
  AssignBytes<uint64_t>(g->mutable_keys(), std::vector<uint64_t>{foreign});
  AssignBytes<float>(g->mutable_values(), std::vector<float>(4, 1.0f));
  rpc::PushResponse resp;
  grpc::ServerContext ctx;
  grpc::Status s = (*server)->Push(&ctx, &req, &resp);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_THAT(s.error_message(), HasSubstr("belongs to server 0"));
  EXPECT_EQ((*server)->sparse_table("emb")->size(), 0u);
}

// A pull of `keys` of table emb (dim 4) by worker 0 at `clock` (+ `ahead`),
// split by map version `split`.
rpc::PullSparseRequest PullOf(const std::vector<uint64_t>& keys, uint64_t clock,
                              uint64_t split, uint32_t ahead = 0) {
  rpc::PullSparseRequest pull;
  pull.set_protocol_version(kProtocolVersion);
  pull.set_table("emb");
  pull.set_dim(4);
  pull.set_worker_id(0);
  pull.set_clock(clock);
  pull.set_ahead(ahead);
  pull.set_map_version(split);
  AssignBytes<uint64_t>(pull.mutable_keys(), keys);
  return pull;
}

// A push of `worker` at `clock`, split by map version `split`: 1.0 in
// every column of `keys` of table emb (dim 4).
grpc::Status PushOnes(PsServer& server, uint64_t clock, uint64_t split,
                      const std::vector<uint64_t>& keys, uint32_t worker = 0,
                      rpc::PushResponse* answer = nullptr) {
  rpc::PushRequest req;
  req.set_protocol_version(kProtocolVersion);
  req.set_batch_size(1);
  req.set_worker_id(worker);
  req.set_clock(clock);
  req.set_map_version(split);
  rpc::TableGradient* g = req.add_gradients();
  g->set_table("emb");
  g->set_dim(4);
  AssignBytes<uint64_t>(g->mutable_keys(), keys);
  AssignBytes<float>(g->mutable_values(),
                     std::vector<float>(4 * keys.size(), 1.0f));
  rpc::PushResponse resp;
  grpc::ServerContext ctx;
  return server.Push(&ctx, &req, answer != nullptr ? answer : &resp);
}

TEST(PsServerShardingTest, AHandoverRoutesByClockAndRefusesStaleSplitsWhole) {
  JobConfig config = TwoTableJob();
  config.cluster.ps_endpoints = {"127.0.0.1:1", "127.0.0.1:2"};
  auto server = PsServer::Create(config, 1);
  ASSERT_TRUE(server.ok()) << server.status();
  const ShardMap v1 = (*server)->shard_map();
  // A key of server 1's that moves to server 0 from clock 5, and one that
  // stays.
  uint64_t moving = 0;
  while (v1.ServerOf(moving) != 1) ++moving;
  uint64_t staying = moving + 1;
  while (v1.ServerOf(staying) != 1 ||
         v1.BucketOf(staying) == v1.BucketOf(moving)) {
    ++staying;
  }
  auto v2 = v1.WithHandover({{v1.BucketOf(moving), 0}},
                            {{0, {.incarnation = 0, .clock = 5}}});
  ASSERT_TRUE(v2.ok());
  EXPECT_TRUE((*server)->AdoptMap(*v2));
  EXPECT_FALSE((*server)->AdoptMap(v1)) << "an older map";
  EXPECT_EQ((*server)->shard_map().version(), 2u);
  auto push = [&](uint64_t clock, uint64_t split,
                  const std::vector<uint64_t>& keys) {
    return PushOnes(**server, clock, split, keys);
  };
  // Below the handover clock the bucket is still this server's, whatever
  // the split; the answer to the push split by version 1 carries version 2.
  rpc::PushResponse answer;
  EXPECT_TRUE(PushOnes(**server, 4, 1, {moving, staying}, 0, &answer).ok());
  EXPECT_EQ(answer.map_version(), 2u);
  EXPECT_EQ(answer.shard_map().version(), 2u);
  EXPECT_EQ((*server)->sparse_table("emb")->size(), 2u);
  // From clock 5 a v1 split no longer holds: refused whole, nothing
  // applied, even though one key stays here.
  const grpc::Status stale = push(5, 1, {staying});
  EXPECT_EQ(stale.error_code(), grpc::StatusCode::ABORTED);
  EXPECT_THAT(stale.error_message(), HasSubstr("moved"));
  EXPECT_THAT(stale.error_message(), HasSubstr("version 2"));
  // Split by v2: the moved key is server 0's from clock 5 (a client bug to
  // send it here), the other one is served.
  const grpc::Status wrong = push(5, 2, {moving});
  EXPECT_EQ(wrong.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_THAT(wrong.error_message(), HasSubstr("belongs to server 0"));
  EXPECT_TRUE(push(5, 2, {staying}).ok());
  std::vector<float> row(4);
  ASSERT_TRUE((*server)->sparse_table("emb")->Lookup(staying, row));
  // A pull is checked key by key, not by its split (a read resent to a
  // server that served it before changes nothing): the key that stays is
  // served here at clock 6 under either split. The answer to the one split
  // by version 1 carries the map.
  for (uint64_t split : {1, 2}) {
    rpc::PullSparseRequest pull = PullOf({staying}, 6, split);
    PullSparseReply reply;
    grpc::ServerContext ctx;
    EXPECT_TRUE(
        AwaitPullAnswer(**server, &PsServer::PullSparse, &ctx, &pull, &reply)
            .ok())
        << "split " << split;
    const rpc::PullSparseResponse& served = reply.message;
    EXPECT_EQ(served.map_version(), 2u);
    EXPECT_EQ(served.has_shard_map(), split == 1);
    if (split == 1) {
      auto sent = ShardMap::FromProto(served.shard_map());
      ASSERT_TRUE(sent.ok()) << sent.status();
      EXPECT_EQ(sent->version(), 2u);
      EXPECT_EQ(sent->ServerAt(moving, {0, 0, 5}), 0u);
    }
  }
}

// Servers 1 and 0 of TwoTableJob (on two servers) and a key of server 1's
// whose bucket the tests move to server 0.
struct MovingKey {
  std::unique_ptr<PsServer> old_owner;  // server 1
  std::unique_ptr<PsServer> new_owner;  // server 0
  ShardMap v1 = ShardMap::Uniform(1, 1);
  uint64_t key = 0;
  uint32_t bucket = 0;
};

MovingKey ServersAndAMovingKey(ConsistencyMode mode = ConsistencyMode::kAsync,
                               uint32_t workers = 1, int window = 0) {
  JobConfig config = TwoTableJob();
  config.mode = mode;
  config.cluster.workers = workers;
  if (window > 0) {
    config.window = window;
    config.semi_async.adapt_window = false;
  }
  config.cluster.ps_endpoints = {"127.0.0.1:1", "127.0.0.1:2"};
  MovingKey m;
  auto old_owner = PsServer::Create(config, 1);
  auto new_owner = PsServer::Create(config, 0);
  EXPECT_TRUE(old_owner.ok() && new_owner.ok());
  if (!old_owner.ok() || !new_owner.ok()) return m;
  m.old_owner = std::move(*old_owner);
  m.new_owner = std::move(*new_owner);
  m.v1 = m.old_owner->shard_map();
  while (m.v1.ServerOf(m.key) != 1) ++m.key;
  m.bucket = m.v1.BucketOf(m.key);
  return m;
}

// `server`'s HandOver of `bucket`: a copy of its rows, or (`give_up`) no
// rows and its reads refused from then on.
grpc::Status HandOverBucket(PsServer& server, uint32_t bucket,
                            bool give_up = false,
                            rpc::MovedRows* rows = nullptr) {
  rpc::HandOverRequest hand;
  hand.set_protocol_version(kProtocolVersion);
  hand.add_buckets(bucket);
  hand.set_give_up(give_up);
  rpc::MovedRows scratch;
  grpc::ServerContext ctx;
  return server.HandOver(&ctx, &hand, rows != nullptr ? rows : &scratch);
}

// Two pushes of 1.0 to m.key at its old owner (worker 0, clocks 0 and 1),
// then the map that hands its bucket over to server 0 from worker 0's
// clock 2, adopted by both servers.
absl::StatusOr<ShardMap> PushTwiceThenHandOver(MovingKey& m) {
  for (uint64_t clock : {0, 1}) {
    const grpc::Status pushed = PushOnes(*m.old_owner, clock, 1, {m.key});
    if (!pushed.ok()) return absl::InternalError(pushed.error_message());
  }
  auto v2 =
      m.v1.WithHandover({{m.bucket, 0}}, {{0, {.incarnation = 0, .clock = 2}}});
  if (!v2.ok()) return v2.status();
  if (!m.old_owner->AdoptMap(*v2) || !m.new_owner->AdoptMap(*v2)) {
    return absl::InternalError("a server did not adopt the handover map");
  }
  return v2;
}

// A key of m's old owner in another bucket than m.key's: it stays.
uint64_t StayingKey(const MovingKey& m) {
  uint64_t staying = m.key + 1;
  while (m.v1.ServerOf(staying) != 1 || m.v1.BucketOf(staying) == m.bucket) {
    ++staying;
  }
  return staying;
}

// What `pull` reads from `server` (one row), or its refusal.
absl::StatusOr<std::vector<float>> ReadRow(PsServer& server,
                                           const rpc::PullSparseRequest& pull) {
  PullSparseReply got;
  grpc::ServerContext ctx;
  const grpc::Status status =
      AwaitPullAnswer(server, &PsServer::PullSparse, &ctx, &pull, &got);
  if (!status.ok()) {
    return absl::Status(static_cast<absl::StatusCode>(status.error_code()),
                        status.error_message());
  }
  return std::vector<float>(got.rows.data.begin(), got.rows.data.end());
}

// The rows of a handed-over bucket are copied from the old owner with their
// optimizer state to the new one. A push past the cut is answered by the
// new owner at once: its table holds the bucket's gradients until the rows
// arrive and applies them then, before any push that follows. Reads wait
// there until the rows are in, and are served there from then on, before
// the old owner gives the bucket up; the old owner drops its rows as the
// move settles.
TEST(PsServerShardingTest, HandOverAndTakeOverMoveRowsAndApplyHeldPushes) {
  MovingKey m = ServersAndAMovingKey();
  ASSERT_TRUE(m.old_owner && m.new_owner);
  auto& old_owner = m.old_owner;
  auto& new_owner = m.new_owner;
  const uint64_t moving = m.key;
  const uint32_t bucket = m.bucket;
  auto push = [&](PsServer& server, uint64_t clock, uint64_t split) {
    return PushOnes(server, clock, split, {moving});
  };
  // Two pushes before the cut at the old owner, then the handover.
  auto v2 = PushTwiceThenHandOver(m);
  ASSERT_TRUE(v2.ok()) << v2.status();
  std::vector<float> trained(4);
  ASSERT_TRUE(old_owner->sparse_table("emb")->Lookup(moving, trained));
  SparseTable& table = *new_owner->sparse_table("emb");
  // Requests that may wait run off gRPC's threads (RunsInline) while rows
  // are on their way here.
  EXPECT_FALSE(new_owner->RunsInline());
  // Two pushes past the cut: answered, held, no row made.
  ASSERT_TRUE(push(*new_owner, 2, 2).ok());
  ASSERT_TRUE(push(*new_owner, 3, 2).ok());
  EXPECT_EQ(table.size(), 0u);
  EXPECT_EQ(table.held_rows(), 2u);
  // A read waits for the rows (a handler that may not block answers
  // UNAVAILABLE where it would wait).
  auto read_here = [&] {
    PsServer::NoBlockingScope no_blocking;
    rpc::PullSparseRequest pull = PullOf({moving}, 4, 2);
    PullSparseReply got;
    grpc::ServerContext ctx;
    return AwaitPullAnswer(*new_owner, &PsServer::PullSparse, &ctx, &pull,
                           &got);
  };
  EXPECT_EQ(read_here().error_code(), grpc::StatusCode::UNAVAILABLE);

  rpc::MovedRows rows;
  ASSERT_TRUE(HandOverBucket(*old_owner, bucket, false, &rows).ok());
  ASSERT_EQ(rows.tables(0).update_counts_size(), 1);
  EXPECT_EQ(rows.tables(0).update_counts(0), 2u) << "only the pushes before";
  EXPECT_EQ(old_owner->sparse_table("emb")->size(), 1u) << "a copy";
  // Only the pending bucket's, and only from its old owner.
  rpc::HandOverRequest wrong;
  wrong.set_protocol_version(kProtocolVersion);
  wrong.add_buckets(bucket + 1);
  grpc::ServerContext ctx2;
  rpc::MovedRows none;
  EXPECT_EQ(old_owner->HandOver(&ctx2, &wrong, &none).error_code(),
            grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_EQ(new_owner->HandOver(&ctx2, &wrong, &none).error_code(),
            grpc::StatusCode::FAILED_PRECONDITION);

  rpc::TakeOverRequest take;
  take.set_protocol_version(kProtocolVersion);
  *take.mutable_rows() = rows;
  rpc::TakeOverResponse taken;
  grpc::ServerContext ctx3;
  ASSERT_TRUE(new_owner->TakeOver(&ctx3, &take, &taken).ok());
  EXPECT_EQ(taken.rows(), 1u);
  EXPECT_EQ(table.size(), 1u);
  EXPECT_EQ(table.held_rows(), 0u);
  EXPECT_TRUE(new_owner->RunsInline()) << "nothing can wait here now";
  // sgd lr 0.5 (TwoTableJob): the two held pushes of 1.0 on the moved row,
  // and the next push on top of them.
  std::vector<float> row(4);
  ASSERT_TRUE(table.Lookup(moving, row));
  for (int c = 0; c < 4; ++c) EXPECT_EQ(row[c], trained[c] - 1.0f) << c;
  ASSERT_TRUE(push(*new_owner, 4, 2).ok());
  ASSERT_TRUE(table.Lookup(moving, row));
  for (int c = 0; c < 4; ++c) EXPECT_EQ(row[c], trained[c] - 1.5f) << c;
  // Read before the old owner gave the bucket up, with every push in it.
  EXPECT_TRUE(read_here().ok());
  auto arrived = ReadRow(*new_owner, PullOf({moving}, 5, 2));
  ASSERT_TRUE(arrived.ok()) << arrived.status();
  EXPECT_EQ(*arrived, row);
  // A TakeOver made again installs nothing over the row.
  ASSERT_TRUE(new_owner->TakeOver(&ctx3, &take, &taken).ok());
  EXPECT_EQ(taken.rows(), 0u);

  ASSERT_TRUE(HandOverBucket(*old_owner, bucket, /*give_up=*/true).ok());
  // A late request before the cut finds the bucket given up: refused as
  // moved, not applied to the rows left here.
  EXPECT_EQ(push(*old_owner, 1, 2).error_code(), grpc::StatusCode::ABORTED);
  const ShardMap v3 = v2->Settled({bucket});
  ASSERT_TRUE(new_owner->AdoptMap(v3));
  auto settled = ReadRow(*new_owner, PullOf({moving}, 5, 3));
  ASSERT_TRUE(settled.ok()) << settled.status();
  EXPECT_EQ(*settled, row);
  EXPECT_EQ(old_owner->sparse_table("emb")->size(), 1u);
  ASSERT_TRUE(old_owner->AdoptMap(v3));
  EXPECT_EQ(old_owner->sparse_table("emb")->size(), 0u) << "dropped";
}


// A read past the cut of a bucket being handed over does not wait for its
// rows at the new owner: its old owner serves it until it gives the bucket
// up (async and semi_async read what was applied; the new owner applies
// nothing of it before), the copy of the rows made for the new owner
// included, and refuses it as moved after.
TEST(PsServerShardingTest,
     ReadsPastTheCutAreServedByTheOldOwnerUntilItGivesUp) {
  MovingKey m = ServersAndAMovingKey();
  ASSERT_TRUE(m.old_owner && m.new_owner);
  PsServer& old_owner = *m.old_owner;
  auto v2 = PushTwiceThenHandOver(m);
  ASSERT_TRUE(v2.ok()) << v2.status();
  EXPECT_EQ(v2->ReaderOf(m.key), 1u);
  EXPECT_EQ(v2->ServerAt(m.key, {0, 0, 5}), 0u);
  // Two steps of sgd lr 0.5 on 1.0 from zero: -1 in every column, under
  // the handover's split and the one before it.
  for (uint64_t split : {1, 2}) {
    auto row = ReadRow(old_owner, PullOf({m.key}, 5, split));
    ASSERT_TRUE(row.ok()) << row.status();
    EXPECT_EQ(*row, std::vector<float>(4, -1.0f)) << "split " << split;
  }

  ASSERT_TRUE(HandOverBucket(old_owner, m.bucket).ok());
  auto copied = ReadRow(old_owner, PullOf({m.key}, 5, 2));
  ASSERT_TRUE(copied.ok()) << copied.status();
  EXPECT_EQ(*copied, std::vector<float>(4, -1.0f));

  ASSERT_TRUE(HandOverBucket(old_owner, m.bucket, /*give_up=*/true).ok());
  auto gone = ReadRow(old_owner, PullOf({m.key}, 5, 2));
  EXPECT_TRUE(IsMovedError(gone.status())) << gone.status();
  EXPECT_THAT(gone.status().message(), HasSubstr("handed over to server 0"));
  EXPECT_EQ(old_owner.sparse_table("emb")->size(), 1u);
  ASSERT_TRUE(old_owner.AdoptMap(v2->Settled({m.bucket})));
  EXPECT_EQ(old_owner.sparse_table("emb")->size(), 0u);
}

// PrepareMove(hold) holds a worker's requests from `hold_ahead` clocks past
// the newest seen (the mover puts the cut there), until the next map; the
// ones before go on. A peer cannot push the hold point past the clock bits.
TEST(PsServerShardingTest, PrepareMoveHoldsRequestsFromHoldAheadClocksOn) {
  MovingKey m = ServersAndAMovingKey();
  ASSERT_TRUE(m.old_owner);
  PsServer& server = *m.old_owner;
  ASSERT_TRUE(PushOnes(server, 5, 1, {m.key}).ok());
  auto prepare = [&](bool hold, uint32_t ahead, rpc::PrepareMoveResponse* seen) {
    rpc::PrepareMoveRequest request;
    request.set_protocol_version(kProtocolVersion);
    request.set_hold(hold);
    request.set_hold_ahead(ahead);
    grpc::ServerContext ctx;
    return server.PrepareMove(&ctx, &request, seen);
  };
  rpc::PrepareMoveResponse seen;
  EXPECT_EQ(prepare(true, kMaxHoldAhead + 1, &seen).error_code(),
            grpc::StatusCode::INVALID_ARGUMENT);
  ASSERT_TRUE(prepare(true, 2, &seen).ok());
  ASSERT_EQ(seen.seen_size(), 1);
  EXPECT_EQ(seen.seen(0).clock(), 5u);
  EXPECT_EQ(seen.seen(0).map_version(), 1u);  // the push's split
  // The map comes with the hold only (the mover's reports poll).
  EXPECT_EQ(seen.shard_map().version(), m.v1.version());
  EXPECT_EQ(seen.shard_map().bucket_owner_size(),
            static_cast<int>(m.v1.num_buckets()));
  // Clocks 6 and 7 lie before a cut at 8 at the earliest: not held.
  EXPECT_TRUE(PushOnes(server, 6, 1, {m.key}).ok());
  EXPECT_TRUE(PushOnes(server, 7, 1, {m.key}).ok());
  std::atomic<bool> pushed{false};
  grpc::Status held;
  std::thread pusher([&] {
    held = PushOnes(server, 8, 1, {m.key});
    pushed = true;
  });
  auto seen_at = [&](uint64_t clock) {
    rpc::PrepareMoveResponse report;
    EXPECT_TRUE(prepare(false, 0, &report).ok());
    EXPECT_FALSE(report.has_shard_map());
    return report.seen_size() == 1 && report.seen(0).clock() == clock;
  };
  ASSERT_TRUE(testing::WaitFor([&] { return seen_at(8); }));
  EXPECT_FALSE(pushed.load()) << "clock 8 not held";
  // The next map answers it: split by the map before, it is refused whole
  // for the client to split again.
  ASSERT_TRUE(server.AdoptMap(m.v1.WithOwners({})));
  pusher.join();
  EXPECT_EQ(held.error_code(), grpc::StatusCode::ABORTED);
  EXPECT_THAT(held.error_message(), HasSubstr(kMovedPrefix));
}

// An async read may be served by whoever holds the rows, past the cut as
// before it: a move being prepared holds a worker's pushes from the hold
// point on, and its reads only in sync and semi_async, whose old owners
// serve a read only up to the cut (plus the window).
TEST(PsServerShardingTest, PrepareMoveHoldsAsyncPushesButNotAsyncReads) {
  for (ConsistencyMode mode :
       {ConsistencyMode::kAsync, ConsistencyMode::kSemiAsync,
        ConsistencyMode::kSync}) {
    SCOPED_TRACE(ConsistencyModeName(mode));
    MovingKey m = ServersAndAMovingKey(mode, /*workers=*/1, /*window=*/2);
    ASSERT_TRUE(m.old_owner);
    PsServer& server = *m.old_owner;
    ASSERT_TRUE(PushOnes(server, 0, 1, {m.key}).ok());
    ASSERT_TRUE(PushOnes(server, 1, 1, {m.key}).ok());
    std::vector<float> trained(4);
    ASSERT_TRUE(server.sparse_table("emb")->Lookup(m.key, trained));
    rpc::PrepareMoveRequest request;
    request.set_protocol_version(kProtocolVersion);
    request.set_hold(true);
    rpc::PrepareMoveResponse seen;
    grpc::ServerContext ctx;
    ASSERT_TRUE(server.PrepareMove(&ctx, &request, &seen).ok());
    // Clock 2 is the hold point. Where it would wait, a handler that may
    // not block answers UNAVAILABLE.
    PsServer::NoBlockingScope no_blocking;
    EXPECT_EQ(PushOnes(server, 2, 1, {m.key}).error_code(),
              grpc::StatusCode::UNAVAILABLE);
    auto row = ReadRow(server, PullOf({m.key}, 2, 1));
    if (mode == ConsistencyMode::kAsync) {
      ASSERT_TRUE(row.ok()) << row.status();
      EXPECT_EQ(*row, trained);
    } else {
      EXPECT_EQ(row.status().code(), absl::StatusCode::kUnavailable)
          << row.status();
    }
  }
}

// In sync a read at clock c must see every push before c: its old owner
// serves it past the cut only while those all came before the cut (c at
// most the cut, `ahead` counted). A read that waited for its round is
// checked again when the round lets it through: once the bucket is given
// up, refused.
TEST(PsServerShardingTest, SyncReadsAtTheOldOwnerStopAtTheCut) {
  MovingKey m = ServersAndAMovingKey(ConsistencyMode::kSync, /*workers=*/2);
  ASSERT_TRUE(m.old_owner && m.new_owner);
  PsServer& old_owner = *m.old_owner;
  const uint64_t staying = StayingKey(m);
  for (uint64_t clock : {0, 1}) {
    for (uint32_t worker : {0, 1}) {
      ASSERT_TRUE(PushOnes(old_owner, clock, 1, {m.key}, worker).ok());
    }
  }
  std::vector<float> trained(4);
  ASSERT_TRUE(old_owner.sparse_table("emb")->Lookup(m.key, trained));
  const ShardMap::WorkerCut cut{.incarnation = 0, .clock = 3};
  auto v2 = m.v1.WithHandover({{m.bucket, 0}}, {{0, cut}, {1, cut}});
  ASSERT_TRUE(v2.ok());
  ASSERT_TRUE(old_owner.AdoptMap(*v2));
  ASSERT_TRUE(m.new_owner->AdoptMap(*v2));
  using ClockAhead = std::pair<uint64_t, uint32_t>;
  for (const auto& [clock, ahead] : std::vector<ClockAhead>{{2, 0}, {1, 1}}) {
    auto row = ReadRow(old_owner, PullOf({m.key}, clock, 2, ahead));
    ASSERT_TRUE(row.ok()) << row.status();
    EXPECT_EQ(*row, trained) << clock << "+" << ahead;
  }
  for (const auto& [clock, ahead] : std::vector<ClockAhead>{{4, 0}, {3, 1}}) {
    auto late = ReadRow(old_owner, PullOf({m.key}, clock, 2, ahead));
    EXPECT_TRUE(IsMovedError(late.status())) << late.status();
    EXPECT_THAT(late.status().message(), HasSubstr("must see pushes"));
  }

  // Worker 0 at the cut (clock 3) reads, waiting for worker 1's push of
  // round 2; the rows leave meanwhile.
  ASSERT_TRUE(PushOnes(old_owner, 2, 2, {staying}, 0).ok());
  const uint64_t pulls = old_owner.aggregator_stats().pulls();
  absl::StatusOr<std::vector<float>> waited;
  std::thread reader(
      [&] { waited = ReadRow(old_owner, PullOf({m.key}, 3, 2)); });
  ASSERT_TRUE(testing::WaitFor(
      [&] { return old_owner.aggregator_stats().pulls() > pulls; }));
  ASSERT_TRUE(HandOverBucket(old_owner, m.bucket).ok());
  ASSERT_TRUE(HandOverBucket(old_owner, m.bucket, /*give_up=*/true).ok());
  ASSERT_TRUE(PushOnes(old_owner, 2, 2, {staying}, 1).ok());
  reader.join();
  EXPECT_TRUE(IsMovedError(waited.status())) << waited.status();
  EXPECT_THAT(waited.status().message(), HasSubstr("as it was read here"));
  std::vector<float> row(4);
  ASSERT_TRUE(old_owner.sparse_table("emb")->Lookup(m.key, row));
  EXPECT_EQ(row, trained);
  ASSERT_TRUE(old_owner.AdoptMap(v2->Settled({m.bucket})));
  EXPECT_FALSE(old_owner.sparse_table("emb")->Lookup(m.key, row))
      << "rows of a bucket that moved away kept";
}

// In semi_async the pushes past the cut go to the new owner, which holds
// them until the rows arrive, so a read at the old owner misses them: it is
// served there only while the bound lets a read miss them — its clock at
// most the cut plus the window — and refused past that (read at the new
// owner, once the move settles).
TEST(PsServerShardingTest, SemiAsyncReadsAtTheOldOwnerStopAWindowPastTheCut) {
  MovingKey m = ServersAndAMovingKey(ConsistencyMode::kSemiAsync,
                                     /*workers=*/1, /*window=*/2);
  ASSERT_TRUE(m.old_owner && m.new_owner);
  PsServer& old_owner = *m.old_owner;
  const uint64_t staying = StayingKey(m);
  auto v2 = PushTwiceThenHandOver(m);
  ASSERT_TRUE(v2.ok()) << v2.status();
  const auto before = ReadRow(old_owner, PullOf({m.key}, 2, 2));
  ASSERT_TRUE(before.ok()) << before.status();
  // The worker goes on: the moving key's pushes to the new owner (held
  // there), the other key's here.
  for (uint64_t clock : {2, 3, 4}) {
    ASSERT_TRUE(PushOnes(*m.new_owner, clock, 2, {m.key}).ok()) << clock;
    ASSERT_TRUE(PushOnes(old_owner, clock, 2, {staying}).ok()) << clock;
  }
  EXPECT_EQ(m.new_owner->sparse_table("emb")->size(), 0u);
  // Clocks 3 and 4 (the cut 2 plus the window 2) are served, the row as it
  // was at the cut.
  for (uint64_t clock : {3, 4}) {
    auto row = ReadRow(old_owner, PullOf({m.key}, clock, 2));
    ASSERT_TRUE(row.ok()) << clock << ": " << row.status();
    EXPECT_EQ(*row, *before) << clock;
  }
  // Clock 5, or 4 reading one ahead, must see the push of clock 2.
  using ClockAhead = std::pair<uint64_t, uint32_t>;
  for (const auto& [clock, ahead] : std::vector<ClockAhead>{{5, 0}, {4, 1}}) {
    auto late = ReadRow(old_owner, PullOf({m.key}, clock, 2, ahead));
    EXPECT_TRUE(IsMovedError(late.status())) << late.status();
    EXPECT_THAT(late.status().message(), HasSubstr("must see pushes"));
  }
}

// Every call of a move may come twice (its reply lost), and a mover that
// took over an open handover makes them again: a repeated HandOver answers
// the same rows (given up or not), a repeated give-up changes nothing, and
// a repeated TakeOver installs nothing over rows that arrived — not the
// older rows of an old owner restored from its checkpoint either.
TEST(PsServerShardingTest, RepeatedHandOverAndTakeOverChangeNothing) {
  MovingKey m = ServersAndAMovingKey();
  ASSERT_TRUE(m.old_owner && m.new_owner);
  auto& old_owner = m.old_owner;
  auto& new_owner = m.new_owner;
  const ShardMap& v1 = m.v1;
  const uint64_t moving = m.key;
  const uint32_t bucket = m.bucket;
  ASSERT_TRUE(PushOnes(*old_owner, 0, 1, {moving}).ok());
  auto v2 =
      v1.WithHandover({{bucket, 0}}, {{0, {.incarnation = 0, .clock = 1}}});
  ASSERT_TRUE(v2.ok());
  ASSERT_TRUE(old_owner->AdoptMap(*v2));
  ASSERT_TRUE(new_owner->AdoptMap(*v2));

  rpc::MovedRows first, again, given_up;
  ASSERT_TRUE(HandOverBucket(*old_owner, bucket, false, &first).ok());
  ASSERT_TRUE(HandOverBucket(*old_owner, bucket, false, &again).ok());
  ASSERT_EQ(first.tables(0).update_counts_size(), 1);
  EXPECT_EQ(again.SerializeAsString(), first.SerializeAsString());

  rpc::TakeOverRequest take;
  take.set_protocol_version(kProtocolVersion);
  *take.mutable_rows() = first;
  rpc::TakeOverResponse taken;
  grpc::ServerContext ctx3, ctx4;
  ASSERT_TRUE(new_owner->TakeOver(&ctx3, &take, &taken).ok());
  EXPECT_EQ(taken.rows(), 1u);
  ASSERT_TRUE(HandOverBucket(*old_owner, bucket, /*give_up=*/true).ok());
  ASSERT_TRUE(HandOverBucket(*old_owner, bucket, /*give_up=*/true).ok());
  ASSERT_TRUE(HandOverBucket(*old_owner, bucket, false, &given_up).ok());
  EXPECT_EQ(given_up.SerializeAsString(), first.SerializeAsString());

  // Rows as a checkpoint from before the push would have them: all zero.
  rpc::TakeOverRequest older = take;
  rpc::MovedTable* table = older.mutable_rows()->mutable_tables(0);
  table->set_weights(std::string(table->weights().size(), '\0'));
  table->set_update_counts(0, 0);
  ASSERT_TRUE(new_owner->TakeOver(&ctx4, &older, &taken).ok());
  EXPECT_EQ(taken.rows(), 0u);
  std::vector<float> row(4);
  ASSERT_TRUE(new_owner->sparse_table("emb")->Lookup(moving, row));
  EXPECT_EQ(row, std::vector<float>(4, -0.5f));

  // Settled, the new owner trains it: sgd lr 0.5 (TwoTableJob), two pushes
  // of 1.0, one at each owner.
  const ShardMap v3 = v2->Settled({bucket});
  ASSERT_TRUE(new_owner->AdoptMap(v3));
  ASSERT_TRUE(old_owner->AdoptMap(v3));
  ASSERT_TRUE(PushOnes(*new_owner, 1, 3, {moving}).ok());
  ASSERT_TRUE(new_owner->sparse_table("emb")->Lookup(moving, row));
  EXPECT_EQ(row, std::vector<float>(4, -1.0f));
  EXPECT_EQ(old_owner->sparse_table("emb")->size(), 0u);
}

}  // namespace
}  // namespace hetps
