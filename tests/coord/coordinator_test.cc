#include "coord/coordinator.h"

#include <gtest/gtest.h>

#include <map>
#include <vector>

#include "hetps/version.h"

namespace hetps {
namespace {

// Every record of every epoch is handed out exactly once, whole chunks
// first, the job's last chunks in quarters.
TEST(CoordinatorChunksTest, EveryRecordOnceAndTheTailInQuarters) {
  JobConfig config;
  config.cluster.workers = 2;
  config.cluster.ps_endpoints = {"127.0.0.1:1"};
  config.train.epochs = 2;
  config.train.data.chunks = 8;
  Coordinator coordinator(config);
  EXPECT_EQ(TrainChunks(config), 8u);

  rpc::ChunkRequest request;
  request.set_protocol_version(kProtocolVersion);
  std::vector<rpc::ChunkResponse> given;
  for (int i = 0; i < 100; ++i) {
    request.set_rank(i % 2);
    rpc::ChunkResponse response;
    ASSERT_TRUE(coordinator.NextChunk(nullptr, &request, &response).ok());
    if (response.done()) break;
    given.push_back(response);
  }
  // 16 chunks: 12 whole, the last 4 as 4 quarters each.
  ASSERT_EQ(given.size(), 12u + 16u);
  for (size_t i = 0; i < given.size(); ++i) {
    EXPECT_EQ(given[i].chunks(), i < 12 ? 8u : 32u) << i;
    EXPECT_EQ(given[i].epoch(), i < 8 ? 0u : 1u) << i;
  }
  // Record r of the split belongs to shard r mod chunks.
  for (uint32_t epoch = 0; epoch < 2; ++epoch) {
    for (uint64_t r = 0; r < 1000; ++r) {
      int owners = 0;
      for (const rpc::ChunkResponse& c : given) {
        owners += c.epoch() == epoch && r % c.chunks() == c.chunk();
      }
      EXPECT_EQ(owners, 1) << "record " << r << " epoch " << epoch;
    }
  }
  rpc::ChunkResponse after;
  ASSERT_TRUE(coordinator.NextChunk(nullptr, &request, &after).ok());
  EXPECT_TRUE(after.done());
  // Out-of-range ranks are refused.
  request.set_rank(7);
  EXPECT_EQ(coordinator.NextChunk(nullptr, &request, &after).error_code(),
            grpc::StatusCode::INVALID_ARGUMENT);
}

TEST(CoordinatorChunksTest, ADeadWorkersChunkGoesBackToTheQueue) {
  JobConfig config;
  config.cluster.workers = 2;
  config.cluster.ps_endpoints = {"127.0.0.1:1"};
  config.train.epochs = 1;
  config.train.data.chunks = 64;
  // No server listens: the membership broadcast of the Leave gives up fast.
  config.client.connect_deadline_s = 0.2;
  Coordinator coordinator(config);
  rpc::ChunkRequest request;
  request.set_protocol_version(kProtocolVersion);
  rpc::ChunkResponse held, next;
  request.set_rank(1);
  ASSERT_TRUE(coordinator.NextChunk(nullptr, &request, &held).ok());
  // Worker 1 leaves as a crash would (not after asking for more).
  rpc::LeaveRequest leave;
  leave.set_protocol_version(kProtocolVersion);
  leave.set_rank(1);
  leave.set_reason("no heartbeat for 10s");
  rpc::LeaveResponse left;
  ASSERT_TRUE(coordinator.Leave(nullptr, &leave, &left).ok());
  request.set_rank(0);
  ASSERT_TRUE(coordinator.NextChunk(nullptr, &request, &next).ok());
  EXPECT_EQ(next.chunk(), held.chunk());
  EXPECT_EQ(next.chunks(), held.chunks());
  EXPECT_EQ(next.epoch(), held.epoch());
  // A worker that asked for its next chunk before leaving gives nothing
  // back: the chunk after `next` is a new one.
  rpc::ChunkResponse after;
  ASSERT_TRUE(coordinator.NextChunk(nullptr, &request, &after).ok());
  EXPECT_EQ(after.chunk(), held.chunk() + 1);
}

}  // namespace
}  // namespace hetps
