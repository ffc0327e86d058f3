#include "server/aggregator.h"

#include <gtest/gtest.h>

#include <atomic>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/synchronization/notification.h"
#include "gmock/gmock.h"
#include "support/fake_clock.h"
#include "support/test_support.h"
#include "table/optimizer.h"

namespace hetps {
namespace {

using ::testing::HasSubstr;

// A pull handed to Aggregator::AdmitPull: its outcome once decided.
struct Admission {
  absl::Notification decided;
  absl::Status status;
};

std::shared_ptr<Admission> Admit(Aggregator& agg, uint32_t worker,
                                 uint64_t clock, absl::Time deadline,
                                 std::function<bool()> cancelled = nullptr,
                                 uint32_t ahead = 0) {
  auto admission = std::make_shared<Admission>();
  std::optional<absl::Status> now =
      agg.AdmitPull({.worker_id = worker,
                     .clock = clock,
                     .ahead = ahead,
                     .deadline = deadline,
                     .cancelled = std::move(cancelled)},
                    [admission](absl::Status status) {
                      admission->status = std::move(status);
                      admission->decided.Notify();
                    });
  if (now) {
    admission->status = *now;
    admission->decided.Notify();
  }
  return admission;
}

// AdmitPull of a pull whose deadline is `now`: it is decided at once (OK,
// or DEADLINE_EXCEEDED).
absl::Status AdmitNow(Aggregator& agg, uint32_t worker, uint64_t clock,
                      absl::Time now) {
  std::shared_ptr<Admission> admission = Admit(agg, worker, clock, now);
  EXPECT_TRUE(admission->decided.HasBeenNotified());
  return admission->status;
}

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
                *Optimizer::Create(
                    SgdTable("emb", TableKind::kSparse, 2).optimizer),
                4),
        dense_(
            SgdTable("d", TableKind::kDense, 3), 0, 3,
            *Optimizer::Create(SgdTable("d", TableKind::kDense, 3).optimizer)) {
  }

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

  // Every aggregator here runs on it: deadlines and the time bound move
  // only when a test says so.
  testing::FakeClock clock_;
  SparseTable sparse_;
  DenseTable dense_;
  // Keep payloads alive (views point into them); deque-like stability.
  std::vector<std::vector<uint64_t>> keys_ =
      std::vector<std::vector<uint64_t>>();
  std::vector<std::vector<float>> grads_, dense_grads_;

  void SetUp() override {
    keys_.reserve(64);
    grads_.reserve(64);
    dense_grads_.reserve(64);
  }
};

