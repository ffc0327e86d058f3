#include "server/aggregator.h"

#include <gtest/gtest.h>

#include <thread>
#include <vector>

#include "table/optimizer.h"

namespace hetps {
namespace {

TableConfig SgdTable(const std::string& name, TableKind kind, uint64_t dim) {
  TableConfig t;
  t.name = name;
  t.kind = kind;
  t.dim = dim;
  t.optimizer.type = "sgd";
  t.optimizer.learning_rate = 0.5f;
  t.init.type = "zero";
  return t;
}

class AggregatorTest : public ::testing::Test {
 protected:
  AggregatorTest()
      : sparse_(SgdTable("emb", TableKind::kSparse, 2),
                *Optimizer::Create(SgdTable("emb", TableKind::kSparse, 2).optimizer),
                4),
        dense_(SgdTable("d", TableKind::kDense, 3), 0, 3,
               *Optimizer::Create(SgdTable("d", TableKind::kDense, 3).optimizer)) {}

  PushView MakePush(uint32_t worker, uint64_t clock, uint32_t batch,
                    const std::vector<uint64_t>& keys,
                    const std::vector<float>& grads,
                    const std::vector<float>& dense_grads) {
    keys_.push_back(keys);
    grads_.push_back(grads);
    dense_grads_.push_back(dense_grads);
    PushView v;
    v.worker_id = worker;
    v.clock = clock;
    v.batch_size = batch;
    v.sparse.push_back({&sparse_, keys_.back(), grads_.back()});
    v.dense.push_back({&dense_, dense_grads_.back()});
    return v;
  }

  std::vector<float> Row(uint64_t key) {
    std::vector<float> out(2);
    sparse_.Pull(std::span<const uint64_t>(&key, 1), out);
    return out;
  }
  std::vector<float> Dense() {
    std::vector<float> out(3);
    dense_.Pull(out);
    return out;
  }

  SparseTable sparse_;
  DenseTable dense_;
  // Keep payloads alive (views point into them); deque-like stability.
  std::vector<std::vector<uint64_t>> keys_ = std::vector<std::vector<uint64_t>>();
  std::vector<std::vector<float>> grads_, dense_grads_;

