// Authentication against a real server on loopback (common/channel.h):
// calls without the job's token, with another token, in plaintext against a
// TLS server, or without a client certificate against a mutual-TLS server
// are refused with their specific code, and the tables stay exactly as they
// were; calls with the right credentials work.
#include <gtest/gtest.h>

#include <fstream>
#include <sstream>

#include "common/bytes.h"
#include "common/channel.h"
#include "hetps.grpc.pb.h"
#include "hetps/version.h"
#include "node/server_node.h"
#include "support/test_support.h"

namespace hetps {
namespace {

using ::hetps::testing::SourcePath;
using ::hetps::testing::StatusIs;
using ::testing::HasSubstr;
using ::testing::Not;

constexpr char kToken[] = "s3cret-job-token";
constexpr char kOtherToken[] = "an0ther-token";

std::string ReadTestPem(const std::string& name) {
  std::ifstream in(SourcePath("tests/data/tls/" + name));
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

Credentials WithToken(const std::string& token) {
  Credentials c;
  c.token = token;
  return c;
}

// What servers hold for TLS; a client needs only ca_pem (and, for mutual
// TLS, its own pair), but holding the server pair too is harmless and is
// what every process of a job holds.
Credentials Tls() {
  Credentials c;
  c.ca_pem = ReadTestPem("ca.pem");
  c.cert_pem = ReadTestPem("server.pem");
  c.key_pem = ReadTestPem("server.key");
  return c;
}

Credentials MutualTls() {
  Credentials c = Tls();
  c.require_client_cert = true;
  c.client_cert_pem = ReadTestPem("client.pem");
  c.client_key_pem = ReadTestPem("client.key");
  return c;
}

JobConfig OneTableJob(const Credentials& credentials) {
  JobConfig config;
  config.mode = ConsistencyMode::kAsync;
  config.cluster.ps_endpoints = {"127.0.0.1:1"};  // rank 0 is this process
  config.cluster.workers = 1;
  TableConfig emb;
  emb.name = "emb";
  emb.dim = 2;
  emb.optimizer.type = "sgd";
  emb.optimizer.learning_rate = 0.5f;
  emb.init.type = "zero";
  config.tables = {emb};
  config.credentials = credentials;
  return config;
}

class AuthTest : public ::testing::Test {
 protected:
  void Start(const Credentials& server) {
    auto node = ServerNode::Start(OneTableJob(server), 0, "127.0.0.1:0");
    ASSERT_TRUE(node.ok()) << node.status();
    node_ = std::move(*node);
  }

  std::shared_ptr<grpc::Channel> Channel(const Credentials& client) {
    return MakeChannel("127.0.0.1:" + std::to_string(node_->port()), 1 << 20,
                       client);
  }

  // Pushes gradient `value` for `keys` (one row each) as worker 0.
  grpc::Status Push(const Credentials& client, std::vector<uint64_t> keys,
                    float value) {
    rpc::PushRequest req;
    req.set_protocol_version(kProtocolVersion);
    req.set_clock(clock_++);
    req.set_batch_size(1);
    rpc::TableGradient* g = req.add_gradients();
    g->set_table("emb");
    g->set_dim(2);
    AssignBytes<uint64_t>(g->mutable_keys(), keys);
    std::vector<float> values(keys.size() * 2, value);
    AssignBytes<float>(g->mutable_values(), values);
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() +
                     std::chrono::seconds(5));
    rpc::PushResponse resp;
    return rpc::ParameterServer::NewStub(Channel(client))
        ->Push(&ctx, req, &resp);
  }

  // The rows of `keys`, or the refusal.
  absl::StatusOr<std::vector<float>> Pull(const Credentials& client,
                                          std::vector<uint64_t> keys) {
    rpc::PullSparseRequest req;
    req.set_protocol_version(kProtocolVersion);
    req.set_table("emb");
    req.set_dim(2);
    AssignBytes<uint64_t>(req.mutable_keys(), keys);
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() +
                     std::chrono::seconds(5));
    rpc::PullSparseResponse resp;
    grpc::Status s = rpc::ParameterServer::NewStub(Channel(client))
                         ->PullSparse(&ctx, req, &resp);
    if (!s.ok()) {
      return absl::Status(static_cast<absl::StatusCode>(s.error_code()),
                          s.error_message());
    }
    std::vector<float> scratch;
    std::span<const float> v = ViewAs<float>(resp.values(), scratch);
    return std::vector<float>(v.begin(), v.end());
  }

  // The state after one good push of 1.0 to key 1 (sgd, rate 0.5, zero
  // init): exactly one row, -0.5 everywhere, as read by a good client.
  void ExpectOnlyTheGoodPush(const Credentials& good) {
    EXPECT_EQ(node_->ps().sparse_table("emb")->size(), 1u);
    auto rows = Pull(good, {1});
    ASSERT_TRUE(rows.ok()) << rows.status();
    EXPECT_EQ(*rows, (std::vector<float>{-0.5f, -0.5f}));
  }

