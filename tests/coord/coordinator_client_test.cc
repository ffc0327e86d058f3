// The worker's coordinator client against a gmock stub on a FakeClock:
// registration retries with back-off until the deadline, without sleeping.
#include "coord/coordinator_client.h"

#include <gtest/gtest.h>

#include <numeric>
#include <utility>
#include <vector>

#include "coord/chunk_queue.h"
#include "gmock/gmock.h"
#include "support/fake_clock.h"
#include "support/mock_stubs.h"

namespace hetps {
namespace {

using ::testing::_;
using ::testing::ElementsAre;
using testing::FakeClock;
using ::testing::HasSubstr;
using ::testing::Return;

const grpc::Status kDown(grpc::StatusCode::UNAVAILABLE, "connection refused");

class CoordinatorClientTest : public ::testing::Test {
 protected:
  CoordinatorClientTest() {
    config_.cluster.ps_endpoints = {"10.0.0.1:7000"};
    config_.client.initial_backoff_s = 0.5;
    config_.client.max_backoff_s = 2;
    config_.client.connect_deadline_s = 5;
  }

  // A client whose only stub is `stub_` (handed over on construction).
  std::unique_ptr<CoordinatorClient> Client() {
    return std::make_unique<CoordinatorClient>(
        config_, 0, clock_, [this](const std::string& endpoint) {
          EXPECT_EQ(endpoint, "10.0.0.1:7000");
          return std::unique_ptr<rpc::Coordinator::StubInterface>(
              std::move(owned_));
        });
  }

