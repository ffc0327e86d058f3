// Push and PullSparse on a client's TensorStream (common/tensor_calls.h,
// server/ps_service.h), against a server of this process: small calls
// share one stream and are answered as they are ready, large ones take the
// unary methods, an async push answered before its apply is still met by
// its worker's next read, a call past its deadline fails alone, a stream
// that ends is opened again by the next call, and frames that are not
// calls are answered with an error, or end their stream, not the server.
#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include <numeric>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "client/ps_client_factory.h"
#include "common/channel.h"
#include "common/tensor_calls.h"
#include "hetps.grpc.pb.h"
#include "server/ps_server.h"
#include "server/ps_service.h"
#include "support/test_support.h"

namespace hetps {
namespace {

using ::testing::HasSubstr;
using testing::OneTableJob;

class TensorStreamTest : public ::testing::Test {
 protected:
  void TearDown() override {
    client_.reset();
    Stop();
  }

  // Serves a fresh server of `mode` on `port` (0: a free one).
  void Serve(ConsistencyMode mode, int port = 0) {
    Serve(OneTableJob(mode), port);
  }
  void Serve(const JobConfig& config, int port = 0) {
    auto ps = PsServer::Create(config, 0);
    ASSERT_TRUE(ps.ok()) << ps.status();
    ps_ = std::move(*ps);
    service_ = std::make_unique<PsService>(ps_.get());
    grpc::ServerBuilder builder;
    builder.AddListeningPort("127.0.0.1:" + std::to_string(port),
                             grpc::InsecureServerCredentials(), &port_);
    builder.RegisterService(service_.get());
    server_ = builder.BuildAndStart();
    ASSERT_NE(server_, nullptr);
  }

  // Shuts the server down as a ServerNode does. Its Shutdown has no
  // deadline: a stream left open would hold it (and the test) forever.
  void Stop() {
    if (!server_) return;
    service_->CloseStreams();
    server_->Shutdown();
    server_.reset();
    service_.reset();
    ps_.reset();
  }

  std::string Endpoint() const { return "127.0.0.1:" + std::to_string(port_); }

  void Connect() {
    PsClientOptions options;
    options.endpoints = {Endpoint()};
    options.worker_id = 0;
    options.rpc.initial_backoff_s = 0.01;
    options.rpc.max_backoff_s = 0.1;
    options.rpc.connect_deadline_s = 10;
    options.rpc.rpc_timeout_s = rpc_timeout_s_;
    auto client = PsClientFactory::Connect(
        options, Clock::Real(), GrpcPsClientStubs(64 << 20, Credentials()));
    ASSERT_TRUE(client.ok()) << client.status();
    client_ = std::move(*client);
  }

  // Pushes the gradient {k, 10 k} for each key k.
  absl::Status PushKeys(std::span<const uint64_t> keys) {
    std::vector<float> grad;
    for (uint64_t k : keys) {
      grad.push_back(static_cast<float>(k));
      grad.push_back(10.0f * static_cast<float>(k));
    }
    const TableGrad grads[] = {{"emb", keys, grad}};
    return client_->Push(grads, 1);
  }

  // `for_push`: PsClient::PullSparse's.
  absl::Status Pull(std::span<const uint64_t> keys, std::vector<float>& rows,
                    std::optional<uint64_t> for_push = std::nullopt) {
    rows.assign(keys.size() * 2, 7.0f);
    return client_->PullSparse("emb", keys, rows, KeySet::kUnique,
                               RowSource::kServers, nullptr, for_push);
  }