  void SetUp() override {
    keys_.reserve(64);
    grads_.reserve(64);
    dense_grads_.reserve(64);
  }
};

TEST_F(AggregatorTest, SyncMergesByBatchSizeAndAppliesOncePerRound) {
  auto agg = *Aggregator::Create(ConsistencyMode::kSync, 2);
  // Worker 0 (batch 1) and worker 1 (batch 3) both touch key 7; only worker
  // 1 touches key 9. Merged = Σ b·g / Σ b with Σ b = 4.
  ASSERT_TRUE(agg->Push(MakePush(0, 0, 1, {7}, {1.0f, 2.0f}, {4, 0, 0})).ok());
  EXPECT_EQ(agg->applied_rounds(), 0u);
  EXPECT_EQ(Row(7), (std::vector<float>{0, 0}));  // nothing applied yet
  ASSERT_TRUE(
      agg->Push(MakePush(1, 0, 3, {7, 9}, {1.0f, 0.0f, 2.0f, 2.0f}, {0, 4, 0}))
          .ok());
  EXPECT_EQ(agg->applied_rounds(), 1u);
  // key 7: (1·1 + 3·1)/4 = 1 and (1·2 + 3·0)/4 = 0.5; sgd lr 0.5.
  EXPECT_EQ(Row(7), (std::vector<float>{-0.5f, -0.25f}));
  // key 9: 3·2/4 = 1.5 → -0.75.
  EXPECT_EQ(Row(9), (std::vector<float>{-0.75f, -0.75f}));
  // dense: (1·4)/4 = 1, (3·4)/4 = 3, 0.
  EXPECT_EQ(Dense(), (std::vector<float>{-0.5f, -1.5f, 0.0f}));
}

TEST_F(AggregatorTest, SyncRetriedPushIsNotAppliedTwice) {
  auto agg = *Aggregator::Create(ConsistencyMode::kSync, 2);
  ASSERT_TRUE(agg->Push(MakePush(0, 0, 1, {7}, {1, 1}, {0, 0, 0})).ok());
  // The same push again (a retry whose first reply was lost).
  ASSERT_TRUE(agg->Push(MakePush(0, 0, 1, {7}, {1, 1}, {0, 0, 0})).ok());
  ASSERT_TRUE(agg->Push(MakePush(1, 0, 1, {7}, {1, 1}, {0, 0, 0})).ok());
  // And a retry after the round closed.
  ASSERT_TRUE(agg->Push(MakePush(1, 0, 1, {7}, {1, 1}, {0, 0, 0})).ok());
  EXPECT_EQ(agg->applied_rounds(), 1u);
  EXPECT_EQ(Row(7), (std::vector<float>{-0.5f, -0.5f}));
}

TEST_F(AggregatorTest, SyncPullWaitsForTheRoundAndTimesOutNamingMissing) {
  auto agg = *Aggregator::Create(ConsistencyMode::kSync, 2);
  ASSERT_TRUE(agg->AwaitPull(0, 0, absl::Now() + absl::Seconds(1), nullptr).ok());
  ASSERT_TRUE(agg->Push(MakePush(0, 0, 1, {7}, {1, 1}, {0, 0, 0})).ok());
  absl::Status s =
      agg->AwaitPull(0, 1, absl::Now() + absl::Milliseconds(100), nullptr);
  EXPECT_EQ(s.code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_NE(s.message().find("workers [1]"), std::string::npos) << s;
  // Once worker 1 pushes, the waiting pull is released.
  std::thread pusher([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    ASSERT_TRUE(agg->Push(MakePush(1, 0, 1, {7}, {1, 1}, {0, 0, 0})).ok());
  });
  EXPECT_TRUE(agg->AwaitPull(0, 1, absl::Now() + absl::Seconds(10), nullptr).ok());
  pusher.join();
}

TEST_F(AggregatorTest, SyncStopsWaitingForAWorkerThatLeft) {
  auto agg = *Aggregator::Create(ConsistencyMode::kSync, 3);
  ASSERT_TRUE(agg->Push(MakePush(0, 0, 2, {7}, {1, 1}, {0, 0, 0})).ok());
  ASSERT_TRUE(agg->Push(MakePush(1, 0, 2, {7}, {1, 1}, {0, 0, 0})).ok());
  EXPECT_EQ(agg->applied_rounds(), 0u);
  agg->UpdateMembership(2, {0, 1});  // worker 2 is gone
  EXPECT_EQ(agg->applied_rounds(), 1u);
  EXPECT_EQ(Row(7), (std::vector<float>{-0.5f, -0.5f}));
  // A push from the departed worker is refused, not silently mixed in.
  absl::Status s = agg->Push(MakePush(2, 1, 1, {7}, {1, 1}, {0, 0, 0}));
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  // A stale epoch does not bring it back.
  agg->UpdateMembership(1, {0, 1, 2});
  EXPECT_EQ(agg->Push(MakePush(2, 1, 1, {7}, {1, 1}, {0, 0, 0})).code(),
            absl::StatusCode::kFailedPrecondition);
}

TEST_F(AggregatorTest, AsyncAppliesEachPushOnArrivalAndDropsRetries) {
  auto agg = *Aggregator::Create(ConsistencyMode::kAsync, 2);
  ASSERT_TRUE(agg->Push(MakePush(0, 0, 4, {7}, {1, 0}, {2, 0, 0})).ok());
  EXPECT_EQ(Row(7), (std::vector<float>{-0.5f, 0.0f}));
  ASSERT_TRUE(agg->Push(MakePush(1, 0, 1, {7}, {1, 0}, {0, 0, 0})).ok());
  ASSERT_TRUE(agg->Push(MakePush(1, 0, 1, {7}, {1, 0}, {0, 0, 0})).ok());  // retry
  EXPECT_EQ(Row(7), (std::vector<float>{-1.0f, 0.0f}));
  EXPECT_EQ(Dense(), (std::vector<float>{-1.0f, 0.0f, 0.0f}));
  EXPECT_EQ(agg->applied_rounds(), 2u);
  EXPECT_TRUE(agg->AwaitPull(0, 100, absl::Now(), nullptr).ok());
}

TEST(AggregatorCreateTest, SemiAsyncIsNotAvailableYet) {
  auto agg = Aggregator::Create(ConsistencyMode::kSemiAsync, 2);
  EXPECT_EQ(agg.status().code(), absl::StatusCode::kUnimplemented);
}

}  // namespace
}  // namespace hetps
