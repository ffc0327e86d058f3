// The coordinator service in process, on a FakeClock, its servers reached
// through stubs that fail on purpose (no server runs here).
#include "coord/coordinator.h"

#include <gtest/gtest.h>

#include <map>
#include <thread>

#include "gmock/gmock.h"
#include "hetps/version.h"
#include "support/fake_clock.h"
#include "support/faulty_stub.h"

namespace hetps {
namespace {

using testing::FakeClock;
using testing::FaultPlan;
using testing::FaultyStubs;
using ::testing::HasSubstr;

JobConfig TwoWorkerJob() {
  JobConfig config;
  config.cluster.workers = 2;
  config.cluster.ps_endpoints = {"127.0.0.1:1"};
  config.train.epochs = 1;
  config.train.data.chunks = 64;
  config.server.heartbeat_timeout_s = 5;
  config.client.connect_deadline_s = 10;
  return config;
}

class CoordinatorTest : public ::testing::Test {
 protected:
  CoordinatorTest() : coordinator_(config_, 0, clock_, FaultyStubs(plan_)) {
    plan_.SetDead(true);  // no server: every broadcast fails at once
  }

  void Register(uint32_t rank) {
    rpc::RegisterRequest req;
    req.set_protocol_version(kProtocolVersion);
    req.set_rank(rank);
    rpc::RegisterResponse resp;
    ASSERT_TRUE(coordinator_.Register(nullptr, &req, &resp).ok());
  }
  rpc::HeartbeatResponse Heartbeat(uint32_t rank) {
    rpc::HeartbeatRequest req;
    req.set_protocol_version(kProtocolVersion);
    req.set_rank(rank);
    req.mutable_progress()->set_clock(7);
    rpc::HeartbeatResponse resp;
    EXPECT_TRUE(coordinator_.Heartbeat(nullptr, &req, &resp).ok());
    return resp;
  }
  // As a worker asks: with the count of chunks it received.
  rpc::ChunkResponse NextChunk(uint32_t rank) {
    rpc::ChunkRequest req;
    req.set_protocol_version(kProtocolVersion);
    req.set_rank(rank);
    req.set_chunks_received(chunks_received_[rank]);
    rpc::ChunkResponse resp;
    EXPECT_TRUE(coordinator_.NextChunk(nullptr, &req, &resp).ok());
    if (!resp.done()) ++chunks_received_[rank];
    return resp;
  }
  rpc::StatusResponse Status() {
    rpc::StatusRequest req;
    req.set_protocol_version(kProtocolVersion);
    rpc::StatusResponse resp;
    EXPECT_TRUE(coordinator_.GetStatus(nullptr, &req, &resp).ok());
    return resp;
  }

