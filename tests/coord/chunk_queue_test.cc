#include "coord/chunk_queue.h"

#include <gtest/gtest.h>

#include <set>
#include <vector>

namespace hetps {
namespace {

// The next chunk for `worker`, which received every reply so far.
rpc::ChunkResponse Next(ChunkQueue& queue, uint32_t worker,
                        uint64_t finished_samples) {
  return queue.Next(worker, finished_samples, queue.chunks_of(worker));
}

// Every record of every epoch is handed out exactly once, whole chunks
// first, the job's last chunks in quarters.
TEST(ChunkQueueTest, EveryRecordOnceAndTheTailInQuarters) {
  ChunkQueue queue(8, 2, 2);
  std::vector<rpc::ChunkResponse> given;
  for (int i = 0; i < 100; ++i) {
    rpc::ChunkResponse c = Next(queue, i % 2, 10);
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
  EXPECT_TRUE(Next(queue, 1, 10).done());
  EXPECT_TRUE(Next(queue, 0, 10).done());
  // Every ask finished the chunk its worker held: all 28, 10 samples each.
  EXPECT_EQ(queue.finished_chunks(), 28u);
  EXPECT_EQ(queue.finished_samples(), 280u);
  EXPECT_EQ(queue.chunks_of(0) + queue.chunks_of(1), 28u);
}

TEST(ChunkQueueTest, AGoneWorkersChunkComesBackFirst) {
  ChunkQueue queue(64, 1, 2);
  const rpc::ChunkResponse held = Next(queue, 1, 0);
  auto back = queue.Requeue(1);
  ASSERT_TRUE(back.has_value());
  EXPECT_EQ(back->chunk(), held.chunk());
  EXPECT_FALSE(queue.Requeue(1).has_value()) << "it holds nothing now";
  const rpc::ChunkResponse next = Next(queue, 0, 0);
  EXPECT_EQ(next.chunk(), held.chunk());
  // A worker that asked for more before leaving gives nothing back: the
  // chunk after is a new one.
  EXPECT_EQ(Next(queue, 0, 5).chunk(), held.chunk() + 1);
  EXPECT_EQ(queue.requeued(), 1u);
  EXPECT_EQ(queue.finished_chunks(), 1u);
}

// A checkpoint keeps what is handed out; chunks held then are trained again
// after a resume.
TEST(ChunkQueueTest, SavedProgressHandsOutHeldChunksAgain) {
  ChunkQueue queue(8, 1, 2);
  Next(queue, 0, 0);   // chunk 0
  Next(queue, 1, 0);   // chunk 1
  Next(queue, 0, 10);  // rank 0 finished chunk 0 (10 samples), holds 2
  const rpc::JobProgress saved = queue.Save();
  EXPECT_EQ(saved.chunks_given(), 3u);
  EXPECT_EQ(saved.finished_chunks(), 1u);
  EXPECT_EQ(saved.finished_samples(), 10u);

  ChunkQueue resumed(8, 1, 2);
  resumed.Restore(saved);
  std::set<uint32_t> again = {Next(resumed, 0, 0).chunk(),
                              Next(resumed, 0, 0).chunk()};
  EXPECT_EQ(again, (std::set<uint32_t>{1, 2}));
  EXPECT_EQ(Next(resumed, 0, 0).chunk(), 3u);
}

// A worker whose connection broke while it asked (the coordinator handed it
// a chunk, the reply never came) asks again with the count of chunks it
// received: it gets the same chunk, and the chunk it finished is counted
// once. Before, the ask again counted the finished chunk twice and the
// lost chunk was never trained.
TEST(ChunkQueueTest, AnAskWhoseReplyWasLostGetsTheSameChunk) {
  ChunkQueue queue(8, 1, 2);
  EXPECT_EQ(queue.Next(0, 0, 0).chunk(), 0u);
  const rpc::ChunkResponse lost = queue.Next(0, 10, 1);  // reply lost
  EXPECT_EQ(lost.chunk(), 1u);
  const rpc::ChunkResponse again = queue.Next(0, 10, 1);
  EXPECT_EQ(again.chunk(), lost.chunk());
  EXPECT_EQ(again.epoch(), lost.epoch());
  EXPECT_EQ(queue.finished_chunks(), 1u);
  EXPECT_EQ(queue.finished_samples(), 10u);
  EXPECT_EQ(queue.chunks_of(0), 2u);
  // Nobody else gets it, and the worker goes on from there.
  EXPECT_EQ(queue.Next(1, 0, 0).chunk(), 2u);
  EXPECT_EQ(queue.Next(0, 7, 2).chunk(), 3u);
  EXPECT_EQ(queue.finished_chunks(), 2u);
  EXPECT_EQ(queue.finished_samples(), 17u);
  // A lost `done` is answered `done` again, counting nothing more.
  ChunkQueue last(1, 1, 1);
  EXPECT_EQ(last.Next(0, 0, 0).chunks(), 4u) << "the tail, in quarters";
  for (uint64_t received = 1; received < 4; ++received) {
    EXPECT_FALSE(last.Next(0, 5, received).done());
  }
  EXPECT_TRUE(last.Next(0, 5, 4).done());
  EXPECT_TRUE(last.Next(0, 5, 4).done());
  EXPECT_EQ(last.finished_chunks(), 4u);
  EXPECT_EQ(last.finished_samples(), 20u);
}

}  // namespace
}  // namespace hetps
