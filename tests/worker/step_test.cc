#include "worker/step.h"

#include <gtest/gtest.h>

#include "gmock/gmock.h"

namespace hetps {
namespace {

using ::testing::ElementsAre;
using ::testing::FloatEq;

// push_freq batches become one push: per row and for the dense part, the
// mean gradient of every sample added (each batch weighted by its size),
// and per row the feature slots that used it.
TEST(AccumulatorTest, PushesTheMeanOverEverySampleAdded) {
  Accumulator acc;
  UniqueKeys batch1, batch2;
  batch1.Build(std::vector<uint64_t>{7, 9, 9});   // one sample, 3 slots
  const std::vector<float> rows1 = {1, 2, 3, 4};  // dim 2
  const std::vector<float> dense1 = {10};
  acc.Add(batch1, rows1, 2, dense1, 1);
  batch2.Build(std::vector<uint64_t>{9, 9, 9});  // three samples, 1 slot
  const std::vector<float> rows2 = {5, 6};
  const std::vector<float> dense2 = {20};
  acc.Add(batch2, rows2, 2, dense2, 3);
  EXPECT_EQ(acc.batches(), 2u);
  EXPECT_EQ(acc.samples(), 4u);
  acc.Finish();
  EXPECT_THAT(acc.keys(), ElementsAre(7u, 9u));
  EXPECT_THAT(acc.uses(), ElementsAre(1u, 5u));
  // key 7: 1·(1,2)/4; key 9: (1·(3,4) + 3·(5,6))/4; dense (1·10 + 3·20)/4.
  EXPECT_THAT(acc.rows(), ElementsAre(FloatEq(0.25f), FloatEq(0.5f),
                                      FloatEq(4.5f), FloatEq(5.5f)));
  EXPECT_THAT(acc.dense(), ElementsAre(FloatEq(17.5f)));
  acc.Clear();
  EXPECT_EQ(acc.batches(), 0u);
  EXPECT_TRUE(acc.keys().empty());
  EXPECT_TRUE(acc.uses().empty());
}

}  // namespace
}  // namespace hetps
