// Bad input against a real server on loopback: every malformed request gets
// its specific code and message, the tables stay unchanged, and the server
// keeps serving.
#include "server/ps_server.h"

#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <limits>

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
    auto channel = MakeChannel("127.0.0.1:" + std::to_string(node_->port()),
                               64 << 20, Credentials());
    ps_ = rpc::ParameterServer::NewStub(channel);
    coord_ = rpc::Coordinator::NewStub(channel);
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
  std::unique_ptr<rpc::ParameterServer::Stub> ps_;
  std::unique_ptr<rpc::Coordinator::Stub> coord_;
  uint64_t clock_ = 0;
};

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

}  // namespace
}  // namespace hetps