  std::unique_ptr<ServerNode> node_;
  uint64_t clock_ = 0;
};

TEST_F(AuthTest, RightTokenPushesAndPulls) {
  Start(WithToken(kToken));
  ASSERT_TRUE(Push(WithToken(kToken), {1}, 1.0f).ok());
  ExpectOnlyTheGoodPush(WithToken(kToken));
}

TEST_F(AuthTest, MissingTokenIsUnauthenticatedAndChangesNothing) {
  Start(WithToken(kToken));
  ASSERT_TRUE(Push(WithToken(kToken), {1}, 1.0f).ok());

  grpc::Status s = Push(Credentials(), {1, 2}, 4.0f);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_THAT(s.error_message(), HasSubstr("missing token"));
  // A refused pull creates no rows either.
  EXPECT_THAT(
      Pull(Credentials(), {3}),
      StatusIs(absl::StatusCode::kUnauthenticated, HasSubstr("missing token")));
  ExpectOnlyTheGoodPush(WithToken(kToken));
}

TEST_F(AuthTest, WrongTokenIsUnauthenticatedAndChangesNothing) {
  Start(WithToken(kToken));
  ASSERT_TRUE(Push(WithToken(kToken), {1}, 1.0f).ok());

  grpc::Status s = Push(WithToken(kOtherToken), {1, 2}, 4.0f);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_EQ(s.error_message(), "wrong token");
  // A prefix of the right token is as wrong as any other.
  s = Push(WithToken(std::string(kToken).substr(0, 5)), {1}, 4.0f);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_THAT(s.error_message(),
              Not(HasSubstr(std::string(kToken).substr(0, 5))));
  EXPECT_THAT(Pull(WithToken(kOtherToken), {3}),
              StatusIs(absl::StatusCode::kUnauthenticated,
                       Not(HasSubstr(kOtherToken))));
  ExpectOnlyTheGoodPush(WithToken(kToken));
}

TEST_F(AuthTest, CoordinatorCallsNeedTheTokenToo) {
  Start(WithToken(kToken));
  auto coordinator = [&](const Credentials& client) {
    return rpc::Coordinator::NewStub(Channel(client));
  };
  for (const Credentials& bad : {Credentials(), WithToken(kOtherToken)}) {
    grpc::ClientContext register_ctx;
    rpc::RegisterRequest reg;
    reg.set_protocol_version(kProtocolVersion);
    reg.set_role(rpc::ROLE_WORKER);
    rpc::RegisterResponse reg_resp;
    EXPECT_EQ(
        coordinator(bad)->Register(&register_ctx, reg, &reg_resp).error_code(),
        grpc::StatusCode::UNAUTHENTICATED);

    grpc::ClientContext heartbeat_ctx;
    rpc::HeartbeatRequest beat;
    beat.set_protocol_version(kProtocolVersion);
    beat.set_role(rpc::ROLE_WORKER);
    beat.mutable_progress()->set_clock(100);
    rpc::HeartbeatResponse beat_resp;
    EXPECT_EQ(coordinator(bad)
                  ->Heartbeat(&heartbeat_ctx, beat, &beat_resp)
                  .error_code(),
              grpc::StatusCode::UNAUTHENTICATED);

    grpc::ClientContext status_ctx;
    rpc::StatusRequest status;
    status.set_protocol_version(kProtocolVersion);
    rpc::StatusResponse status_resp;
    EXPECT_EQ(coordinator(bad)
                  ->GetStatus(&status_ctx, status, &status_resp)
                  .error_code(),
              grpc::StatusCode::UNAUTHENTICATED);
  }
  // Nothing registered or beat: worker 0 is as it started.
  grpc::ClientContext ctx;
  rpc::StatusRequest req;
  req.set_protocol_version(kProtocolVersion);
  rpc::StatusResponse resp;
  ASSERT_TRUE(coordinator(WithToken(kToken))->GetStatus(&ctx, req, &resp).ok());
  ASSERT_EQ(resp.workers_size(), 1);
  EXPECT_EQ(resp.workers(0).progress().clock(), 0u);
}

TEST_F(AuthTest, PlaintextClientIsRefusedByTlsServer) {
  Start(Tls());
  ASSERT_TRUE(Push(Tls(), {1}, 1.0f).ok());

  // The handshake fails: no call reaches the server.
  grpc::Status s = Push(Credentials(), {1, 2}, 4.0f);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::UNAVAILABLE);
  EXPECT_THAT(Pull(Credentials(), {3}),
              StatusIs(absl::StatusCode::kUnavailable, ::testing::_));
  ExpectOnlyTheGoodPush(Tls());
}

TEST_F(AuthTest, MutualTlsServerRefusesClientWithoutCertificate) {
  Start(MutualTls());
  ASSERT_TRUE(Push(MutualTls(), {1}, 1.0f).ok());

  grpc::Status s = Push(Tls(), {1, 2}, 4.0f);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::UNAVAILABLE);
  EXPECT_EQ(Push(Credentials(), {1, 2}, 4.0f).error_code(),
            grpc::StatusCode::UNAVAILABLE);
  ExpectOnlyTheGoodPush(MutualTls());
}

TEST_F(AuthTest, TlsAndTokenTogetherNeedBoth) {
  Credentials both = Tls();
  both.token = kToken;
  Start(both);
  ASSERT_TRUE(Push(both, {1}, 1.0f).ok());

  grpc::Status s = Push(Tls(), {1, 2}, 4.0f);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_THAT(s.error_message(), HasSubstr("missing token"));
  EXPECT_EQ(Push(WithToken(kToken), {1, 2}, 4.0f).error_code(),
            grpc::StatusCode::UNAVAILABLE);
  ExpectOnlyTheGoodPush(both);
}

}  // namespace
}  // namespace hetps
