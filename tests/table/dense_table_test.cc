#include "table/dense_table.h"

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "hetps/config.h"
#include "table/initializer.h"
#include "table/optimizer.h"

namespace hetps {
namespace {

using ::testing::ElementsAre;

TableConfig MakeDenseConfig(uint64_t dim, const std::string& optimizer,
                       const std::string& init, float lr) {
  TableConfig config;
  config.name = "mlp";
  config.kind = TableKind::kDense;
  config.dim = dim;
  config.optimizer.type = optimizer;
  config.optimizer.learning_rate = lr;
  config.init.type = init;
  config.init.scale = 0.3f;
  config.init.seed = 99;
  return config;
}

DenseTable MakeTable(const TableConfig& config, uint64_t offset,
                     uint64_t length) {
  auto opt = Optimizer::Create(config.optimizer);
  EXPECT_TRUE(opt.ok()) << opt.status();
  return DenseTable(config, offset, length, std::move(*opt));
}

TEST(DenseTableTest, SlicesAgreeWithTheFullArray) {
  const TableConfig config = MakeDenseConfig(10, "adagrad", "normal", 0.1f);
  const DenseTable full = MakeTable(config, 0, 10);
  const DenseTable head = MakeTable(config, 0, 4);
  const DenseTable tail = MakeTable(config, 4, 6);
  EXPECT_EQ(tail.offset(), 4u);
  EXPECT_EQ(tail.length(), 6u);
  std::vector<float> all(10), first(4), rest(6);
  full.Pull(all);
  head.Pull(first);
  tail.Pull(rest);
  std::vector<float> joined = first;
  joined.insert(joined.end(), rest.begin(), rest.end());
  EXPECT_EQ(joined, all);
  for (uint64_t i = 0; i < 10; ++i) {
    EXPECT_EQ(all[i], InitialValue(config.init, i, 0));
  }
  EXPECT_NE(all[0], all[1]);
}

TEST(DenseTableTest, SgdPushesApplyExactly) {
  DenseTable table = MakeTable(MakeDenseConfig(3, "sgd", "zero", 0.5f), 0, 3);
  EXPECT_EQ(table.update_count(), 0u);
  std::vector<float> w(3);
  table.Pull(w);
  EXPECT_THAT(w, ElementsAre(0.0f, 0.0f, 0.0f));
  // w -= 0.5 g: [0,0,0] - 0.5*[1, -2, 0.5] = [-0.5, 1, -0.25]
  table.Push(std::vector<float>{1.0f, -2.0f, 0.5f});
  EXPECT_EQ(table.update_count(), 1u);
  //   then - 0.5*[0.25, 0.25, -0.5] = [-0.625, 0.875, 0]
  table.Push(std::vector<float>{0.25f, 0.25f, -0.5f});
  EXPECT_EQ(table.update_count(), 2u);
  table.Pull(w);
  EXPECT_THAT(w, ElementsAre(-0.625f, 0.875f, 0.0f));
}

TEST(DenseTableTest, AdamUsesTheSliceUpdateCountAsStep) {
  TableConfig config = MakeDenseConfig(2, "adam", "zero", 0.1f);
  config.optimizer.beta1 = 0.9f;
  config.optimizer.beta2 = 0.999f;
  config.optimizer.epsilon = 1e-8f;
  DenseTable table = MakeTable(config, 0, 2);
  std::vector<float> w(2);
  // t=1, g = [0.5, -1]: m = [0.05, -0.1], v = [0.00025, 0.001];
  //   mhat = m/0.1 = [0.5, -1], vhat = v/0.001 = [0.25, 1];
  //   w = -0.1 * mhat / (sqrt(vhat) + 1e-8) = [-0.099999998, 0.099999999]
  table.Push(std::vector<float>{0.5f, -1.0f});
  table.Pull(w);
  EXPECT_NEAR(w[0], -0.099999998, 1e-6);
  EXPECT_NEAR(w[1], 0.099999999, 1e-6);
  // t=2, g = [0.25, 0.5]: m = [0.07, -0.04], v = [0.00031225, 0.001249];
  //   mhat = m/0.19 = [0.368421053, -0.210526316];
  //   vhat = v/0.001999 = [0.156203102, 0.624812406];
  //   w0 = -0.1 - 0.1*0.368421053/0.395225381 = -0.193217960
  //   w1 = 0.1 + 0.1*0.210526316/0.790450762 = 0.126633703
  table.Push(std::vector<float>{0.25f, 0.5f});
  table.Pull(w);
  EXPECT_NEAR(w[0], -0.193217960, 1e-6);
  EXPECT_NEAR(w[1], 0.126633703, 1e-6);
  EXPECT_EQ(table.update_count(), 2u);
}

}  // namespace
}  // namespace hetps