  const JobConfig config_ = TwoWorkerJob();
  std::map<uint32_t, uint64_t> chunks_received_;
  FakeClock clock_;
  FaultPlan plan_;
  Coordinator coordinator_;
};

// Liveness on the coordinator's clock: nothing sleeps, the timeout is met
// to the millisecond, and the wall clock plays no part.
TEST_F(CoordinatorTest, ASilentWorkerIsDroppedAfterTheHeartbeatTimeout) {
  Register(0);
  Register(1);
  const rpc::ChunkResponse held = NextChunk(1);
  clock_.Advance(absl::Seconds(4));
  Heartbeat(0);
  clock_.Advance(absl::Seconds(1));
  EXPECT_TRUE(coordinator_.ExpireSilentWorkers().empty());
  clock_.Advance(absl::Milliseconds(500));
  EXPECT_EQ(coordinator_.ExpireSilentWorkers(), (std::vector<uint32_t>{1}));
  EXPECT_EQ(coordinator_.LiveWorkers(), (std::vector<uint32_t>{0}));
  EXPECT_EQ(coordinator_.epoch(), 2u);
  // The new live set went to the server (which is down: the coordinator
  // logs it and goes on).
  EXPECT_EQ(plan_.calls("UpdateMembership"), 1);
  // Its chunk goes to whoever asks next.
  EXPECT_EQ(NextChunk(0).chunk(), held.chunk());
  const rpc::StatusResponse status = Status();
  ASSERT_EQ(status.workers_size(), 2);
  EXPECT_FALSE(status.workers(1).live());
  EXPECT_EQ(status.workers(1).left_reason(), "no heartbeat for 5.5s");
  EXPECT_EQ(status.workers(0).progress().clock(), 7u);
  EXPECT_DOUBLE_EQ(status.workers(0).last_heartbeat_age_s(), 1.5);
  EXPECT_EQ(status.requeued_chunks(), 1u);
  EXPECT_FALSE(status.servers(0).reachable());
}

// issue 15: a dropped worker that runs again learns from its next
// heartbeat that it is out, and is back once it registers again.
TEST_F(CoordinatorTest, AHeartbeatTellsADroppedWorkerItIsOut) {
  Register(0);
  Register(1);
  EXPECT_TRUE(Heartbeat(1).live());
  clock_.Advance(absl::Seconds(6));
  Heartbeat(0);
  EXPECT_EQ(coordinator_.ExpireSilentWorkers(), (std::vector<uint32_t>{1}));
  const rpc::HeartbeatResponse out = Heartbeat(1);
  EXPECT_FALSE(out.live());
  EXPECT_EQ(out.epoch(), 2u);
  // A heartbeat alone does not bring it back: it registers again.
  EXPECT_EQ(coordinator_.LiveWorkers(), (std::vector<uint32_t>{0}));
  EXPECT_TRUE(Heartbeat(0).live());
  Register(1);
  EXPECT_EQ(coordinator_.LiveWorkers(), (std::vector<uint32_t>{0, 1}));
  const rpc::HeartbeatResponse back = Heartbeat(1);
  EXPECT_TRUE(back.live());
  EXPECT_EQ(back.epoch(), 3u);
}

// A barrier that waits when the coordinator stops is answered ABORTED, not
// UNAVAILABLE: workers ask again while a coordinator is unavailable (one
// being restarted), and this one will not come back.
TEST_F(CoordinatorTest, ABarrierWaitingWhenTheCoordinatorStopsIsAborted) {
  Register(0);
  Register(1);
  grpc::Status waited;
  std::thread worker([&] {
    rpc::BarrierRequest req;
    req.set_protocol_version(kProtocolVersion);
    req.set_name("trained");
    req.set_rank(0);
    rpc::BarrierResponse resp;
    waited = coordinator_.Barrier(nullptr, &req, &resp);
  });
  clock_.AwaitWaiting(1);  // worker 1 has not arrived
  coordinator_.Stop();
  worker.join();
  EXPECT_EQ(waited.error_code(), grpc::StatusCode::ABORTED);
  EXPECT_THAT(waited.error_message(), HasSubstr("shutting down"));
}

// issue 15: without endpoint lists, servers register at the rendezvous
// (server 0's address) and Rendezvous answers every endpoint once all did.
TEST(CoordinatorRendezvousTest, ServersRegisterAndTheListIsAnsweredWhenFull) {
  JobConfig config = TwoWorkerJob();
  config.cluster.ps_endpoints.clear();
  config.cluster.servers = 3;
  config.cluster.rendezvous = "10.0.0.1:7100";
  FakeClock clock;
  FaultPlan plan;
  plan.SetDead(true);
  Coordinator coordinator(config, 0, clock, FaultyStubs(plan));
  const auto rendezvous = [&](rpc::RendezvousResponse* resp) {
    rpc::RendezvousRequest req;
    req.set_protocol_version(kProtocolVersion);
    return coordinator.Rendezvous(nullptr, &req, resp);
  };
  const auto register_server = [&](uint32_t rank, const std::string& at) {
    rpc::RegisterRequest req;
    req.set_protocol_version(kProtocolVersion);
    req.set_role(rpc::ROLE_SERVER);
    req.set_rank(rank);
    req.set_endpoint(at);
    rpc::RegisterResponse resp;
    return coordinator.Register(nullptr, &req, &resp);
  };
  rpc::RendezvousResponse early;
  const grpc::Status waiting = rendezvous(&early);
  EXPECT_EQ(waiting.error_code(), grpc::StatusCode::UNAVAILABLE);
  EXPECT_THAT(waiting.error_message(), HasSubstr("servers [1,2]"));
  EXPECT_EQ(early.ps_endpoints_size(), 0);

  EXPECT_EQ(register_server(2, "10.0.0.3:4242").error_code(),
            grpc::StatusCode::OK);
  // A registered server is sent the live set at once.
  EXPECT_EQ(plan.calls("UpdateMembership"), 2);  // to servers 0 and 2
  EXPECT_EQ(register_server(1, "no port").error_code(),
            grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(register_server(0, "10.0.0.9:1").error_code(),
            grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(register_server(3, "10.0.0.9:1").error_code(),
            grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(rendezvous(&early).error_message(), HasSubstr("servers [1]"));

  EXPECT_TRUE(register_server(1, "10.0.0.2:5151").ok());
  rpc::RendezvousResponse full;
  ASSERT_TRUE(rendezvous(&full).ok());
  EXPECT_THAT(full.ps_endpoints(),
              ::testing::ElementsAre("10.0.0.1:7100", "10.0.0.2:5151",
                                     "10.0.0.3:4242"));
}

TEST_F(CoordinatorTest, RanksOutsideTheJobAreRefused) {
  rpc::ChunkRequest req;
  req.set_protocol_version(kProtocolVersion);
  req.set_rank(7);
  rpc::ChunkResponse resp;
  const grpc::Status s = coordinator_.NextChunk(nullptr, &req, &resp);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(s.error_message(), HasSubstr("the job has 2 workers"));
  rpc::HeartbeatRequest beat;
  beat.set_protocol_version(kProtocolVersion);
  beat.set_rank(2);
  rpc::HeartbeatResponse beat_resp;
  EXPECT_EQ(coordinator_.Heartbeat(nullptr, &beat, &beat_resp).error_code(),
            grpc::StatusCode::INVALID_ARGUMENT);
}

TEST_F(CoordinatorTest, LeavingGivesTheHeldChunkBack) {
  const rpc::ChunkResponse held = NextChunk(1);
  rpc::LeaveRequest leave;
  leave.set_protocol_version(kProtocolVersion);
  leave.set_rank(1);
  leave.set_reason("crashed");
  rpc::LeaveResponse left;
  ASSERT_TRUE(coordinator_.Leave(nullptr, &leave, &left).ok());
  EXPECT_EQ(left.epoch(), 2u);
  EXPECT_EQ(NextChunk(0).chunk(), held.chunk());
}

TEST(TrainChunksTest, SixteenPerWorkerUnlessConfigured) {
  JobConfig config;
  config.cluster.workers = 3;
  EXPECT_EQ(TrainChunks(config), 48u);
  config.train.data.chunks = 8;
  EXPECT_EQ(TrainChunks(config), 8u);
}

}  // namespace
}  // namespace hetps