  JobConfig config_;
  FakeClock clock_;
  std::unique_ptr<rpc::MockCoordinatorStub> owned_ =
      std::make_unique<rpc::MockCoordinatorStub>();
  rpc::MockCoordinatorStub& stub_ = *owned_;
};

TEST_F(CoordinatorClientTest, RegisterRetriesUntilTheCoordinatorIsUp) {
  rpc::RegisterResponse welcome;
  welcome.set_incarnation(1);
  EXPECT_CALL(stub_, Register(_, _, _))
      .WillOnce(Return(kDown))
      .WillOnce(Return(kDown))
      .WillOnce([&](grpc::ClientContext*, const rpc::RegisterRequest& req,
                    rpc::RegisterResponse* resp) {
        EXPECT_EQ(req.rank(), 0u);
        *resp = welcome;
        return grpc::Status::OK;
      });
  auto registered = Client()->Register();
  ASSERT_TRUE(registered.ok()) << registered.status();
  EXPECT_EQ(registered->incarnation(), 1u);
  EXPECT_THAT(clock_.sleeps(),
              ElementsAre(absl::Milliseconds(500), absl::Seconds(1)));
}

// issue 15: the client says it was dropped only from a reply newer than its
// registration, and registering again clears it.
TEST_F(CoordinatorClientTest,
       DroppedFollowsHeartbeatsNewerThanTheRegistration) {
  rpc::RegisterResponse first, again;
  first.set_epoch(1);
  first.set_incarnation(1);
  again.set_epoch(3);
  again.set_incarnation(2);
  EXPECT_CALL(stub_, Register(_, _, _))
      .WillOnce([&](auto, auto, rpc::RegisterResponse* r) {
        *r = first;
        return grpc::Status::OK;
      })
      .WillOnce([&](auto, auto, rpc::RegisterResponse* r) {
        *r = again;
        return grpc::Status::OK;
      });
  // Replies: live at epoch 1; out at epoch 2; a late "out" of epoch 2
  // after the second registration; live at epoch 3.
  std::vector<std::pair<uint64_t, bool>> replies = {
      {1, true}, {2, false}, {2, false}, {3, true}};
  size_t next = 0;
  EXPECT_CALL(stub_, Heartbeat(_, _, _))
      .Times(4)
      .WillRepeatedly([&](auto, auto, rpc::HeartbeatResponse* r) {
        r->set_epoch(replies[next].first);
        r->set_live(replies[next].second);
        ++next;
        return grpc::Status::OK;
      });
  auto client = Client();
  ASSERT_TRUE(client->Register().ok());
  ASSERT_TRUE(client->HeartbeatNow().ok());
  EXPECT_FALSE(client->dropped());
  ASSERT_TRUE(client->HeartbeatNow().ok());
  EXPECT_TRUE(client->dropped());
  ASSERT_TRUE(client->Register().ok());
  EXPECT_FALSE(client->dropped());
  ASSERT_TRUE(client->HeartbeatNow().ok());
  EXPECT_FALSE(client->dropped());
  ASSERT_TRUE(client->HeartbeatNow().ok());
  EXPECT_FALSE(client->dropped());
}

TEST_F(CoordinatorClientTest, AnUnreachableCoordinatorFailsNamingIt) {
  EXPECT_CALL(stub_, Register(_, _, _)).WillRepeatedly(Return(kDown));
  auto registered = Client()->Register();
  EXPECT_EQ(registered.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(registered.status().message(),
              HasSubstr("coordinator at 10.0.0.1:7000 unreachable for 5s "
                        "(client.connect_deadline_s = 5)"));
  EXPECT_THAT(registered.status().message(), HasSubstr("connection refused"));
  // 0.5, 1, 2, then what is left of the 5 s: 1.5.
  EXPECT_THAT(clock_.sleeps(),
              ElementsAre(absl::Milliseconds(500), absl::Seconds(1),
                          absl::Seconds(2), absl::Milliseconds(1500)));
}

TEST_F(CoordinatorClientTest, AMismatchIsNotRetried) {
  EXPECT_CALL(stub_, Register(_, _, _))
      .WillOnce(Return(grpc::Status(grpc::StatusCode::FAILED_PRECONDITION,
                                    "protocol version 1, expected 2")));
  auto registered = Client()->Register();
  EXPECT_EQ(registered.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(clock_.sleeps().empty());
}

// The connection breaks while the worker asks for its next chunk (the
// coordinator was killed after it answered, and restarted): the client
// asks again, and the coordinator, told how many chunks the worker
// received, answers the same chunk. Every chunk is trained once and
// counted once. Before, the worker failed on the broken call
// ("UNAVAILABLE: recvmsg:Connection reset by peer", a CI run of
// PersistenceTest.ServerZeroRestartedInTheMiddleOfAMoveFinishesIt).
TEST_F(CoordinatorClientTest, AChunkWhoseReplyWasLostIsAskedForAgain) {
  ChunkQueue queue(4, 1, 1);
  int asks = 0;
  EXPECT_CALL(stub_, NextChunk(_, _, _))
      .WillRepeatedly([&](grpc::ClientContext*, const rpc::ChunkRequest& req,
                          rpc::ChunkResponse* resp) {
        *resp = queue.Next(req.rank(), req.finished_samples(),
                           req.chunks_received());
        if (++asks == 2) {  // handed out, but the reply is lost
          return grpc::Status(grpc::StatusCode::UNAVAILABLE,
                              "recvmsg:Connection reset by peer");
        }
        return grpc::Status::OK;
      });
  // What a worker whose replies all arrive is handed, in order.
  std::vector<std::pair<uint32_t, uint32_t>> expected;  // (chunk, chunks)
  ChunkQueue reference(4, 1, 1);
  for (uint64_t finished = 0;; finished = 10) {
    const rpc::ChunkResponse c =
        reference.Next(0, finished, reference.chunks_of(0));
    if (c.done()) break;
    expected.emplace_back(c.chunk(), c.chunks());
  }
  ASSERT_EQ(expected.size(), 10u) << "2 whole chunks, 2 in quarters";

  auto client = Client();
  std::vector<std::pair<uint32_t, uint32_t>> trained;
  for (uint64_t finished = 0;; finished = 10) {
    auto chunk = client->NextChunk(finished);
    ASSERT_TRUE(chunk.ok()) << chunk.status();
    if (chunk->done()) break;
    trained.emplace_back(chunk->chunk(), chunk->chunks());
  }
  EXPECT_EQ(trained, expected);
  EXPECT_EQ(asks, 12) << "10 parts, done, and the lost reply asked again";
  EXPECT_EQ(queue.finished_chunks(), 10u);
  EXPECT_EQ(queue.finished_samples(), 100u);
  EXPECT_THAT(clock_.sleeps(), ElementsAre(absl::Milliseconds(500)));
}

// A barrier or a leave whose connection breaks (the coordinator killed
// while a fast worker waits at "trained", then restarted) is asked again,
// as NextChunk; before, the worker failed and with it the job.
TEST_F(CoordinatorClientTest,
       ABarrierOrALeaveMetByABrokenConnectionIsAskedAgain) {
  const grpc::Status broken(grpc::StatusCode::UNAVAILABLE,
                            "recvmsg:Connection reset by peer");
  EXPECT_CALL(stub_, Barrier(_, _, _))
      .WillOnce(Return(broken))
      .WillOnce([](grpc::ClientContext*, const rpc::BarrierRequest& req,
                   rpc::BarrierResponse*) {
        EXPECT_EQ(req.name(), "trained");
        EXPECT_EQ(req.rank(), 0u);
        return grpc::Status::OK;
      });
  EXPECT_CALL(stub_, Leave(_, _, _))
      .WillOnce(Return(broken))
      .WillOnce(Return(broken))
      .WillOnce([](grpc::ClientContext*, const rpc::LeaveRequest& req,
                   rpc::LeaveResponse*) {
        EXPECT_EQ(req.reason(), "finished its data");
        return grpc::Status::OK;
      });
  auto client = Client();
  EXPECT_TRUE(client->Leave("finished its data").ok());
  EXPECT_TRUE(client->Barrier("trained").ok());
  EXPECT_THAT(clock_.sleeps(),
              ElementsAre(absl::Milliseconds(500), absl::Seconds(1),
                          absl::Milliseconds(500)));
}

// A coordinator shutting down for good ends a waiting barrier at once,
// naming it: asked again, the worker would wait out connect_deadline_s.
TEST_F(CoordinatorClientTest, ACoordinatorShuttingDownEndsABarrierAtOnce) {
  EXPECT_CALL(stub_, Barrier(_, _, _))
      .WillOnce(Return(grpc::Status(grpc::StatusCode::ABORTED,
                                    "coordinator shutting down: the job is "
                                    "ending")));
  const absl::Status s = Client()->Barrier("trained");
  EXPECT_EQ(s.code(), absl::StatusCode::kAborted);
  EXPECT_THAT(s.message(), HasSubstr("shutting down"));
  EXPECT_TRUE(clock_.sleeps().empty());
}

}  // namespace
}  // namespace hetps