  double rpc_timeout_s_ = 60;
  std::unique_ptr<PsServer> ps_;
  std::unique_ptr<PsService> service_;
  std::unique_ptr<grpc::Server> server_;
  int port_ = 0;
  std::unique_ptr<PsClient> client_;
};

TEST_F(TensorStreamTest, SmallCallsShareOneStreamAndLargeOnesGoUnary) {
  Serve(ConsistencyMode::kAsync);
  Connect();
  const std::vector<uint64_t> keys = {1, 2, 3};
  ASSERT_TRUE(PushKeys(keys).ok());
  std::vector<float> rows;
  ASSERT_TRUE(Pull(keys, rows).ok());
  EXPECT_EQ(rows, (std::vector<float>{-1, -10, -2, -20, -3, -30}));
  EXPECT_EQ(service_->open_streams(), 1u);
  EXPECT_EQ(service_->stream_calls(), 2u);

  // Keys and rows of just over the stream's bound each way.
  std::vector<uint64_t> many(kStreamMaxTensorBytes / sizeof(uint64_t) + 1);
  std::iota(many.begin(), many.end(), 1);
  ASSERT_TRUE(Pull(many, rows).ok());
  for (size_t i = 0; i < many.size(); ++i) {
    const float expected = many[i] <= 3 ? -static_cast<float>(many[i]) : 0.0f;
    ASSERT_EQ(rows[2 * i], expected) << "key " << many[i];
    ASSERT_EQ(rows[2 * i + 1], 10 * expected) << "key " << many[i];
  }
  ASSERT_TRUE(PushKeys(many).ok());
  EXPECT_EQ(service_->stream_calls(), 2u);
  ASSERT_TRUE(Pull(keys, rows).ok());
  EXPECT_EQ(rows, (std::vector<float>{-2, -20, -4, -40, -6, -60}));
  EXPECT_EQ(service_->stream_calls(), 3u);
}

// An async push on the stream is answered before its apply ends
// (PsService::HandlePush); the worker's next read, here a unary PullDense
// on another of gRPC's threads while the push's sparse rows are still being
// applied, meets all of it (the aggregator holds that worker's pulls until
// the apply ends).
TEST_F(TensorStreamTest, AReadAfterAnAsyncPushMeetsItWhateverPathItTakes) {
  JobConfig config = OneTableJob(ConsistencyMode::kAsync);
  TableConfig dense = config.tables[0];
  dense.name = "d";
  dense.kind = TableKind::kDense;
  dense.dim = 4;
  config.tables.push_back(dense);
  Serve(config);
  Connect();
  // 640 KB of keys and gradients, on the stream: their apply takes far
  // longer than a small unary call.
  std::vector<uint64_t> keys(40'000);
  std::iota(keys.begin(), keys.end(), 1);
  std::vector<float> grad;
  for (uint64_t k : keys) {
    grad.push_back(static_cast<float>(k));
    grad.push_back(10.0f * static_cast<float>(k));
  }
  const std::vector<float> dense_grad = {1, 2, 3, 4};
  const TableGrad grads[] = {{"emb", keys, grad}, {"d", {}, dense_grad}};
  std::vector<float> weights(4);
  for (int n = 1; n <= 20; ++n) {
    ASSERT_TRUE(client_->Push(grads, 1).ok());
    ASSERT_TRUE(client_->PullDense("d", weights).ok());
    ASSERT_EQ(weights,
              (std::vector<float>{-1.0f * n, -2.0f * n, -3.0f * n, -4.0f * n}))
        << "push " << n;
  }
  std::vector<float> rows;
  const std::vector<uint64_t> some = {1, 40'000};
  ASSERT_TRUE(Pull(some, rows).ok());
  EXPECT_EQ(rows, (std::vector<float>{-20, -200, -800'000, -8'000'000}));
  EXPECT_EQ(service_->stream_calls(), 21u);  // the pushes and that pull
}

// In sync a pull for the push after the next waits at the server for this
// step's push, sent after it on the same stream: the push's answer comes
// first, then the pull's, with that push applied.
TEST_F(TensorStreamTest, AnAnswerReadyFirstIsNotHeldBehindACallThatWaits) {
  Serve(ConsistencyMode::kSync);
  Connect();
  const std::vector<uint64_t> keys = {4};
  std::vector<float> ahead_rows;
  absl::Status ahead;
  std::thread pull([&] { ahead = Pull(keys, ahead_rows, /*for_push=*/1); });
  ASSERT_TRUE(testing::WaitFor([&] { return service_->stream_calls() >= 1; }));
  ASSERT_TRUE(PushKeys(keys).ok());
  pull.join();
  ASSERT_TRUE(ahead.ok()) << ahead;
  EXPECT_EQ(ahead_rows, (std::vector<float>{-4, -40}));
  EXPECT_EQ(service_->open_streams(), 1u);
  EXPECT_EQ(service_->stream_calls(), 2u);
}

// The client keeps each call's deadline: a pull that waits past it fails
// with DEADLINE_EXCEEDED, and the stream goes on carrying the next calls
// (its late answer, when the push comes, is dropped).
TEST_F(TensorStreamTest, ACallPastItsDeadlineFailsAloneAndTheStreamGoesOn) {
  rpc_timeout_s_ = 0.3;
  Serve(ConsistencyMode::kSync);
  Connect();
  const std::vector<uint64_t> keys = {5};
  std::vector<float> rows;
  const absl::Status late = Pull(keys, rows, /*for_push=*/1);
  EXPECT_EQ(late.code(), absl::StatusCode::kDeadlineExceeded) << late;
  ASSERT_TRUE(PushKeys(keys).ok());
  ASSERT_TRUE(Pull(keys, rows).ok());
  EXPECT_EQ(rows, (std::vector<float>{-5, -50}));
  EXPECT_EQ(service_->open_streams(), 1u);
  EXPECT_EQ(service_->stream_calls(), 3u);
}

// A server that shuts down ends its streams (its Shutdown here has no
// deadline: it returns only once they have ended); the client's next call
// finds the server back on its port, on a new stream.
TEST_F(TensorStreamTest, AStreamThatEndedIsOpenedAgainByTheNextCall) {
  Serve(ConsistencyMode::kAsync);
  Connect();
  const std::vector<uint64_t> keys = {6};
  ASSERT_TRUE(PushKeys(keys).ok());
  const int port = port_;
  Stop();
  Serve(ConsistencyMode::kAsync, port);
  ASSERT_EQ(port_, port);
  std::vector<float> rows;
  ASSERT_TRUE(Pull(keys, rows).ok());
  EXPECT_EQ(rows, (std::vector<float>{0, 0}));  // a fresh server
  EXPECT_EQ(service_->open_streams(), 1u);
  EXPECT_EQ(service_->stream_calls(), 1u);
}

// A frame of no known kind, or whose body is not its request, is answered
// with INVALID_ARGUMENT under its id; the stream goes on.
TEST_F(TensorStreamTest, AFrameThatIsNoCallIsAnsweredWithAnError) {
  Serve(ConsistencyMode::kAsync);
  auto stub = rpc::ParameterServer::NewStub(
      grpc::CreateChannel(Endpoint(), grpc::InsecureChannelCredentials()));
  grpc::ClientContext context;
  auto stream = stub->TensorStream(&context);
  const std::string garbage = "\x0a\xff\xff\xff\x7f not a request";
  struct Case {
    int kind;
    std::string body;
    std::string error;
  };
  const std::vector<Case> cases = {
      {9, "", "unknown kind 9"},
      {rpc::TensorFrame::PUSH, garbage, "not a PushRequest"},
      {rpc::TensorFrame::PULL_SPARSE, garbage, "not a PullSparseRequest"}};
  uint64_t id = 40;
  for (const Case& c : cases) {
    rpc::TensorFrame frame;
    frame.set_id(++id);
    frame.set_kind(static_cast<rpc::TensorFrame::Kind>(c.kind));
    frame.set_body(c.body);
    ASSERT_TRUE(stream->Write(frame));
    rpc::TensorFrame answer;
    ASSERT_TRUE(stream->Read(&answer));
    EXPECT_EQ(answer.id(), id);
    EXPECT_EQ(answer.code(), grpc::StatusCode::INVALID_ARGUMENT);
    EXPECT_THAT(answer.error(), HasSubstr(c.error));
    EXPECT_TRUE(answer.body().empty());
  }
  ASSERT_TRUE(stream->WritesDone());
  const grpc::Status end = stream->Finish();
  EXPECT_TRUE(end.ok()) << end.error_message();
}

// Bytes that are not a TensorFrame cannot be answered: they end their
// stream with INVALID_ARGUMENT, and the server serves the next one.
TEST_F(TensorStreamTest, BytesThatAreNoFrameEndTheirStreamOnly) {
  Serve(ConsistencyMode::kAsync);
  auto channel =
      grpc::CreateChannel(Endpoint(), grpc::InsecureChannelCredentials());
  grpc::GenericStub stub(channel);
  grpc::CompletionQueue queue;
  grpc::ClientContext context;
  auto call = stub.PrepareCall(
      &context, "/hetps.rpc.ParameterServer/TensorStream", &queue);
  // Each step's tag comes back before the next starts.
  auto step = [&](intptr_t tag) {
    void* got = nullptr;
    bool ok = false;
    EXPECT_TRUE(queue.Next(&got, &ok));
    EXPECT_EQ(reinterpret_cast<intptr_t>(got), tag);
    return ok;
  };
  call->StartCall(reinterpret_cast<void*>(1));
  ASSERT_TRUE(step(1));
  const std::string garbage = "\x0a\xff\xff\xff\x7f not a frame";
  grpc::Slice slice(garbage);
  call->Write(grpc::ByteBuffer(&slice, 1), reinterpret_cast<void*>(2));
  step(2);
  grpc::ByteBuffer answer;
  call->Read(&answer, reinterpret_cast<void*>(3));
  EXPECT_FALSE(step(3));  // no answer: the stream ended
  grpc::Status end;
  call->Finish(&end, reinterpret_cast<void*>(4));
  ASSERT_TRUE(step(4));
  EXPECT_EQ(end.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(end.error_message(), HasSubstr("not a TensorFrame"));
  queue.Shutdown();
  void* tag;
  bool ok;
  while (queue.Next(&tag, &ok)) {
  }

  Connect();
  const std::vector<uint64_t> keys = {7};
  ASSERT_TRUE(PushKeys(keys).ok());
  EXPECT_EQ(service_->stream_calls(), 1u);
}

}  // namespace
}  // namespace hetps