TEST_F(AggregatorTest, SyncMergesByBatchSizeAndAppliesOncePerRound) {
  auto agg = *Aggregator::Create(ConsistencyMode::kSync, 2, {}, clock_);
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

// A full round (one push from each worker) takes a full step, whatever the
// configured job batch (64 here: only the guess before the first full
// round) and also when a chunk ended in a short batch (4 + 2), as a short
// last batch does in local training. Once worker 1 has left, worker 0's
// rounds take their share of the last full round's samples (4 + 4), so the
// end of an epoch moves the model no further per sample than the rest.
TEST_F(AggregatorTest, SyncRoundWithoutTheWorkersThatLeftTakesItsShare) {
  AggregatorOptions options;
  options.job_batch = 64;
  auto agg = *Aggregator::Create(ConsistencyMode::kSync, 2, options, clock_);
  auto round = [&](uint64_t clock, uint32_t b0, uint32_t b1) {
    ASSERT_TRUE(agg->Push(MakePush(0, clock, b0, {7}, {2, 2}, {0, 0, 0})).ok());
    ASSERT_TRUE(agg->Push(MakePush(1, clock, b1, {7}, {2, 2}, {0, 0, 0})).ok());
  };
  round(0, 4, 4);
  EXPECT_EQ(Row(7), (std::vector<float>{-1.0f, -1.0f}));  // sgd 0.5 · 2
  round(1, 4, 2);
  EXPECT_EQ(Row(7), (std::vector<float>{-2.0f, -2.0f}));
  round(2, 4, 4);
  EXPECT_EQ(Row(7), (std::vector<float>{-3.0f, -3.0f}));
  agg->UpdateMembership(1, {0});
  ASSERT_TRUE(agg->Push(MakePush(0, 3, 4, {7}, {2, 2}, {0, 0, 0})).ok());
  EXPECT_EQ(Row(7), (std::vector<float>{-3.5f, -3.5f}));  // 4 of 8
  ASSERT_TRUE(agg->Push(MakePush(0, 4, 2, {7}, {2, 2}, {2, 0, 0})).ok());
  EXPECT_EQ(Row(7), (std::vector<float>{-3.75f, -3.75f}));  // 2 of 8
  EXPECT_EQ(Dense(), (std::vector<float>{-0.25f, 0.0f, 0.0f}));
  EXPECT_EQ(agg->applied_rounds(), 5u);
}

// With warmup_rounds 2 and full rounds of 4 samples, the applies that
// bring the samples applied to 4 and then 8 take 1/2 and then all of a
// step; later ones a full step.
TEST_F(AggregatorTest, SyncWarmsUpOverTheFirstRounds) {
  AggregatorOptions options;
  options.job_batch = 4;
  options.warmup_rounds = 2;
  auto agg = *Aggregator::Create(ConsistencyMode::kSync, 2, options, clock_);
  auto round = [&](uint64_t clock) {
    ASSERT_TRUE(agg->Push(MakePush(0, clock, 2, {7}, {2, 2}, {2, 0, 0})).ok());
    ASSERT_TRUE(agg->Push(MakePush(1, clock, 2, {7}, {2, 2}, {2, 0, 0})).ok());
  };
  round(0);
  EXPECT_EQ(Row(7), (std::vector<float>{-0.5f, -0.5f}));  // sgd 0.5 · 2 · 1/2
  EXPECT_EQ(Dense(), (std::vector<float>{-0.5f, 0.0f, 0.0f}));
  round(1);
  EXPECT_EQ(Row(7), (std::vector<float>{-1.5f, -1.5f}));
  round(2);
  EXPECT_EQ(Row(7), (std::vector<float>{-2.5f, -2.5f}));
}

// Restored tables hold trained values: no warm-up after TablesRestored.
TEST_F(AggregatorTest, RestoredTablesDoNotWarmUpAgain) {
  AggregatorOptions options;
  options.job_batch = 4;
  options.warmup_rounds = 2;
  options.window = 10;
  for (ConsistencyMode mode :
       {ConsistencyMode::kSync, ConsistencyMode::kSemiAsync}) {
    sparse_.RestoreRow(7, std::vector<float>{0, 0}, {}, 0);
    auto agg = *Aggregator::Create(mode, 2, options, clock_);
    agg->TablesRestored();
    ASSERT_TRUE(agg->Push(MakePush(0, 0, 2, {7}, {2, 2}, {0, 0, 0})).ok());
    ASSERT_TRUE(agg->Push(MakePush(1, 0, 2, {7}, {2, 2}, {0, 0, 0})).ok());
    EXPECT_EQ(Row(7), (std::vector<float>{-1.0f, -1.0f}))
        << ConsistencyModeName(mode);
  }
}

TEST_F(AggregatorTest, SyncRetriedPushIsNotAppliedTwice) {
  auto agg = *Aggregator::Create(ConsistencyMode::kSync, 2, {}, clock_);
  ASSERT_TRUE(agg->Push(MakePush(0, 0, 1, {7}, {1, 1}, {0, 0, 0})).ok());
  // The same push again (a retry whose first reply was lost).
  ASSERT_TRUE(agg->Push(MakePush(0, 0, 1, {7}, {1, 1}, {0, 0, 0})).ok());
  ASSERT_TRUE(agg->Push(MakePush(1, 0, 1, {7}, {1, 1}, {0, 0, 0})).ok());
  // And a retry after the round closed.
  ASSERT_TRUE(agg->Push(MakePush(1, 0, 1, {7}, {1, 1}, {0, 0, 0})).ok());
  EXPECT_EQ(agg->applied_rounds(), 1u);
  EXPECT_EQ(Row(7), (std::vector<float>{-0.5f, -0.5f}));
}

// A server restarted from a checkpoint meets workers at round 5: the
// rounds before close empty once every live worker is known past them, and
// round 5 is applied from the pushes that arrive.
TEST_F(AggregatorTest, SyncRestartedServerJoinsTheRoundItsWorkersAreIn) {
  auto agg = *Aggregator::Create(ConsistencyMode::kSync, 2, {}, clock_);
  // Worker 0 pulls at clock 6 (it pushed round 5 elsewhere before the
  // restart); worker 1 retries its push of round 5.
  absl::Status early = AdmitNow(*agg, 0, 6, clock_.Now());
  EXPECT_EQ(early.code(), absl::StatusCode::kDeadlineExceeded)
      << "worker 1 is not known past round 0 yet";
  EXPECT_EQ(agg->applied_rounds(), 0u);
  ASSERT_TRUE(agg->Push(MakePush(1, 5, 1, {7}, {2, 2}, {0, 0, 0})).ok());
  // Rounds 0..4 closed empty; round 5 holds worker 1's push and closes too
  // (worker 0 is past it): applied once, as its only gradient.
  EXPECT_EQ(agg->applied_rounds(), 6u);
  EXPECT_EQ(Row(7), (std::vector<float>{-1.0f, -1.0f}));
  EXPECT_TRUE(AdmitNow(*agg, 0, 6, clock_.Now()).ok());
  EXPECT_EQ(agg->RejoinClock(1), 6u);
}

TEST_F(AggregatorTest, RejoinClockIsWhereTheJobIs) {
  auto async = *Aggregator::Create(ConsistencyMode::kAsync, 2, {}, clock_);
  ASSERT_TRUE(async->Push(MakePush(1, 0, 1, {7}, {1, 1}, {0, 0, 0})).ok());
  ASSERT_TRUE(async->Push(MakePush(1, 1, 1, {7}, {1, 1}, {0, 0, 0})).ok());
  EXPECT_EQ(async->RejoinClock(1), 2u);
  EXPECT_EQ(async->RejoinClock(0), 0u);
  AggregatorOptions options;
  options.window = 8;
  auto semi =
      *Aggregator::Create(ConsistencyMode::kSemiAsync, 2, options, clock_);
  for (uint64_t c = 0; c < 4; ++c) {
    ASSERT_TRUE(semi->Push(MakePush(0, c, 1, {7}, {1, 1}, {0, 0, 0})).ok());
  }
  ASSERT_TRUE(semi->Push(MakePush(1, 0, 1, {7}, {1, 1}, {0, 0, 0})).ok());
  // Worker 1 (clock 1) restarts: it continues at the slowest other live
  // worker's clock (worker 0, clock 4), not at its own old one.
  EXPECT_EQ(semi->RejoinClock(1), 4u);
}

// Worker 0 pushed round 0 and left; worker 1 is gone too before pushing:
// the round is applied with what it holds, not dropped.
TEST_F(AggregatorTest, SyncAppliesAPushedRoundWhenEveryWorkerIsGone) {
  auto agg = *Aggregator::Create(ConsistencyMode::kSync, 2, {}, clock_);
  ASSERT_TRUE(agg->Push(MakePush(0, 0, 1, {7}, {2, 2}, {0, 0, 0})).ok());
  EXPECT_EQ(agg->applied_rounds(), 0u);
  agg->UpdateMembership(1, {});
  EXPECT_EQ(agg->applied_rounds(), 1u);
  EXPECT_EQ(Row(7), (std::vector<float>{-1.0f, -1.0f}));
}

TEST_F(AggregatorTest, SyncPullWaitsForTheRoundAndTimesOutNamingMissing) {
  auto agg = *Aggregator::Create(ConsistencyMode::kSync, 2, {}, clock_);
  ASSERT_TRUE(AdmitNow(*agg, 0, 0, clock_.Now()).ok());
  ASSERT_TRUE(agg->Push(MakePush(0, 0, 1, {7}, {1, 1}, {0, 0, 0})).ok());
  absl::Status s = AdmitNow(*agg, 0, 1, clock_.Now());
  EXPECT_EQ(s.code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_NE(s.message().find("workers [1]"), std::string::npos) << s;
  // Once worker 1 pushes, the waiting pull is released, by that push.
  auto pull = Admit(*agg, 0, 1, clock_.Now() + absl::Seconds(10));
  EXPECT_FALSE(pull->decided.HasBeenNotified());
  ASSERT_TRUE(agg->Push(MakePush(1, 0, 1, {7}, {1, 1}, {0, 0, 0})).ok());
  ASSERT_TRUE(pull->decided.HasBeenNotified());
  EXPECT_TRUE(pull->status.ok()) << pull->status;
}

// A pull read one step ahead (the client's prefetch) is admitted as a pull
// at the next clock, after the worker's own push before it, while the
// worker's clock stays where its pushes left it.
TEST_F(AggregatorTest, APullReadAheadIsAdmittedAsOneAfterTheNextPush) {
  const absl::Time later = clock_.Now() + absl::Seconds(10);
  auto sync = *Aggregator::Create(ConsistencyMode::kSync, 2, {}, clock_);
  // Worker 0's rows for its push 1 wait for round 0, its own push in it.
  auto pull = Admit(*sync, 0, 0, later, nullptr, /*ahead=*/1);
  EXPECT_FALSE(pull->decided.HasBeenNotified());
  ASSERT_TRUE(sync->Push(MakePush(0, 0, 1, {7}, {1, 1}, {0, 0, 0})).ok());
  EXPECT_FALSE(pull->decided.HasBeenNotified());
  ASSERT_TRUE(sync->Push(MakePush(1, 0, 1, {7}, {1, 1}, {0, 0, 0})).ok());
  ASSERT_TRUE(pull->decided.HasBeenNotified());
  EXPECT_TRUE(pull->status.ok()) << pull->status;

  // semi_async: within the window as a pull at the next clock, and once
  // the worker's own push before it has arrived.
  AggregatorOptions options;
  options.window = 1;
  auto semi =
      *Aggregator::Create(ConsistencyMode::kSemiAsync, 2, options, clock_);
  ASSERT_TRUE(semi->Push(MakePush(0, 0, 1, {7}, {0, 0}, {0, 0, 0})).ok());
  // Worker 0 at clock 1, worker 1 at 0: a pull at 1 is within the window.
  EXPECT_TRUE(AdmitNow(*semi, 0, 1, clock_.Now()).ok());
  // One for push 2 waits for push 1, then for the window (2 > 0 + 1).
  auto ahead = Admit(*semi, 0, 1, later, nullptr, /*ahead=*/1);
  EXPECT_FALSE(ahead->decided.HasBeenNotified());
  ASSERT_TRUE(semi->Push(MakePush(0, 1, 1, {7}, {0, 0}, {0, 0, 0})).ok());
  EXPECT_FALSE(ahead->decided.HasBeenNotified());
  // Worker 1's pull ahead at clock 0 waits for its push 0, and its clock
  // stays 0 meanwhile.
  auto other = Admit(*semi, 1, 0, later, nullptr, /*ahead=*/1);
  EXPECT_FALSE(other->decided.HasBeenNotified());
  EXPECT_FALSE(ahead->decided.HasBeenNotified());
  ASSERT_TRUE(semi->Push(MakePush(1, 0, 1, {7}, {0, 0}, {0, 0, 0})).ok());
  ASSERT_TRUE(other->decided.HasBeenNotified());
  EXPECT_TRUE(other->status.ok()) << other->status;
  ASSERT_TRUE(ahead->decided.HasBeenNotified());
  EXPECT_TRUE(ahead->status.ok()) << ahead->status;
}

// The time a pull ahead waits for its worker's own push is compute, not
// the staleness bound's: only what it waits after that push counts (the
// window controller and the diagnostics read these).
TEST_F(AggregatorTest, APullAheadWaitsAtTheBoundOnlyAfterItsOwnPush) {
  AggregatorOptions options;
  options.window = 1;
  auto agg =
      *Aggregator::Create(ConsistencyMode::kSemiAsync, 2, options, clock_);
  const absl::Time later = clock_.Now() + absl::Seconds(60);
  // Worker 0 at clock 0 asks for the rows of its push 1, then computes.
  auto ahead = Admit(*agg, 0, 0, later, nullptr, /*ahead=*/1);
  clock_.Advance(absl::Seconds(2));
  ASSERT_TRUE(agg->Push(MakePush(0, 0, 1, {7}, {0, 0}, {0, 0, 0})).ok());
  ASSERT_TRUE(ahead->decided.HasBeenNotified());
  EXPECT_TRUE(ahead->status.ok()) << ahead->status;
  EXPECT_EQ(agg->Stats().ssp_waits(), 0u);
  EXPECT_EQ(agg->Stats().ssp_wait_seconds(), 0.0);
  // Its next one (for push 2) is held by the bound once push 1 is in
  // (2 > worker 1's 0 + 1): 3 s there, not the 5 s since it was sent.
  ahead = Admit(*agg, 0, 1, later, nullptr, /*ahead=*/1);
  clock_.Advance(absl::Seconds(2));
  ASSERT_TRUE(agg->Push(MakePush(0, 1, 1, {7}, {0, 0}, {0, 0, 0})).ok());
  EXPECT_FALSE(ahead->decided.HasBeenNotified());
  EXPECT_EQ(agg->Stats().ssp_waits(), 1u);
  clock_.Advance(absl::Seconds(3));
  ASSERT_TRUE(agg->Push(MakePush(1, 0, 1, {7}, {0, 0}, {0, 0, 0})).ok());
  ASSERT_TRUE(ahead->decided.HasBeenNotified());
  EXPECT_TRUE(ahead->status.ok()) << ahead->status;
  EXPECT_EQ(agg->Stats().ssp_waits(), 1u);
  EXPECT_DOUBLE_EQ(agg->Stats().ssp_wait_seconds(), 3.0);
  // Per worker too (the window controller judges by the most-held one).
  std::map<uint32_t, double> held;
  const AggregatorStats stats = agg->Stats();
  for (const rpc::WorkerClock& c : stats.clocks()) {
    held[c.worker()] = c.ssp_wait_seconds();
  }
  EXPECT_EQ(held, (std::map<uint32_t, double>{{0, 3.0}, {1, 0.0}}));
}

// A worker pulls its tables at once: held together, they count once — its
// time held is wall time, which a period's share of can never pass 100%.
// A hold still going counts up to now.
TEST_F(AggregatorTest, AWorkersTimeHeldIsWallTimeAndCountsWhileHeld) {
  AggregatorOptions options;
  options.window = 1;
  auto agg =
      *Aggregator::Create(ConsistencyMode::kSemiAsync, 2, options, clock_);
  const absl::Time later = clock_.Now() + absl::Seconds(60);
  // Worker 0 at clock 2, worker 1 at 0: 2 > 0 + 1 holds both pulls.
  auto sparse = Admit(*agg, 0, 2, later);
  auto dense = Admit(*agg, 0, 2, later);
  clock_.Advance(absl::Seconds(2));
  const auto held = [&] {
    const AggregatorStats stats = agg->Stats();
    std::map<uint32_t, double> by_worker;
    for (const rpc::WorkerClock& c : stats.clocks()) {
      by_worker[c.worker()] = c.ssp_wait_seconds();
    }
    return std::pair{stats.ssp_wait_seconds(), by_worker};
  };
  EXPECT_FALSE(sparse->decided.HasBeenNotified());
  EXPECT_EQ(held().first, 2.0);
  EXPECT_EQ(held().second.at(0), 2.0);
  clock_.Advance(absl::Seconds(1));
  ASSERT_TRUE(agg->Push(MakePush(1, 0, 1, {7}, {0, 0}, {0, 0, 0})).ok());
  ASSERT_TRUE(sparse->decided.HasBeenNotified());
  ASSERT_TRUE(dense->decided.HasBeenNotified());
  EXPECT_EQ(agg->Stats().ssp_waits(), 2u);
  EXPECT_EQ(held().first, 3.0);
  EXPECT_EQ(held().second, (std::map<uint32_t, double>{{0, 3.0}, {1, 0.0}}));
  // Ended: no longer growing.
  clock_.Advance(absl::Seconds(5));
  EXPECT_EQ(held().first, 3.0);
}

TEST_F(AggregatorTest, AWaitingPullEndsAtItsDeadlineOrWhenCancelled) {
  for (ConsistencyMode mode :
       {ConsistencyMode::kSync, ConsistencyMode::kSemiAsync}) {
    SCOPED_TRACE(ConsistencyModeName(mode));
    AggregatorOptions options;
    options.window = 1;
    auto agg = *Aggregator::Create(mode, 2, options, clock_);
    for (uint64_t c = 0; c < 2; ++c) {
      ASSERT_TRUE(agg->Push(MakePush(0, c, 1, {7}, {0, 0}, {0, 0, 0})).ok());
    }
    // Worker 1 never pushes: sync's round 0 stays open, semi_async's
    // bound holds worker 0 at clock 2 (2 - 0 > window 1).
    auto timed = Admit(*agg, 0, 2, clock_.Now() + absl::Seconds(5));
    std::atomic<bool> gone{false};
    auto cancelled = Admit(*agg, 0, 2, clock_.Now() + absl::Seconds(60),
                           [&gone] { return gone.load(); });
    EXPECT_FALSE(timed->decided.HasBeenNotified());
    EXPECT_FALSE(cancelled->decided.HasBeenNotified());
    // The timer thread decides both: it runs as the fake clock moves.
    gone = true;
    clock_.Advance(absl::Seconds(5));
    timed->decided.WaitForNotification();
    cancelled->decided.WaitForNotification();
    EXPECT_EQ(timed->status.code(), absl::StatusCode::kDeadlineExceeded)
        << timed->status;
    EXPECT_EQ(cancelled->status.code(), absl::StatusCode::kCancelled)
        << cancelled->status;
  }
}

TEST_F(AggregatorTest, HundredsOfWaitingPullsHoldNoThread) {
  constexpr uint32_t kWorkers = 300;
  for (ConsistencyMode mode :
       {ConsistencyMode::kSync, ConsistencyMode::kSemiAsync}) {
    SCOPED_TRACE(ConsistencyModeName(mode));
    AggregatorOptions options;
    options.window = 1;
    auto agg = *Aggregator::Create(mode, kWorkers, options, clock_);
    const int threads_before = testing::ThreadsOfThisProcess();
    // Every worker but the last pushes twice and pulls at clock 2: sync
    // waits for round 0, semi_async for the slowest (the last, at 0).
    std::vector<std::shared_ptr<Admission>> pulls;
    for (uint32_t w = 0; w + 1 < kWorkers; ++w) {
      for (uint64_t c = 0; c < 2; ++c) {
        ASSERT_TRUE(agg->Push(MakePush(w, c, 1, {7}, {0, 0}, {0, 0, 0})).ok());
      }
      pulls.push_back(Admit(*agg, w, 2, clock_.Now() + absl::Seconds(60)));
    }
    EXPECT_EQ(testing::ThreadsOfThisProcess(), threads_before);
    for (const auto& pull : pulls)
      EXPECT_FALSE(pull->decided.HasBeenNotified());
    // The last worker's two pushes let every pull go, on its thread.
    for (uint64_t c = 0; c < 2; ++c) {
      ASSERT_TRUE(
          agg->Push(MakePush(kWorkers - 1, c, 1, {7}, {0, 0}, {0, 0, 0})).ok());
    }
    for (const auto& pull : pulls) {
      ASSERT_TRUE(pull->decided.HasBeenNotified());
      EXPECT_TRUE(pull->status.ok()) << pull->status;
    }
  }
}

TEST_F(AggregatorTest, SyncStopsWaitingForAWorkerThatLeft) {
  auto agg = *Aggregator::Create(ConsistencyMode::kSync, 3, {}, clock_);
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

// issue 15: a worker the coordinator dropped (its chunk went to another)
// may still push when it runs again: async and semi_async refuse it as sync
// does, until the live set holds it again (it registered again).
TEST_F(AggregatorTest, EveryModeRefusesADroppedWorkerUntilItIsBack) {
  for (ConsistencyMode mode :
       {ConsistencyMode::kAsync, ConsistencyMode::kSemiAsync,
        ConsistencyMode::kSync}) {
    SCOPED_TRACE(ConsistencyModeName(mode));
    auto agg = *Aggregator::Create(mode, 2, {}, clock_);
    agg->UpdateMembership(2, {0});  // worker 1 was dropped
    const absl::Status s =
        agg->Push(MakePush(1, 0, 1, {11}, {1, 1}, {0, 0, 0}));
    EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
    EXPECT_THAT(s.message(), HasSubstr("worker 1 is not in the live set"));
    EXPECT_EQ(agg->Stats().pushes(), 0u);
    agg->UpdateMembership(3, {0, 1});  // it registered again
    EXPECT_TRUE(agg->Push(MakePush(1, 0, 1, {11}, {1, 1}, {0, 0, 0})).ok());
    EXPECT_EQ(agg->Stats().pushes(), 1u);
  }
}

TEST_F(AggregatorTest, AsyncAppliesEachPushOnArrivalAndDropsRetries) {
  auto agg = *Aggregator::Create(ConsistencyMode::kAsync, 2, {}, clock_);
  ASSERT_TRUE(agg->Push(MakePush(0, 0, 4, {7}, {1, 0}, {2, 0, 0})).ok());
  EXPECT_EQ(Row(7), (std::vector<float>{-0.5f, 0.0f}));
  ASSERT_TRUE(agg->Push(MakePush(1, 0, 1, {7}, {1, 0}, {0, 0, 0})).ok());
  ASSERT_TRUE(
      agg->Push(MakePush(1, 0, 1, {7}, {1, 0}, {0, 0, 0})).ok());  // retry
  EXPECT_EQ(Row(7), (std::vector<float>{-1.0f, 0.0f}));
  EXPECT_EQ(Dense(), (std::vector<float>{-1.0f, 0.0f, 0.0f}));
  EXPECT_EQ(agg->applied_rounds(), 2u);
  EXPECT_TRUE(AdmitNow(*agg, 0, 100, clock_.Now()).ok());
}

TEST_F(AggregatorTest, AsyncAcceptsBeforeTheApplyAndHoldsThatWorkersPulls) {
  auto agg = *Aggregator::Create(ConsistencyMode::kAsync, 2, {}, clock_);
  std::shared_ptr<Admission> own, other;
  int calls = 0;
  ASSERT_TRUE(agg->Push(MakePush(0, 0, 1, {7}, {1, 0}, {2, 0, 0}),
                        [&] {
                          ++calls;
                          // Accepted, not yet applied.
                          EXPECT_EQ(Row(7), (std::vector<float>{0.0f, 0.0f}));
                          EXPECT_EQ(agg->applied_rounds(), 0u);
                          // Its worker's pull waits for the apply; another
                          // worker's does not.
                          own = Admit(*agg, 0, 1, clock_.Now());
                          other = Admit(*agg, 1, 0, clock_.Now());
                          EXPECT_FALSE(own->decided.HasBeenNotified());
                          EXPECT_TRUE(other->decided.HasBeenNotified());
                        })
                  .ok());
  EXPECT_EQ(calls, 1);
  ASSERT_NE(own, nullptr);
  // Let go once applied, whatever its deadline (it was due at once).
  ASSERT_TRUE(own->decided.HasBeenNotified());
  EXPECT_TRUE(own->status.ok()) << own->status;
  EXPECT_TRUE(other->status.ok()) << other->status;
  EXPECT_EQ(Row(7), (std::vector<float>{-0.5f, 0.0f}));
  EXPECT_EQ(Dense(), (std::vector<float>{-1.0f, 0.0f, 0.0f}));
  EXPECT_EQ(agg->applied_rounds(), 1u);
  // Nothing held afterwards.
  EXPECT_TRUE(AdmitNow(*agg, 0, 1, clock_.Now()).ok());

  // A retry is acknowledged after Push returns, as before: not accepted
  // again, not applied again.
  ASSERT_TRUE(
      agg->Push(MakePush(0, 0, 1, {7}, {1, 0}, {2, 0, 0}), [&] { ++calls; })
          .ok());
  EXPECT_EQ(calls, 1);
  EXPECT_EQ(Row(7), (std::vector<float>{-0.5f, 0.0f}));
  // Nor is a push refused: from a worker outside the live set.
  agg->UpdateMembership(1, {0});
  EXPECT_EQ(
      agg->Push(MakePush(1, 0, 1, {7}, {1, 0}, {0, 0, 0}), [&] { ++calls; })
          .code(),
      absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(calls, 1);
  EXPECT_EQ(Row(7), (std::vector<float>{-0.5f, 0.0f}));
}

TEST_F(AggregatorTest, OnlyAsyncAnswersAPushBeforeItReturns) {
  // sync merges and semi_async queues: their pushes are answered when Push
  // returns, so they never call `accepted`.
  for (ConsistencyMode mode :
       {ConsistencyMode::kSync, ConsistencyMode::kSemiAsync}) {
    auto agg = *Aggregator::Create(mode, 1, {}, clock_);
    int calls = 0;
    ASSERT_TRUE(
        agg->Push(MakePush(0, 0, 1, {7}, {1, 0}, {0, 0, 0}), [&] { ++calls; })
            .ok());
    EXPECT_EQ(calls, 0) << static_cast<int>(mode);
  }
}

// ------------------------------------------------------------ semi_async

std::unique_ptr<Aggregator> SemiAsync(uint32_t workers, uint32_t window,
                                      Clock& clock) {
  AggregatorOptions options;
  options.window = window;
  options.semi_async.flush_after_s = 1.0;
  options.semi_async.staleness_decay = 0.5;
  return *Aggregator::Create(ConsistencyMode::kSemiAsync, workers,
                             std::move(options), clock);
}

TEST_F(AggregatorTest, SemiAsyncAppliesWhenTheQueueHoldsWindowPushes) {
  auto agg = SemiAsync(3, 2, clock_);
  ASSERT_TRUE(agg->Push(MakePush(0, 0, 1, {7}, {2, 0}, {0, 0, 0})).ok());
  EXPECT_EQ(Row(7), (std::vector<float>{0, 0}));  // queued, not applied
  EXPECT_EQ(agg->Stats().queue_length(), 1u);
  ASSERT_TRUE(agg->Push(MakePush(0, 1, 3, {7}, {2, 4}, {0, 0, 0})).ok());
  // Σ b·g / Σ b = (1·(2,0) + 3·(2,4)) / 4 = (2, 3); sgd lr 0.5.
  EXPECT_EQ(Row(7), (std::vector<float>{-1.0f, -1.5f}));
  const AggregatorStats st = agg->Stats();
  EXPECT_EQ(st.applies(), 1u);
  EXPECT_EQ(st.applies_by_window(), 1u);
  EXPECT_EQ(st.queue_length(), 0u);
  EXPECT_EQ(st.pushes(), 2u);
  EXPECT_EQ(st.pushes_into_empty(), 1u);
}

TEST_F(AggregatorTest, SemiAsyncAppliesOnceEveryLiveWorkerContributed) {
  auto agg = SemiAsync(2, 10, clock_);
  ASSERT_TRUE(agg->Push(MakePush(0, 0, 1, {7}, {1, 1}, {0, 0, 0})).ok());
  EXPECT_EQ(agg->applied_rounds(), 0u);
  ASSERT_TRUE(agg->Push(MakePush(1, 0, 1, {7}, {1, 1}, {0, 0, 0})).ok());
  EXPECT_EQ(agg->applied_rounds(), 1u);
  EXPECT_EQ(agg->Stats().applies_by_all(), 1u);
  EXPECT_EQ(Row(7), (std::vector<float>{-0.5f, -0.5f}));
}

TEST_F(AggregatorTest, SemiAsyncTimeBoundAppliesAnOldQueue) {
  auto agg = SemiAsync(3, 10, clock_);
  ASSERT_TRUE(agg->Push(MakePush(0, 0, 1, {7}, {1, 1}, {0, 0, 0})).ok());
  clock_.Advance(absl::Milliseconds(999));
  ASSERT_TRUE(AdmitNow(*agg, 0, 1, clock_.Now()).ok());
  EXPECT_EQ(agg->applied_rounds(), 0u);  // not old enough yet
  clock_.Advance(absl::Milliseconds(1));
  ASSERT_TRUE(AdmitNow(*agg, 0, 1, clock_.Now()).ok());
  EXPECT_EQ(agg->applied_rounds(), 1u);
  EXPECT_EQ(agg->Stats().applies_by_time(), 1u);
  EXPECT_EQ(Row(7), (std::vector<float>{-0.5f, -0.5f}));
}

TEST_F(AggregatorTest, SemiAsyncWeighsStaleGradientsDown) {
  // Window 1: every push is applied at once, so versions count pushes.
  auto agg = SemiAsync(2, 1, clock_);
  ASSERT_TRUE(AdmitNow(*agg, 0, 0, clock_.Now()).ok());  // w0 reads v0
  std::vector<float> read(2);
  const uint64_t key = 7;
  agg->PullSparse(0, &sparse_, {&key, 1}, read);
  ASSERT_TRUE(agg->Push(MakePush(1, 0, 1, {9}, {0, 0}, {0, 0, 0})).ok());
  ASSERT_TRUE(agg->Push(MakePush(1, 1, 1, {9}, {0, 0}, {0, 0, 0})).ok());
  // w0's gradient was computed on v0 and arrives at v2: staleness 2, weight
  // 1 / (1 + 0.5·2) = 0.5: half a step, sgd lr 0.5: 0 - 0.5 · 0.5 · 2.
  ASSERT_TRUE(agg->Push(MakePush(0, 0, 4, {7}, {2, 2}, {0, 0, 0})).ok());
  EXPECT_EQ(Row(7), (std::vector<float>{-0.5f, -0.5f}));
  const AggregatorStats st = agg->Stats();
  EXPECT_EQ(st.max_staleness(), 2u);
  ASSERT_EQ(st.clocks_size(), 2);
  EXPECT_EQ(st.clocks(0).last_staleness(), 2u);
  EXPECT_EQ(st.clocks(0).clock(), 1u);
  EXPECT_EQ(st.clocks(1).clock(), 2u);
}

// A live worker's pull while the queue holds pushes reads the rows as the
// queue's apply would leave them, taking the queued share of its step:
// here 2 of the 4 samples the job's step holds, so half a step.
TEST_F(AggregatorTest, SemiAsyncReadsAheadOfTheQueue) {
  AggregatorOptions options;
  options.window = 10;
  options.job_batch = 4;
  auto agg =
      *Aggregator::Create(ConsistencyMode::kSemiAsync, 2, options, clock_);
  const uint64_t key = 7;
  std::vector<float> read(2), dense(3);
  ASSERT_TRUE(agg->Push(MakePush(0, 0, 2, {7}, {2, 4}, {1, 0, 0})).ok());
  ASSERT_TRUE(AdmitNow(*agg, 0, 1, clock_.Now()).ok());
  agg->PullSparse(0, &sparse_, {&key, 1}, read);
  agg->PullDense(0, &dense_, dense);
  // Mean gradient (2, 4), sgd lr 0.5, half a step.
  EXPECT_EQ(read, (std::vector<float>{-0.5f, -1.0f}));
  EXPECT_EQ(dense, (std::vector<float>{-0.25f, 0.0f, 0.0f}));
  // The tables did not move, and a reader outside the live set (rank 0's
  // evaluator) sees them as they are.
  EXPECT_EQ(Row(7), (std::vector<float>{0.0f, 0.0f}));
  agg->PullSparse(99, &sparse_, {&key, 1}, read);
  EXPECT_EQ(read, (std::vector<float>{0.0f, 0.0f}));
  // Worker 1 completes the queue: one full step with the mean of both.
  ASSERT_TRUE(agg->Push(MakePush(1, 0, 2, {7}, {0, 0}, {1, 0, 0})).ok());
  EXPECT_EQ(agg->applied_rounds(), 1u);
  EXPECT_EQ(Row(7), (std::vector<float>{-0.5f, -1.0f}));
  agg->PullSparse(0, &sparse_, {&key, 1}, read);
  EXPECT_EQ(read, Row(7));  // nothing queued: the table as it is
  // Worker 0 read ahead of apply 1 and pushes after it: not stale.
  ASSERT_TRUE(agg->Push(MakePush(0, 1, 2, {7}, {0, 0}, {0, 0, 0})).ok());
  const AggregatorStats st = agg->Stats();
  EXPECT_EQ(st.max_staleness(), 0u);
  EXPECT_EQ(st.pulls_ahead(), 2u);  // worker 0's sparse and dense reads
}

// semi_async warms up by the samples its applies hold, and a read ahead of
// the queue shows the warmed-up step the apply will take.
TEST_F(AggregatorTest, SemiAsyncWarmsUpAndReadsAheadTheWarmedUpStep) {
  AggregatorOptions options;
  options.window = 10;
  options.job_batch = 4;
  options.warmup_rounds = 2;
  auto agg =
      *Aggregator::Create(ConsistencyMode::kSemiAsync, 2, options, clock_);
  const uint64_t key = 7;
  std::vector<float> read(2);
  ASSERT_TRUE(agg->Push(MakePush(0, 0, 2, {7}, {2, 4}, {0, 0, 0})).ok());
  ASSERT_TRUE(AdmitNow(*agg, 0, 1, clock_.Now()).ok());
  agg->PullSparse(0, &sparse_, {&key, 1}, read);
  // Half a round queued: half a step, warmed up to 2 of 8 samples.
  EXPECT_EQ(read, (std::vector<float>{-0.125f, -0.25f}));
  ASSERT_TRUE(agg->Push(MakePush(1, 0, 2, {7}, {2, 4}, {0, 0, 0})).ok());
  // A full round, warmed up to 4 of 8: half a step.
  EXPECT_EQ(Row(7), (std::vector<float>{-0.5f, -1.0f}));
  ASSERT_TRUE(AdmitNow(*agg, 1, 1, clock_.Now()).ok());
  agg->PullSparse(1, &sparse_, {&key, 1}, read);  // fresh: no stale weight
  ASSERT_TRUE(agg->Push(MakePush(0, 1, 2, {7}, {2, 4}, {0, 0, 0})).ok());
  ASSERT_TRUE(agg->Push(MakePush(1, 1, 2, {7}, {2, 4}, {0, 0, 0})).ok());
  EXPECT_EQ(Row(7), (std::vector<float>{-1.5f, -3.0f}));  // 8 of 8: full
}

TEST_F(AggregatorTest, SemiAsyncLookaheadOffReadsTheTables) {
  AggregatorOptions options;
  options.window = 10;
  options.semi_async.lookahead = false;
  auto agg =
      *Aggregator::Create(ConsistencyMode::kSemiAsync, 2, options, clock_);
  ASSERT_TRUE(agg->Push(MakePush(0, 0, 2, {7}, {2, 4}, {0, 0, 0})).ok());
  const uint64_t key = 7;
  std::vector<float> read(2, 9.0f);
  agg->PullSparse(0, &sparse_, {&key, 1}, read);
  EXPECT_EQ(read, (std::vector<float>{0.0f, 0.0f}));
  EXPECT_EQ(agg->Stats().pulls_ahead(), 0u);
}

// The staleness weight shortens the step under adagrad too, where a weight
// on the gradient alone would be divided out again.
TEST_F(AggregatorTest, SemiAsyncStaleWeightShortensAnAdagradStep) {
  TableConfig config = SgdTable("ada", TableKind::kSparse, 1);
  config.optimizer.type = "adagrad";
  config.optimizer.learning_rate = 0.1f;
  config.optimizer.epsilon = 1e-12f;
  auto run = [&](uint64_t stale_by) {
    SparseTable table(config, *Optimizer::Create(config.optimizer), 1);
    auto agg = SemiAsync(2, 1, clock_);
    const uint64_t key = 5, other = 6;
    std::vector<float> read(1);
    agg->PullSparse(0, &table, {&key, 1}, read);  // worker 0 reads v0
    const float zero = 0.0f, two = 2.0f;
    for (uint64_t c = 0; c < stale_by; ++c) {
      PushView v;
      v.worker_id = 1;
      v.clock = c;
      v.sparse.push_back({&table, {&other, 1}, {&zero, 1}});
      EXPECT_TRUE(agg->Push(v).ok());
    }
    PushView v;
    v.worker_id = 0;
    v.clock = 0;
    v.sparse.push_back({&table, {&key, 1}, {&two, 1}});
    EXPECT_TRUE(agg->Push(v).ok());
    table.Pull({&key, 1}, read);
    return read[0];
  };
  // First adagrad step: -lr · g / |g| · weight; weight 1 / (1 + 0.5 s).
  EXPECT_NEAR(run(0), -0.1f, 1e-6);
  EXPECT_NEAR(run(2), -0.05f, 1e-6);
}

// At the end of the data a few workers are left: "everyone contributed"
// waits for min_apply_fraction of the job's step in samples, so a lone
// worker's small pushes are not each an apply, and an apply of fewer
// samples than the job's step takes that share of a step; with nobody live
// the queue applies at once.
TEST_F(AggregatorTest, SemiAsyncEveryoneContributedWaitsForEnoughSamples) {
  AggregatorOptions options;
  options.window = 100;
  options.job_batch = 8;
  options.semi_async.min_apply_fraction = 0.5;  // 4 samples
  auto agg =
      *Aggregator::Create(ConsistencyMode::kSemiAsync, 2, options, clock_);
  agg->UpdateMembership(1, {1});  // worker 0 finished
  for (uint64_t c = 0; c < 3; ++c) {
    ASSERT_TRUE(agg->Push(MakePush(1, c, 1, {7}, {2, 2}, {0, 0, 0})).ok());
    EXPECT_EQ(agg->applied_rounds(), 0u) << "after push " << c;
  }
  ASSERT_TRUE(agg->Push(MakePush(1, 3, 1, {7}, {2, 2}, {0, 0, 0})).ok());
  EXPECT_EQ(agg->applied_rounds(), 1u);
  // 4 of the job's 8 samples: half of the sgd step 0.5 · 2.
  EXPECT_EQ(Row(7), (std::vector<float>{-0.5f, -0.5f}));
  const uint64_t key = 7;
  std::vector<float> read(2);
  agg->PullSparse(1, &sparse_, {&key, 1}, read);  // reads v1: not stale
  ASSERT_TRUE(agg->Push(MakePush(1, 4, 1, {7}, {2, 2}, {0, 0, 0})).ok());
  EXPECT_EQ(agg->applied_rounds(), 1u);
  agg->UpdateMembership(2, {});
  EXPECT_EQ(agg->applied_rounds(), 2u);
  EXPECT_EQ(Row(7), (std::vector<float>{-0.625f, -0.625f}));  // + 1/8 step
}

// The configured job batch (16) is a guess: the first apply of one push
// from every worker (4 + 4) sets the full round to 8 samples, and after
// worker 1 left, worker 0's 4 samples are half of it: enough for the floor,
// and half a step.
TEST_F(AggregatorTest, SemiAsyncMeasuresTheFullRound) {
  AggregatorOptions options;
  options.window = 100;
  options.job_batch = 16;
  options.semi_async.min_apply_fraction = 0.5;
  options.semi_async.staleness_decay = 0;  // worker 0 pushes without a pull
  auto agg =
      *Aggregator::Create(ConsistencyMode::kSemiAsync, 2, options, clock_);
  ASSERT_TRUE(agg->Push(MakePush(0, 0, 4, {7}, {2, 2}, {0, 0, 0})).ok());
  ASSERT_TRUE(agg->Push(MakePush(1, 0, 4, {7}, {2, 2}, {0, 0, 0})).ok());
  EXPECT_EQ(agg->applied_rounds(), 1u);
  EXPECT_EQ(Row(7), (std::vector<float>{-1.0f, -1.0f}));  // sgd 0.5 · 2
  agg->UpdateMembership(1, {0});
  ASSERT_TRUE(agg->Push(MakePush(0, 1, 4, {7}, {2, 2}, {0, 0, 0})).ok());
  EXPECT_EQ(agg->applied_rounds(), 2u);
  EXPECT_EQ(Row(7), (std::vector<float>{-1.5f, -1.5f}));
}

TEST_F(AggregatorTest, SemiAsyncHoldsAPullMoreThanWindowClocksAhead) {
  auto agg = SemiAsync(2, 2, clock_);
  for (uint64_t c = 0; c < 3; ++c) {
    ASSERT_TRUE(agg->Push(MakePush(0, c, 1, {7}, {0, 0}, {0, 0, 0})).ok());
  }
  // Worker 0 has made 3 pushes, worker 1 none: 3 - 0 > window 2.
  absl::Status held = AdmitNow(*agg, 0, 3, clock_.Now());
  EXPECT_EQ(held.code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_NE(held.message().find("slowest live worker (clock 0, window 2)"),
            std::string::npos)
      << held;
  ASSERT_TRUE(AdmitNow(*agg, 0, 2, clock_.Now()).ok());  // 2 - 0 <= 2
  // Released as soon as worker 1 pushes once.
  auto pull = Admit(*agg, 0, 3, clock_.Now() + absl::Seconds(10));
  EXPECT_FALSE(pull->decided.HasBeenNotified());
  ASSERT_TRUE(agg->Push(MakePush(1, 0, 1, {7}, {0, 0}, {0, 0, 0})).ok());
  ASSERT_TRUE(pull->decided.HasBeenNotified());
  EXPECT_TRUE(pull->status.ok()) << pull->status;
  const AggregatorStats st = agg->Stats();
  EXPECT_EQ(st.ssp_waits(), 2u);  // the timed-out pull and the released one
  EXPECT_EQ(st.max_pull_lead(), 2u);
  EXPECT_EQ(st.bound_violations(), 0u);
}

TEST_F(AggregatorTest, SemiAsyncStopsWaitingForAWorkerThatLeft) {
  auto agg = SemiAsync(2, 1, clock_);
  for (uint64_t c = 0; c < 3; ++c) {
    ASSERT_TRUE(agg->Push(MakePush(0, c, 1, {7}, {0, 0}, {0, 0, 0})).ok());
  }
  auto pull = Admit(*agg, 0, 3, clock_.Now() + absl::Seconds(10));
  EXPECT_FALSE(pull->decided.HasBeenNotified());
  agg->UpdateMembership(2, {0});
  ASSERT_TRUE(pull->decided.HasBeenNotified());
  EXPECT_TRUE(pull->status.ok()) << pull->status;
  // Alone in the live set, worker 0's pushes apply on arrival.
  auto window4 = SemiAsync(2, 4, clock_);
  window4->UpdateMembership(2, {0});
  ASSERT_TRUE(window4->Push(MakePush(0, 0, 1, {8}, {2, 2}, {0, 0, 0})).ok());
  EXPECT_EQ(window4->applied_rounds(), 1u);
}

TEST_F(AggregatorTest, SemiAsyncNewWindowTakesEffectAtOnce) {
  auto agg = SemiAsync(3, 4, clock_);
  ASSERT_TRUE(agg->Push(MakePush(0, 0, 1, {7}, {1, 1}, {0, 0, 0})).ok());
  ASSERT_TRUE(agg->Push(MakePush(0, 1, 1, {7}, {1, 1}, {0, 0, 0})).ok());
  EXPECT_EQ(agg->applied_rounds(), 0u);
  agg->SetWindow(2);  // the queue already holds 2
  EXPECT_EQ(agg->applied_rounds(), 1u);
  EXPECT_EQ(agg->Stats().window(), 2u);
}

TEST_F(AggregatorTest, SemiAsyncRetriedPushIsNotAppliedTwice) {
  auto agg = SemiAsync(2, 1, clock_);
  ASSERT_TRUE(agg->Push(MakePush(0, 0, 1, {7}, {1, 1}, {0, 0, 0})).ok());
  ASSERT_TRUE(agg->Push(MakePush(0, 0, 1, {7}, {1, 1}, {0, 0, 0})).ok());
  EXPECT_EQ(agg->Stats().pushes(), 1u);
  EXPECT_EQ(Row(7), (std::vector<float>{-0.5f, -0.5f}));
}

}  // namespace
}  // namespace hetps
