#include "coord/chunk_queue.h"

#include <gtest/gtest.h>

#include <set>
#include <vector>

namespace hetps {
namespace {

// Every record of every epoch is handed out exactly once, whole chunks
// first, the job's last chunks in quarters.
TEST(ChunkQueueTest, EveryRecordOnceAndTheTailInQuarters) {
  ChunkQueue queue(8, 2, 2);
  std::vector<rpc::ChunkResponse> given;
  for (int i = 0; i < 100; ++i) {
    rpc::ChunkResponse c = queue.Next(i % 2, 10);
    if (c.done()) break;
    given.push_back(c);
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
  EXPECT_TRUE(queue.Next(1, 10).done());
  EXPECT_TRUE(queue.Next(0, 10).done());
  // Every ask finished the chunk its worker held: all 28, 10 samples each.
  EXPECT_EQ(queue.finished_chunks(), 28u);
  EXPECT_EQ(queue.finished_samples(), 280u);
  EXPECT_EQ(queue.chunks_of(0) + queue.chunks_of(1), 28u);
}

TEST(ChunkQueueTest, AGoneWorkersChunkComesBackFirst) {
  ChunkQueue queue(64, 1, 2);
  const rpc::ChunkResponse held = queue.Next(1, 0);
  auto back = queue.Requeue(1);
  ASSERT_TRUE(back.has_value());
  EXPECT_EQ(back->chunk(), held.chunk());
  EXPECT_FALSE(queue.Requeue(1).has_value()) << "it holds nothing now";
  const rpc::ChunkResponse next = queue.Next(0, 0);
  EXPECT_EQ(next.chunk(), held.chunk());
  // A worker that asked for more before leaving gives nothing back: the
  // chunk after is a new one.
  EXPECT_EQ(queue.Next(0, 5).chunk(), held.chunk() + 1);
  EXPECT_EQ(queue.requeued(), 1u);
  EXPECT_EQ(queue.finished_chunks(), 1u);
}

// A checkpoint keeps what is handed out; chunks held then are trained again
// after a resume.
TEST(ChunkQueueTest, SavedProgressHandsOutHeldChunksAgain) {
  ChunkQueue queue(8, 1, 2);
  queue.Next(0, 0);   // chunk 0
  queue.Next(1, 0);   // chunk 1
  queue.Next(0, 10);  // rank 0 finished chunk 0 (10 samples), holds 2
  const rpc::JobProgress saved = queue.Save();
  EXPECT_EQ(saved.chunks_given(), 3u);
  EXPECT_EQ(saved.finished_chunks(), 1u);
  EXPECT_EQ(saved.finished_samples(), 10u);

  ChunkQueue resumed(8, 1, 2);
  resumed.Restore(saved);
  std::set<uint32_t> again = {resumed.Next(0, 0).chunk(),
                              resumed.Next(0, 0).chunk()};
  EXPECT_EQ(again, (std::set<uint32_t>{1, 2}));
  EXPECT_EQ(resumed.Next(0, 0).chunk(), 3u);
}

}  // namespace
}  // namespace hetps
