#include "table/sparse_table.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <map>
#include <memory>
#include <random>
#include <set>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "hetps/config.h"
#include "table/initializer.h"
#include "table/optimizer.h"

namespace hetps {
namespace {

using ::testing::ElementsAre;
using ::testing::FloatEq;

TableConfig MakeSparseConfig(uint64_t dim, const std::string& optimizer,
                       const std::string& init, float lr = 0.5f,
                       uint64_t seed = 2026) {
  TableConfig config;
  config.name = "emb";
  config.kind = TableKind::kSparse;
  config.dim = dim;
  config.optimizer.type = optimizer;
  config.optimizer.learning_rate = lr;
  config.init.type = init;
  config.init.scale = 0.5f;
  config.init.seed = seed;
  return config;
}

std::unique_ptr<SparseTable> MakeTable(const TableConfig& config,
                                       int stripes = 8) {
  auto opt = Optimizer::Create(config.optimizer);
  EXPECT_TRUE(opt.ok()) << opt.status();
  return std::make_unique<SparseTable>(config, std::move(*opt), stripes);
}

std::vector<float> PullAll(SparseTable& table,
                           const std::vector<uint64_t>& keys) {
  std::vector<float> out(keys.size() * table.dim(), -123.0f);
  table.Pull(keys, out);
  return out;
}

TEST(SparseTableTest, RowsStartFromTheDeterministicInitializer) {
  const TableConfig config = MakeSparseConfig(4, "sgd", "uniform");
  // Different stripe counts and key orders: placement must not matter.
  auto a = MakeTable(config, 8);
  auto b = MakeTable(config, 1);
  const std::vector<uint64_t> keys = {1, 42, uint64_t{1} << 40, ~uint64_t{0}};
  const std::vector<uint64_t> reversed(keys.rbegin(), keys.rend());
  EXPECT_EQ(a->size(), 0u);
  const std::vector<float> from_a = PullAll(*a, keys);
  const std::vector<float> from_b = PullAll(*b, reversed);
  EXPECT_EQ(a->size(), 4u);
  EXPECT_EQ(b->size(), 4u);
  for (size_t k = 0; k < keys.size(); ++k) {
    for (uint64_t c = 0; c < 4; ++c) {
      const float v = from_a[k * 4 + c];
      EXPECT_EQ(v, InitialValue(config.init, keys[k], c));
      EXPECT_EQ(v, from_b[(keys.size() - 1 - k) * 4 + c]);
      EXPECT_GE(v, -0.5f);
      EXPECT_LE(v, 0.5f);
    }
  }
  // Columns of one row and rows of one column differ.
  EXPECT_NE(from_a[0], from_a[1]);
  EXPECT_NE(from_a[0], from_a[4]);

  auto other_seed = MakeTable(MakeSparseConfig(4, "sgd", "uniform", 0.5f, 7));
  const std::vector<float> from_other = PullAll(*other_seed, keys);
  int same = 0;
  for (size_t i = 0; i < from_a.size(); ++i) same += from_a[i] == from_other[i];
  EXPECT_EQ(same, 0);
}

TEST(SparseTableTest, ZeroInitGivesZeros) {
  auto table = MakeTable(MakeSparseConfig(3, "adagrad", "zero"));
  EXPECT_THAT(PullAll(*table, {5, 6}), ::testing::Each(0.0f));
}

TEST(SparseTableTest, InitializerDistributionsHaveTheirScale) {
  InitializerConfig uniform{"uniform", 0.25f, 11};
  InitializerConfig normal{"normal", 0.1f, 11};
  const int n = 200000;
  double u_sum = 0, u_sq = 0, n_sum = 0, n_sq = 0;
  float u_min = 1, u_max = -1;
  for (int i = 0; i < n; ++i) {
    // Structured keys (one column of consecutive ids) are the hard case.
    const float u = InitialValue(uniform, static_cast<uint64_t>(i), 3);
    const float g = InitialValue(normal, static_cast<uint64_t>(i), 3);
    u_min = std::min(u_min, u);
    u_max = std::max(u_max, u);
    u_sum += u;
    u_sq += double{u} * u;
    n_sum += g;
    n_sq += double{g} * g;
  }
  EXPECT_GE(u_min, -0.25f);
  EXPECT_LE(u_max, 0.25f);
  EXPECT_LT(u_min, -0.249f);
  EXPECT_GT(u_max, 0.249f);
  EXPECT_NEAR(u_sum / n, 0.0, 0.002);
  // Var of U[-s, s] is s²/3.
  EXPECT_NEAR(u_sq / n, 0.25 * 0.25 / 3, 0.0005);
  EXPECT_NEAR(n_sum / n, 0.0, 0.001);
  EXPECT_NEAR(std::sqrt(n_sq / n), 0.1, 0.001);
  EXPECT_EQ(InitialValue({"zero", 0.25f, 11}, 123, 0), 0.0f);
}

TEST(SparseTableTest, PullOfDuplicateKeysCreatesOneRow) {
  auto table = MakeTable(MakeSparseConfig(2, "sgd", "uniform"));
  const std::vector<float> out = PullAll(*table, {7, 7, 9, 7});
  EXPECT_EQ(table->size(), 2u);
  EXPECT_THAT(std::vector<float>(out.begin() + 2, out.begin() + 4),
              ElementsAre(out[0], out[1]));
  EXPECT_THAT(std::vector<float>(out.begin() + 6, out.begin() + 8),
              ElementsAre(out[0], out[1]));
  EXPECT_NE(out[4], out[0]);
}

TEST(SparseTableTest, PushAppliesSgdExactly) {
  auto table = MakeTable(MakeSparseConfig(2, "sgd", "zero", 0.5f));
  // w -= 0.5 g from 0: key 3 → [-0.5, -1], key 5 → [2, -0.25].
  table->Push(std::vector<uint64_t>{3, 5},
              std::vector<float>{1.0f, 2.0f, -4.0f, 0.5f});
  EXPECT_THAT(PullAll(*table, {3, 5}), ElementsAre(-0.5f, -1.0f, 2.0f, -0.25f));
  // Second push to key 5 only: [2 - 0.5, -0.25 + 0.25] = [1.5, 0].
  table->Push(std::vector<uint64_t>{5}, std::vector<float>{1.0f, -0.5f});
  std::vector<float> row(2);
  ASSERT_TRUE(table->Lookup(5, row));
  EXPECT_THAT(row, ElementsAre(1.5f, 0.0f));
  ASSERT_TRUE(table->Lookup(3, row));
  EXPECT_THAT(row, ElementsAre(-0.5f, -1.0f));
}

TEST(SparseTableTest, PushCreatesMissingRowsFromTheirInitialValue) {
  const TableConfig config = MakeSparseConfig(1, "sgd", "uniform", 0.5f);
  auto table = MakeTable(config);
  table->Push(std::vector<uint64_t>{77}, std::vector<float>{0.25f});
  std::vector<float> row(1);
  ASSERT_TRUE(table->Lookup(77, row));
  EXPECT_THAT(row[0], FloatEq(InitialValue(config.init, 77, 0) - 0.125f));
}

TEST(SparseTableTest, OptimizerStateIsKeptPerRow) {
  // adagrad, lr 0.5, a0 0, eps 1e-8 (negligible), zero init:
  // key 1 gets g = 3 then g = 4: a = 9 → w = -0.5*3/3 = -0.5;
  //   a = 25 → w = -0.5 - 0.5*4/5 = -0.9.
  // key 2 gets g = 4 once: a = 16 → w = -0.5*4/4 = -0.5 (not sharing key 1's
  //   accumulator, which would give -0.4).
  TableConfig config = MakeSparseConfig(1, "adagrad", "zero", 0.5f);
  config.optimizer.initial_accumulator = 0.0f;
  auto table = MakeTable(config, 1);
  table->Push(std::vector<uint64_t>{1}, std::vector<float>{3.0f});
  table->Push(std::vector<uint64_t>{1, 2}, std::vector<float>{4.0f, 4.0f});
  const std::vector<float> out = PullAll(*table, {1, 2});
  EXPECT_NEAR(out[0], -0.9f, 1e-6);
  EXPECT_NEAR(out[1], -0.5f, 1e-6);
}

// Rows on their way (a bucket moving in): their gradients wait, the other
// keys' apply; once the hold no longer names a key, what waited is applied
// in the order it came, with each push's step_scale, on the row installed
// meanwhile, before any push that follows.
TEST(SparseTableTest, HeldPushesApplyInOrderOnceTheRowIsIn) {
  TableConfig config = MakeSparseConfig(1, "adagrad", "zero", 0.5f);
  config.optimizer.initial_accumulator = 0.0f;
  auto table = MakeTable(config, 4);
  auto reference = MakeTable(config, 4);
  table->HoldPushes([](uint64_t key) { return key == 1 || key == 3; });
  table->Push(std::vector<uint64_t>{1, 2}, std::vector<float>{3.0f, 4.0f});
  table->Push(std::vector<uint64_t>{1}, std::vector<float>{4.0f}, 0.5f);
  table->Push(std::vector<uint64_t>{3}, std::vector<float>{2.0f});
  EXPECT_EQ(table->held_rows(), 3u);
  EXPECT_EQ(table->size(), 1u) << "key 2 only";
  std::vector<float> row(1);
  EXPECT_FALSE(table->Lookup(1, row));
  // The row arrives; key 3 stays held.
  const std::vector<float> weight{1.0f}, state{9.0f};
  table->RestoreRow(1, weight, state, 7);
  table->HoldPushes([](uint64_t key) { return key == 3; });
  EXPECT_EQ(table->held_rows(), 1u);
  table->Push(std::vector<uint64_t>{1}, std::vector<float>{-1.0f});
  // The same steps taken directly, in that order.
  reference->RestoreRow(1, weight, state, 7);
  reference->Push(std::vector<uint64_t>{1}, std::vector<float>{3.0f});
  reference->Push(std::vector<uint64_t>{1}, std::vector<float>{4.0f}, 0.5f);
  reference->Push(std::vector<uint64_t>{1}, std::vector<float>{-1.0f});
  std::vector<float> expected(1);
  ASSERT_TRUE(table->Lookup(1, row));
  ASSERT_TRUE(reference->Lookup(1, expected));
  EXPECT_EQ(row[0], expected[0]);
  // adagrad from a = 9: the first held step alone would leave 0.5.
  EXPECT_NE(row[0], 0.5f);
  uint64_t updates = 0;
  table->ForEachRowWithState(
      [&](uint64_t key, std::span<const float>, std::span<const float>,
          uint64_t count) {
        if (key == 1) updates = count;
      });
  EXPECT_EQ(updates, 10u);
  table->HoldPushes(nullptr);
  EXPECT_EQ(table->held_rows(), 0u);
  ASSERT_TRUE(table->Lookup(3, row));
  EXPECT_EQ(row[0], -0.5f) << "adagrad's first step from a = 0 is lr";
}

TEST(SparseTableTest, LookupDoesNotCreate) {
  auto table = MakeTable(MakeSparseConfig(3, "sgd", "uniform"));
  std::vector<float> row(3, 9.0f);
  EXPECT_FALSE(table->Lookup(10, row));
  EXPECT_THAT(row, ::testing::Each(9.0f));
  EXPECT_EQ(table->size(), 0u);
  const std::vector<float> pulled = PullAll(*table, {10});
  ASSERT_TRUE(table->Lookup(10, row));
  EXPECT_EQ(row, pulled);
  EXPECT_EQ(table->size(), 1u);
}

TEST(SparseTableTest, ForEachRowVisitsEveryRowOnce) {
  auto table = MakeTable(MakeSparseConfig(2, "sgd", "zero", 1.0f), 4);
  std::vector<uint64_t> keys;
  for (uint64_t k = 0; k < 100; ++k) keys.push_back(k * 1000003);
  PullAll(*table, keys);
  // Keys divisible by 2·1000003 get one push of [0.25, -0.5], so they read
  // [-0.25, 0.5] with count 1; the rest stay [0, 0] with count 0.
  std::vector<uint64_t> pushed;
  for (uint64_t k = 0; k < 100; k += 2) pushed.push_back(k * 1000003);
  std::vector<float> grads;
  for (size_t i = 0; i < pushed.size(); ++i) {
    grads.push_back(0.25f);
    grads.push_back(-0.5f);
  }
  table->Push(pushed, grads);

  std::map<uint64_t, std::pair<std::vector<float>, uint64_t>> seen;
  table->ForEachRow([&](uint64_t key, std::span<const float> w,
                        uint64_t updates) {
    EXPECT_EQ(w.size(), 2u);
    EXPECT_TRUE(
        seen.emplace(key, std::make_pair(std::vector<float>(w.begin(), w.end()),
                                         updates))
            .second)
        << "visited twice: " << key;
  });
  ASSERT_EQ(seen.size(), 100u);
  for (uint64_t k = 0; k < 100; ++k) {
    const auto& [w, updates] = seen.at(k * 1000003);
    if (k % 2 == 0) {
      EXPECT_THAT(w, ElementsAre(-0.25f, 0.5f));
      EXPECT_EQ(updates, 1u);
    } else {
      EXPECT_THAT(w, ElementsAre(0.0f, 0.0f));
      EXPECT_EQ(updates, 0u);
    }
  }
}

TEST(SparseTableTest, ConcurrentPushesLoseNoUpdates) {
  auto table = MakeTable(MakeSparseConfig(2, "sgd", "zero", 1.0f), 16);
  constexpr int kThreads = 4;
  constexpr int kRounds = 200;
  constexpr uint64_t kKeys = 1000;
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      // Each thread covers an overlapping window of keys, in its own order,
      // and pulls in between so readers race the writers too.
      std::vector<uint64_t> keys;
      for (uint64_t k = 0; k < kKeys; ++k) {
        keys.push_back((k * 7 + static_cast<uint64_t>(t) * 131) % kKeys);
      }
      const std::vector<float> grads(2 * kKeys, 0.25f);
      std::vector<float> out(2 * kKeys);
      for (int r = 0; r < kRounds; ++r) {
        table->Push(keys, grads);
        if (r % 50 == 0) table->Pull(keys, out);
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(table->size(), kKeys);
  // Sums of 0.25 stay exact in float: every row is -0.25 * 4 * 200 = -200.
  std::vector<uint64_t> all;
  for (uint64_t k = 0; k < kKeys; ++k) all.push_back(k);
  EXPECT_THAT(PullAll(*table, all), ::testing::Each(-200.0f));
  uint64_t rows = 0;
  table->ForEachRow([&](uint64_t, std::span<const float>, uint64_t updates) {
    EXPECT_EQ(updates, uint64_t{kThreads * kRounds});
    ++rows;
  });
  EXPECT_EQ(rows, kKeys);
}

TEST(SparseTableTest, ManyKeysAcrossStripes) {
  auto table = MakeTable(MakeSparseConfig(1, "sgd", "zero", 1.0f), 64);
  // Half random 64-bit ids, half structured (field << 32 | id), which must
  // not pile onto a few stripes or collide with each other.
  constexpr size_t kCount = 300000;
  std::vector<uint64_t> keys;
  std::mt19937_64 rng(5);
  for (size_t i = 0; i < kCount / 2; ++i) keys.push_back(rng() | 1);
  for (size_t i = 0; i < kCount / 2; ++i) {
    keys.push_back((uint64_t{i % 8} << 32 | (i / 8)) << 1);  // even: distinct
  }
  std::vector<float> grads(kCount);
  for (size_t i = 0; i < kCount; ++i)
    grads[i] = static_cast<float>(i % 8) * 0.25f;
  table->Push(keys, grads);
  EXPECT_EQ(table->size(), kCount);

  const std::vector<float> out = PullAll(*table, keys);
  size_t wrong = 0;
  for (size_t i = 0; i < kCount; ++i) wrong += out[i] != -grads[i];
  EXPECT_EQ(wrong, 0u);

  uint64_t rows = 0;
  double sum = 0;
  table->ForEachRow([&](uint64_t, std::span<const float> w, uint64_t updates) {
    ++rows;
    sum += w[0];
    EXPECT_EQ(updates, 1u);
  });
  EXPECT_EQ(rows, kCount);
  // Σ over i of (i % 8) * 0.25 = 37500 cycles * 7 = 262500.
  EXPECT_EQ(sum, -262500.0);
}

TEST(SparseTableTest, LargePullWithDuplicatesCreatesEachRowOnce) {
  // Large enough to be split between two threads (rows of a cache line:
  // narrower ones split only on tables too large for the cache); every key
  // appears once in each half of the request, so both halves' copies meet
  // in one stripe.
  constexpr uint64_t kDim = 16;
  const TableConfig config = MakeSparseConfig(kDim, "sgd", "uniform");
  auto table = MakeTable(config, 64);
  constexpr uint64_t kDistinct = 150000;
  std::vector<uint64_t> keys;
  for (uint64_t k = 0; k < kDistinct; ++k) keys.push_back(k * 977 + 5);
  for (uint64_t k = 0; k < kDistinct; ++k) keys.push_back(k * 977 + 5);
  const std::vector<float> out = PullAll(*table, keys);
  EXPECT_EQ(table->size(), kDistinct);
  size_t wrong = 0;
  for (uint64_t k = 0; k < kDistinct; ++k) {
    for (uint64_t c = 0; c < kDim; ++c) {
      const float expected = InitialValue(config.init, keys[k], c);
      wrong += out[k * kDim + c] != expected;
      wrong += out[(kDistinct + k) * kDim + c] != expected;
    }
  }
  EXPECT_EQ(wrong, 0u);
}

TEST(SparseTableTest, ConcurrentLargePushesLoseNoUpdates) {
  auto table = MakeTable(MakeSparseConfig(1, "sgd", "zero", 1.0f), 64);
  constexpr uint64_t kKeys = 250000;
  std::vector<uint64_t> keys;
  for (uint64_t k = 0; k < kKeys; ++k) keys.push_back(k << 20 | 3);
  const std::vector<float> grads(kKeys, 0.5f);
  std::vector<std::thread> threads;
  for (int t = 0; t < 3; ++t) {
    threads.emplace_back([&] {
      for (int r = 0; r < 2; ++r) table->Push(keys, grads);
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(table->size(), kKeys);
  // 3 threads x 2 pushes x 0.5 from 0.
  EXPECT_THAT(PullAll(*table, keys), ::testing::Each(-3.0f));
}

// Every row with its state and count, as a map (what a checkpoint holds).
using AllRows = std::map<uint64_t, std::vector<float>>;
void AddRow(AllRows& rows, uint64_t key, std::span<const float> w,
            std::span<const float> st, uint64_t count) {
  std::vector<float> all(w.begin(), w.end());
  all.insert(all.end(), st.begin(), st.end());
  all.push_back(static_cast<float>(count));
  EXPECT_TRUE(rows.emplace(key, std::move(all)).second) << key;
}

// The selector that takes the rows whose key `pred` accepts.
SparseTable::KeySelector Where(std::function<bool(uint64_t)> pred) {
  return [pred = std::move(pred)](std::span<const uint64_t> keys,
                                  std::span<bool> take) {
    for (size_t i = 0; i < keys.size(); ++i) take[i] = pred(keys[i]);
  };
}

AllRows RowsOf(const SparseTable& table) {
  AllRows rows;
  table.ForEachRowWithState(
      [&](uint64_t key, std::span<const float> w, std::span<const float> st,
          uint64_t count) { AddRow(rows, key, w, st, count); });
  return rows;
}

// `count` keys, each row pushed once with `grads` (16 floats a row) so that
// its weights, accumulator and count differ from a fresh row's.
std::vector<uint64_t> TrainOnce(SparseTable& table, uint64_t count,
                                std::vector<float>* grads) {
  std::vector<uint64_t> keys(count);
  for (uint64_t k = 0; k < count; ++k) keys[k] = k * 7919 + 3;
  grads->resize(count * 16);
  for (size_t i = 0; i < grads->size(); ++i) {
    (*grads)[i] = 0.01f * (i % 13) - 0.05f;
  }
  table.Push(keys, *grads);
  return keys;
}

TEST(SparseTableTest, ExtractedRowsLeaveWithTheirStateAndRestoreExactly) {
  // Enough rows in one stripe to span several chunks (dim 16 with adagrad:
  // 34 floats a row, ~7700 rows a chunk), every row trained once so its
  // weights, accumulator and count differ from a fresh row's.
  const TableConfig config = MakeSparseConfig(16, "adagrad", "uniform");
  auto table = MakeTable(config, 1);
  constexpr uint64_t kRows = 20000;
  std::vector<float> grads;
  const std::vector<uint64_t> keys = TrainOnce(*table, kRows, &grads);
  AllRows before = RowsOf(*table);
  ASSERT_EQ(before.size(), kRows);
  // A third of the rows leave (as a bucket's would) into another table.
  auto leaves = [](uint64_t key) { return key % 3 == 0; };
  const SparseTable::KeySelector leaving = Where(leaves);
  // A copy of those first (what a HandOver sends), the table unchanged.
  AllRows copied;
  table->ForEachRowWithState(
      [&](uint64_t key, std::span<const float> w, std::span<const float> st,
          uint64_t count) { AddRow(copied, key, w, st, count); },
      leaving);
  AllRows expected_copy;
  for (const auto& [key, row] : before) {
    if (leaves(key)) expected_copy.emplace(key, row);
  }
  ASSERT_GT(copied.size(), 0u);
  EXPECT_EQ(copied, expected_copy);
  EXPECT_EQ(RowsOf(*table), before);
  auto other = MakeTable(config, 4);
  uint64_t handed = 0;
  const uint64_t removed = table->ExtractRows(
      leaving, [&](uint64_t key, std::span<const float> w,
                   std::span<const float> st, uint64_t count) {
        EXPECT_TRUE(leaves(key)) << key;
        other->RestoreRow(key, w, st, count);
        ++handed;
      });
  EXPECT_EQ(removed, handed);
  uint64_t expected = 0;
  for (uint64_t k : keys) expected += leaves(k) ? 1 : 0;
  EXPECT_EQ(removed, expected);
  EXPECT_EQ(table->size(), kRows - expected);
  EXPECT_EQ(other->size(), expected);
  // Every row is in exactly one of the two, as it was.
  AllRows after = RowsOf(*table);
  for (const auto& [key, row] : RowsOf(*other)) {
    EXPECT_TRUE(after.emplace(key, row).second) << key;
  }
  EXPECT_EQ(after, before);
  // The rows that stayed still train in place; one that left comes back
  // fresh where it is pulled again.
  std::vector<float> row(16), fresh(16);
  const uint64_t stayed = keys[1], left = keys[0];
  ASSERT_FALSE(leaves(stayed));
  ASSERT_TRUE(leaves(left));
  ASSERT_TRUE(table->Lookup(stayed, row));
  EXPECT_EQ(std::vector<float>(row), std::vector<float>(
                before[stayed].begin(), before[stayed].begin() + 16));
  EXPECT_FALSE(table->Lookup(left, row));
  table->Pull(std::vector<uint64_t>{left}, fresh);
  auto untouched = MakeTable(config, 1);
  untouched->Pull(std::vector<uint64_t>{left}, row);
  EXPECT_EQ(fresh, row);
  // Taking every row empties the table.
  EXPECT_EQ(table->ExtractRows(Where([](uint64_t) { return true; }),
                               [](uint64_t, std::span<const float>,
                                  std::span<const float>, uint64_t) {}),
            kRows - expected + 1);
  EXPECT_EQ(table->size(), 0u);
}

// A request of the keys of an earlier one, in the same order, finds them
// grouped and their rows located (SparseTable::PlanCounts); rows that left
// their slots since (a bucket's rows leaving, the last rows of a stripe
// moving into the freed slots, rows coming back) are found again where
// they are. The same requests on a table that keeps no plans (one key a
// request) give the same rows, bit for bit.
TEST(SparseTableTest,
     ARequestOfAnEarlierOnesKeysFindsTheirRowsWhereverTheyWent) {
  const TableConfig config = MakeSparseConfig(4, "adagrad", "uniform");
  auto table = MakeTable(config, 4);
  auto one_by_one = MakeTable(config, 4);
  std::mt19937_64 rng(7);
  std::vector<uint64_t> keys(3000);
  for (auto& k : keys) k = rng();
  std::vector<float> grads(keys.size() * 4);
  for (size_t i = 0; i < grads.size(); ++i) grads[i] = 0.01f * (i % 17) - 0.08f;
  auto push_one_by_one = [&] {
    for (size_t i = 0; i < keys.size(); ++i) {
      one_by_one->Push(std::span(&keys[i], 1),
                       std::span(grads).subspan(i * 4, 4));
    }
  };
  auto pull_one_by_one = [&] {
    std::vector<float> rows(keys.size() * 4);
    for (size_t i = 0; i < keys.size(); ++i) {
      one_by_one->Pull(std::span(&keys[i], 1),
                       std::span(rows).subspan(i * 4, 4));
    }
    return rows;
  };

  // A request asked for a second time keeps its plan; the third finds it.
  const std::vector<float> first = pull_one_by_one();
  for (int r = 0; r < 2; ++r) ASSERT_EQ(PullAll(*table, keys), first);
  EXPECT_EQ(table->plan_counts().found, 0u);
  EXPECT_EQ(table->plan_counts().kept, 1u);
  ASSERT_EQ(PullAll(*table, keys), first);
  ASSERT_EQ(table->plan_counts().found, 1u);
  EXPECT_EQ(table->plan_counts().kept, 1u);
  table->Push(keys, grads);
  push_one_by_one();
  EXPECT_EQ(table->plan_counts().found, 2u);
  EXPECT_EQ(one_by_one->plan_counts().kept, 0u);  // one key: no plan

  // A third of the rows leave, and come back (at other slots) but one in
  // four; rows that stay move into the freed slots. Both tables alike.
  auto leaves = [](uint64_t key) { return key % 3 == 0; };
  for (SparseTable* t : {table.get(), one_by_one.get()}) {
    AllRows left;
    t->ExtractRows(
        Where(leaves),
        [&](uint64_t key, std::span<const float> w, std::span<const float> st,
            uint64_t count) { AddRow(left, key, w, st, count); });
    ASSERT_GT(left.size(), 500u);
    for (const auto& [key, row] : left) {
      if (key % 4 == 0) continue;
      t->RestoreRow(key, std::span(row).first(4), std::span(row).subspan(4, 4),
                    static_cast<uint64_t>(row[8]));
    }
  }
  table->Push(keys, grads);
  push_one_by_one();
  EXPECT_EQ(table->plan_counts().found, 3u);
  EXPECT_EQ(PullAll(*table, keys), pull_one_by_one());
  EXPECT_EQ(table->plan_counts().found, 4u);
  EXPECT_EQ(RowsOf(*table), RowsOf(*one_by_one));

  // The same keys in another order are another request (kept: plans are
  // being found).
  std::vector<uint64_t> turned(keys.rbegin(), keys.rend());
  const SparseTable::PlanCounts before = table->plan_counts();
  PullAll(*table, turned);
  EXPECT_EQ(table->plan_counts().found, before.found);
  EXPECT_EQ(table->plan_counts().kept, before.kept + 1);
}

// Plans cost their copies: a table keeps those of one request in about
// sixteen until plans are found, by which keys that come again are
// noticed, and then keeps them all while they are.
TEST(SparseTableTest, PlansNoRequestFindsAreSoonNoLongerKept) {
  auto table = MakeTable(MakeSparseConfig(1, "sgd", "zero"), 8);
  std::vector<uint64_t> keys(600);
  for (uint64_t k = 0; k < keys.size(); ++k) keys[k] = k * 7919 + 1;
  std::vector<float> out(keys.size());
  for (int r = 0; r < 400; ++r) {
    std::rotate(keys.begin(), keys.begin() + 1, keys.end());
    table->Pull(keys, out);
  }
  SparseTable::PlanCounts counts = table->plan_counts();
  EXPECT_EQ(counts.found, 0u);
  EXPECT_GE(counts.kept, 10u);  // about 400 / 16
  EXPECT_LE(counts.kept, 50u);
  // A request asked for again is found once a probe kept it, and keeping
  // resumes.
  for (int r = 0; r < 200 && table->plan_counts().found == 0; ++r) {
    std::rotate(keys.begin(), keys.begin() + 1, keys.end());
    table->Pull(keys, out);
    table->Pull(keys, out);
  }
  ASSERT_GT(table->plan_counts().found, 0u);
  counts = table->plan_counts();
  for (int r = 0; r < 10; ++r) {
    std::rotate(keys.begin(), keys.begin() + 1, keys.end());
    table->Pull(keys, out);
    table->Pull(keys, out);
  }
  EXPECT_EQ(table->plan_counts().found, counts.found + 10);
  EXPECT_EQ(table->plan_counts().kept, counts.kept + 10);
}

// A table that finds no plans notices the requests asked for again among
// the last sixteen that kept none: each keeps its plan when it comes a
// second time and is found the third.
TEST(SparseTableTest, SixteenRequestsAskedForAgainAreFoundTheThirdTime) {
  auto table = MakeTable(MakeSparseConfig(1, "sgd", "zero"), 8);
  std::vector<std::vector<uint64_t>> requests(16);
  for (size_t i = 0; i < requests.size(); ++i) {
    for (uint64_t k = 0; k < 600; ++k) {
      requests[i].push_back((i * 600 + k) * 2654435761u + 1);
    }
  }
  std::vector<float> out(600);
  for (const auto& keys : requests) table->Pull(keys, out);
  for (const auto& keys : requests) table->Pull(keys, out);
  const SparseTable::PlanCounts second = table->plan_counts();
  EXPECT_GE(second.kept, 16u - second.found);
  for (const auto& keys : requests) table->Pull(keys, out);
  EXPECT_EQ(table->plan_counts().found, second.found + 16);
  EXPECT_EQ(table->plan_counts().kept, second.kept);
}

// Pushes that find a plan, while rows that share their stripes leave and
// come back (moving the pushed rows between slots), lose no update and
// touch no other row.
TEST(SparseTableTest, PushesByPlanLoseNoUpdateWhileRowsMove) {
  const TableConfig config = MakeSparseConfig(2, "sgd", "zero", 1.0f);
  auto table = MakeTable(config, 4);
  std::vector<uint64_t> pushed, others;
  for (uint64_t k = 0; k < 4000; ++k) {
    (k % 2 == 0 ? pushed : others).push_back(k * 2654435761u + 5);
  }
  // The rows of both, interleaved.
  std::vector<uint64_t> all;
  for (size_t i = 0; i < pushed.size(); ++i) {
    all.push_back(others[i]);
    all.push_back(pushed[i]);
  }
  PullAll(*table, all);
  const std::vector<float> grads(pushed.size() * 2, 0.25f);
  constexpr int kThreads = 3, kPushes = 200;
  std::sort(others.begin(), others.end());
  std::atomic<bool> pushing = true;
  std::thread mover([&] {
    int round = 0;
    while (pushing.load()) {
      const uint64_t r = round++ % 5;
      AllRows left;
      table->ExtractRows(
          Where([&](uint64_t key) {
            return key % 5 == r &&
                   std::binary_search(others.begin(), others.end(), key);
          }),
          [&](uint64_t key, std::span<const float> w, std::span<const float> st,
              uint64_t count) { AddRow(left, key, w, st, count); });
      for (const auto& [key, row] : left) {
        table->RestoreRow(key, std::span(row).first(2), {},
                          static_cast<uint64_t>(row[2]));
      }
    }
  });
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&] {
      for (int p = 0; p < kPushes; ++p) table->Push(pushed, grads);
    });
  }
  for (auto& th : threads) th.join();
  pushing = false;
  mover.join();
  EXPECT_GT(table->plan_counts().found, 0u);
  AllRows rows = RowsOf(*table);
  ASSERT_EQ(rows.size(), all.size());
  for (uint64_t key : pushed) {
    EXPECT_THAT(rows[key], ElementsAre(-0.25f * kThreads * kPushes,
                                       -0.25f * kThreads * kPushes,
                                       float{kThreads * kPushes}))
        << key;
  }
  for (uint64_t key : others) {
    EXPECT_THAT(rows[key], ElementsAre(0.0f, 0.0f, 0.0f)) << key;
  }
}

// The keys kept beside the rows follow them: after rows leave (the last
// rows of each chunk moving into the freed slots) and new ones arrive, a
// walk with a selector sees exactly the rows it chooses, each with its own
// key and values, across chunks and stripes, and the index finds every
// row where the walk does.
TEST(SparseTableTest, AWalkFindsEachRowByItsKeyAfterRowsLeaveAndArrive) {
  const TableConfig config = MakeSparseConfig(16, "adagrad", "uniform");
  auto table = MakeTable(config, 2);  // ~7700 rows a chunk
  std::vector<float> grads;
  const std::vector<uint64_t> keys = TrainOnce(*table, 40000, &grads);
  table->ExtractRows(Where([](uint64_t key) { return key % 3 == 1; }),
                     [](uint64_t, std::span<const float>,
                        std::span<const float>, uint64_t) {});
  std::vector<uint64_t> arrived(6000);
  for (size_t i = 0; i < arrived.size(); ++i) arrived[i] = (i + 1) << 40;
  std::vector<float> pulled(arrived.size() * 16);
  table->Pull(arrived, pulled);

  std::set<uint64_t> expected;
  for (uint64_t k : keys) {
    if (k % 3 != 1 && k % 2 == 0) expected.insert(k);
  }
  for (uint64_t k : arrived) expected.insert(k);  // all even
  ASSERT_GT(expected.size(), 16000u);
  std::map<uint64_t, std::vector<float>> seen;
  table->ForEachRowWithState(
      [&](uint64_t key, std::span<const float> w, std::span<const float>,
          uint64_t) {
        EXPECT_TRUE(
            seen.emplace(key, std::vector<float>(w.begin(), w.end())).second)
            << key;
      },
      Where([](uint64_t key) { return key % 2 == 0; }));
  std::set<uint64_t> seen_keys;
  for (const auto& [key, w] : seen) seen_keys.insert(key);
  EXPECT_EQ(seen_keys, expected);
  // Each row the walk read under a key is the one the index finds for it.
  std::vector<float> found(16);
  for (const auto& [key, w] : seen) {
    ASSERT_TRUE(table->Lookup(key, found)) << key;
    EXPECT_EQ(found, w) << key;
  }
  for (size_t i = 0; i < arrived.size(); i += 997) {
    const auto row = seen.find(arrived[i]);
    ASSERT_NE(row, seen.end()) << arrived[i];
    EXPECT_EQ(row->second, std::vector<float>(pulled.begin() + i * 16,
                                              pulled.begin() + (i + 1) * 16));
  }
}

// A snapshot reads the rows of its instant, whatever is written after it:
// pushes to stripes it has not reached (copied by the write), rows created
// by pulls and restores, rows extracted, and a writer pushing while the
// snapshot is read.
TEST(SparseTableTest, ASnapshotHoldsItsInstantWhileWritesGoOn) {
  // Two stripes of ~15000 rows: two chunks each (~7700 rows a chunk).
  const TableConfig config = MakeSparseConfig(16, "adagrad", "uniform");
  auto table = MakeTable(config, 2);
  std::vector<float> grads;
  const std::vector<uint64_t> keys = TrainOnce(*table, 30000, &grads);
  AllRows at_snapshot = RowsOf(*table);

  auto snapshot = table->TakeSnapshot();
  table->Push(std::span<const uint64_t>(keys).first(1000),
              std::span<const float>(grads).first(1000 * 16));
  std::vector<float> out(16);
  table->Pull(std::vector<uint64_t>{1}, out);  // a new row
  table->RestoreRow(2, out, std::vector<float>(16, 1.0f), 5);
  table->ExtractRows(Where([](uint64_t key) { return key % 5 == 0; }),
                     [](uint64_t, std::span<const float>,
                        std::span<const float>, uint64_t) {});
  std::atomic<bool> reading{true};
  std::thread writer([&] {
    while (reading) {
      table->Push(std::span<const uint64_t>(keys).subspan(5000, 2000),
                  std::span<const float>(grads).subspan(5000 * 16, 2000 * 16));
    }
  });
  AllRows read;
  snapshot->ForEachRow(
      [&](uint64_t key, std::span<const float> w, std::span<const float> st,
          uint64_t count) { AddRow(read, key, w, st, count); });
  reading = false;
  writer.join();
  EXPECT_EQ(read, at_snapshot);
  // The table itself went on: the first keys were trained twice.
  std::vector<float> row(16);
  ASSERT_TRUE(table->Lookup(keys[1], row));
  EXPECT_NE(std::vector<float>(row),
            std::vector<float>(at_snapshot[keys[1]].begin(),
                               at_snapshot[keys[1]].begin() + 16));
  // A snapshot dropped unread wants no copy any more: a write after it
  // touches only the table (under ASan, a copy into the freed snapshot
  // would be caught).
  auto dropped = table->TakeSnapshot();
  dropped.reset();
  std::vector<float> trained(16);
  table->Push(std::vector<uint64_t>{keys[1]}, std::vector<float>(16, 0.5f));
  ASSERT_TRUE(table->Lookup(keys[1], trained));
  EXPECT_NE(trained, std::vector<float>(row));
}

}  // namespace
}  // namespace hetps
