#include "model/model.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <memory>
#include <ostream>
#include <random>
#include <span>
#include <string>
#include <thread>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "hetps/config.h"
#include "support/test_support.h"

namespace hetps {

// Test names and failures show a level by its name.
void PrintTo(Isa isa, std::ostream* os) { *os << IsaName(isa); }

namespace {

using ::hetps::testing::StatusIs;
using ::testing::HasSubstr;

double Softplus(double z) {
  return std::max(z, 0.0) + std::log1p(std::exp(-std::abs(z)));
}
double Sigmoid(double z) { return 1.0 / (1.0 + std::exp(-z)); }

TrainConfig MakeTrain(const std::string& model, int k = 3,
                      std::vector<int> hidden = {5, 3}, Isa isa = Isa::kSse2) {
  TrainConfig train;
  train.model = model;
  train.isa = IsaName(isa);
  train.embedding_dim = k;
  train.hidden = std::move(hidden);
  train.optimizer = {.type = "adagrad", .learning_rate = 0.07f};
  train.dense_optimizer = {.type = "adam", .learning_rate = 0.002f};
  train.init = {.type = "normal", .scale = 0.02f, .seed = 11};
  return train;
}

std::unique_ptr<Model> MustCreate(const TrainConfig& train, int num_slots,
                                  int num_dense) {
  auto model = Model::Create(train, num_slots, num_dense);
  EXPECT_TRUE(model.ok()) << model.status();
  return model.ok() ? std::move(*model) : nullptr;
}

// A batch together with the parameters a worker would have pulled for it:
// one row per distinct key (as the client's de-duplication produces), and
// every occurrence pointing at its key's row.
struct PulledBatch {
  Batch batch;
  std::vector<uint64_t> unique_keys;
  std::vector<uint32_t> row_of_key;
  std::vector<float> rows;
  std::vector<float> dense;

  BatchParams params() const { return {row_of_key, rows, dense}; }
};

// Samples given as slots of keys; rows and dense parameters are filled later.
PulledBatch MakeBatch(
    const std::vector<std::vector<std::vector<uint64_t>>>& samples,
    const std::vector<float>& labels, int num_dense, uint64_t row_dim,
    uint64_t dense_size, uint32_t seed) {
  PulledBatch out;
  out.batch.num_slots = static_cast<int>(samples[0].size());
  out.batch.num_dense = num_dense;
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> uniform(-0.5f, 0.5f);
  absl::flat_hash_map<uint64_t, uint32_t> row_index;
  for (size_t i = 0; i < samples.size(); ++i) {
    out.batch.BeginSample(labels[i]);
    for (const auto& slot : samples[i]) {
      for (uint64_t key : slot) {
        out.batch.AddKey(key);
        auto [it, inserted] = row_index.try_emplace(
            key, static_cast<uint32_t>(out.unique_keys.size()));
        if (inserted) out.unique_keys.push_back(key);
        out.row_of_key.push_back(it->second);
      }
      out.batch.EndSlot();
    }
    for (int d = 0; d < num_dense; ++d) out.batch.AddDense(2 * uniform(rng));
  }
  out.rows.resize(out.unique_keys.size() * row_dim);
  for (float& x : out.rows) x = uniform(rng);
  out.dense.resize(dense_size);
  for (float& x : out.dense) x = uniform(rng);
  return out;
}

// Six samples over three slots: multi-valued slots, empty slots, a key
// repeated inside one slot, and keys shared across samples.
PulledBatch SmallBatch(const Model& model, int num_dense, uint32_t seed) {
  return MakeBatch(
      {
          {{1}, {10, 11}, {20}},
          {{2}, {}, {20, 21, 22}},
          {{1}, {11}, {}},
          {{3}, {10, 12, 10}, {21}},
          {{2, 3}, {12}, {22}},
          {{1}, {10, 11, 12}, {20}},
      },
      {1, 0, 1, 0, 1, 1}, num_dense, model.row_dim(), model.dense_size(), seed);
}

struct TrainResult {
  double loss_sum = 0;
  std::vector<float> p;
  std::vector<float> row_grads;
  std::vector<float> dense_grad;
};

TrainResult RunTrain(const Model& model, const PulledBatch& pulled) {
  TrainResult r;
  r.p.assign(pulled.batch.size(), -1.0f);
  // Garbage in the gradient buffers: Train must zero them itself.
  r.row_grads.assign(pulled.rows.size(), 7.0f);
  r.dense_grad.assign(pulled.dense.size(), -3.0f);
  r.loss_sum = model.Train(pulled.batch, pulled.params(), r.p, r.row_grads,
                           r.dense_grad);
  return r;
}

double MeanLoss(const Model& model, const PulledBatch& pulled) {
  return RunTrain(model, pulled).loss_sum /
         static_cast<double>(pulled.batch.size());
}

// Central finite difference of the mean loss at *param.
double NumericGradient(const Model& model, PulledBatch& pulled, float* param) {
  const float h = 1e-3f;
  const float saved = *param;
  const float plus = saved + h;
  const float minus = saved - h;
  *param = plus;
  const double loss_plus = MeanLoss(model, pulled);
  *param = minus;
  const double loss_minus = MeanLoss(model, pulled);
  *param = saved;
  // The step actually taken, after rounding to float.
  return (loss_plus - loss_minus) /
         (static_cast<double>(plus) - static_cast<double>(minus));
}

::testing::AssertionResult GradientsMatch(const Model& model,
                                          PulledBatch& pulled) {
  const TrainResult analytic = RunTrain(model, pulled);
  auto close = [](double a, double n) {
    return std::abs(a - n) <= 1e-2 * std::max(std::abs(a), std::abs(n)) + 2e-4;
  };
  int nonzero = 0;
  for (size_t i = 0; i < pulled.rows.size(); ++i) {
    const double numeric = NumericGradient(model, pulled, &pulled.rows[i]);
    if (!close(analytic.row_grads[i], numeric)) {
      return ::testing::AssertionFailure()
             << model.name() << " row " << i / model.row_dim() << " column "
             << i % model.row_dim() << ": analytic " << analytic.row_grads[i]
             << " numeric " << numeric;
    }
    if (std::abs(numeric) > 1e-3) ++nonzero;
  }
  for (size_t i = 0; i < pulled.dense.size(); ++i) {
    const double numeric = NumericGradient(model, pulled, &pulled.dense[i]);
    if (!close(analytic.dense_grad[i], numeric)) {
      return ::testing::AssertionFailure()
             << model.name() << " dense " << i << ": analytic "
             << analytic.dense_grad[i] << " numeric " << numeric;
    }
    if (std::abs(numeric) > 1e-3) ++nonzero;
  }
  // Guard against a vacuous pass (everything ~0).
  const size_t total = pulled.rows.size() + pulled.dense.size();
  if (nonzero * 2 < static_cast<int>(total)) {
    return ::testing::AssertionFailure()
           << model.name() << ": only " << nonzero << " of " << total
           << " gradients are non-trivial";
  }
  return ::testing::AssertionSuccess();
}

TEST(ModelCreateTest, RejectsBadShapesNamingTheField) {
  EXPECT_THAT(
      Model::Create(MakeTrain("xgboost"), 3, 0),
      StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("train.model")));
  EXPECT_THAT(
      Model::Create(MakeTrain("none"), 3, 0),
      StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("train.model")));
  EXPECT_THAT(
      Model::Create(MakeTrain("fm"), 0, 0),
      StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("num_slots")));
  EXPECT_THAT(
      Model::Create(MakeTrain("lr"), 2, -1),
      StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("num_dense")));
  EXPECT_THAT(Model::Create(MakeTrain("fm", 0), 3, 0),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("train.embedding_dim")));
  EXPECT_THAT(Model::Create(MakeTrain("deepfm", -2), 3, 0),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("train.embedding_dim")));
  EXPECT_THAT(Model::Create(MakeTrain("deepfm", 4, {400, 0, 400}), 3, 0),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("train.hidden[1]")));
  // lr ignores the embedding and MLP shape.
  EXPECT_TRUE(Model::Create(MakeTrain("lr", 0, {0}), 3, 0).ok());
  // An empty MLP is a linear deep part, allowed.
  EXPECT_TRUE(Model::Create(MakeTrain("deepfm", 4, {}), 3, 2).ok());
}

TEST(ModelTablesTest, LrAndFmHaveOneWeightRowAndABias) {
  for (const char* name : {"lr", "fm"}) {
    SCOPED_TRACE(name);
    const TrainConfig train = MakeTrain(name, 4);
    auto model = MustCreate(train, 3, 5);
    ASSERT_NE(model, nullptr);
    const uint64_t row_dim = std::string(name) == "lr" ? 1 : 5;
    EXPECT_EQ(model->name(), std::string(name));
    EXPECT_EQ(model->row_dim(), row_dim);
    EXPECT_EQ(model->dense_size(), 1u);
    const std::vector<TableConfig> tables = model->Tables();
    ASSERT_EQ(tables.size(), 2u);
    EXPECT_EQ(tables[0].name, std::string(name) + "_emb");
    EXPECT_EQ(tables[0].kind, TableKind::kSparse);
    EXPECT_EQ(tables[0].dim, row_dim);
    EXPECT_EQ(tables[0].optimizer.type, "adagrad");
    EXPECT_FLOAT_EQ(tables[0].optimizer.learning_rate, 0.07f);
    EXPECT_EQ(tables[0].init.type, "normal");
    EXPECT_FLOAT_EQ(tables[0].init.scale, 0.02f);
    EXPECT_EQ(tables[0].init.seed, 11u);
    EXPECT_EQ(tables[1].name, std::string(name) + "_dense");
    EXPECT_EQ(tables[1].kind, TableKind::kDense);
    EXPECT_EQ(tables[1].dim, 1u);
    EXPECT_EQ(tables[1].optimizer.type, "adam");
    EXPECT_FLOAT_EQ(tables[1].optimizer.learning_rate, 0.002f);
    EXPECT_EQ(tables[1].init.type, "zero");
  }
}

TEST(ModelTablesTest, DeepFmDenseHoldsBiasAndEveryLayer) {
  // in = 3 slots * k 3 + 2 dense = 11; b + (11*5 + 5) + (5*3 + 3) + 3.
  auto small = MustCreate(MakeTrain("deepfm", 3, {5, 3}), 3, 2);
  ASSERT_NE(small, nullptr);
  EXPECT_EQ(small->row_dim(), 4u);
  EXPECT_EQ(small->dense_size(), 82u);
  std::vector<TableConfig> tables = small->Tables();
  ASSERT_EQ(tables.size(), 2u);
  EXPECT_EQ(tables[0].name, "deepfm_emb");
  EXPECT_EQ(tables[0].dim, 4u);
  EXPECT_EQ(tables[0].init.type, "normal");
  EXPECT_EQ(tables[1].name, "deepfm_dense");
  EXPECT_EQ(tables[1].kind, TableKind::kDense);
  EXPECT_EQ(tables[1].dim, 82u);
  EXPECT_EQ(tables[1].optimizer.type, "adam");
  EXPECT_EQ(tables[1].init.type, "uniform");
  EXPECT_FLOAT_EQ(tables[1].init.scale, std::sqrt(6.0f / 11));
  EXPECT_NE(tables[1].init.seed, tables[0].init.seed);

  // The Criteo shape: 39 slots, k = 8, 13 dense, 400-400-400.
  auto criteo = MustCreate(MakeTrain("deepfm", 8, {400, 400, 400}), 39, 13);
  ASSERT_NE(criteo, nullptr);
  EXPECT_EQ(criteo->dense_size(),
            1u + (325u * 400 + 400) + 2 * (400u * 400 + 400) + 400);
  EXPECT_FLOAT_EQ(criteo->Tables()[1].init.scale, std::sqrt(6.0f / 400));

  // No hidden layer: b + in weights.
  auto linear = MustCreate(MakeTrain("deepfm", 3, {}), 3, 2);
  ASSERT_NE(linear, nullptr);
  EXPECT_EQ(linear->dense_size(), 12u);
}

TEST(LrModelTest, HandComputedLogitsLossAndGradients) {
  auto model = MustCreate(MakeTrain("lr"), 2, 0);
  ASSERT_NE(model, nullptr);
  // Keys 1, 2, 3 in rows 0, 1, 2 with w = 0.2, 0.4, -1; b = 0.1.
  PulledBatch pulled = MakeBatch({{{1, 2}, {}}, {{1}, {3}}}, {1, 0},
                                 /*num_dense=*/0, 1, 1, /*seed=*/1);
  pulled.rows = {0.2f, 0.4f, -1.0f};
  pulled.dense = {0.1f};
  const double z0 = 0.1 + (0.2 + 0.4) / 2;  // empty slot adds nothing
  const double z1 = 0.1 + 0.2 - 1.0;
  const TrainResult r = RunTrain(*model, pulled);
  EXPECT_NEAR(r.p[0], Sigmoid(z0), 1e-6);
  EXPECT_NEAR(r.p[1], Sigmoid(z1), 1e-6);
  EXPECT_NEAR(r.loss_sum, (Softplus(z0) - z0) + Softplus(z1), 1e-6);
  const double g0 = (Sigmoid(z0) - 1) / 2;
  const double g1 = Sigmoid(z1) / 2;
  EXPECT_NEAR(r.row_grads[0], g0 / 2 + g1, 1e-6);
  EXPECT_NEAR(r.row_grads[1], g0 / 2, 1e-6);
  EXPECT_NEAR(r.row_grads[2], g1, 1e-6);
  EXPECT_NEAR(r.dense_grad[0], g0 + g1, 1e-6);
}

TEST(LrModelTest, LossIsFiniteForConfidentMistakes) {
  auto model = MustCreate(MakeTrain("lr"), 1, 0);
  ASSERT_NE(model, nullptr);
  PulledBatch pulled = MakeBatch({{{1}}, {{2}}}, {0, 1}, 0, 1, 1, 1);
  pulled.rows = {200.0f, 300.0f};
  pulled.dense = {0.0f};
  const TrainResult r = RunTrain(*model, pulled);
  // Sample 0: logit 200, label 0 → loss 200; sample 1: ≈ 0.
  EXPECT_NEAR(r.loss_sum, 200.0, 1e-3);
  EXPECT_FLOAT_EQ(r.p[0], 1.0f);
  EXPECT_NEAR(r.row_grads[0], 0.5, 1e-6);
  EXPECT_NEAR(r.row_grads[1], 0.0, 1e-6);
}

TEST(FmModelTest, HandComputedLogit) {
  auto model = MustCreate(MakeTrain("fm", 2), 3, 0);
  ASSERT_NE(model, nullptr);
  PulledBatch pulled =
      MakeBatch({{{1}, {2, 3}, {}}}, {1}, 0, model->row_dim(), 1, 1);
  pulled.rows = {0.1f, 1, 2,   // key 1: slot 0
                 0.2f, 1, 0,   // key 2: slot 1
                 0.4f, 3, 2};  // key 3: slot 1
  pulled.dense = {-0.5f};
  // e_0 = (1, 2), e_1 = mean((1,0), (3,2)) = (2, 1), e_2 = 0:
  // interactions <e_0, e_1> = 4; first order 0.1 + 0.3.
  const double z = -0.5 + 0.1 + 0.3 + 4;
  std::vector<float> p(1);
  model->Predict(pulled.batch, pulled.params(), p);
  EXPECT_NEAR(p[0], Sigmoid(z), 1e-6);
  const TrainResult r = RunTrain(*model, pulled);
  EXPECT_NEAR(r.loss_sum, Softplus(z) - z, 1e-6);
  // d logit / d e_0 = e_1 + e_2 = (2, 1); d logit / d e_1 = e_0 + e_2 =
  // (1, 2), split evenly between slot 1's two keys (slot mean).
  const double g = Sigmoid(z) - 1;
  const std::vector<double> expected = {g,     2 * g, g,   // key 1
                                        g / 2, g / 2, g,   // key 2
                                        g / 2, g / 2, g};  // key 3
  ASSERT_EQ(r.row_grads.size(), expected.size());
  for (size_t i = 0; i < expected.size(); ++i) {
    EXPECT_NEAR(r.row_grads[i], expected[i], 1e-6) << i;
  }
  EXPECT_NEAR(r.dense_grad[0], g, 1e-6);
}

struct ModelCase {
  std::string model;
  std::vector<int> hidden;
  int num_dense;
};

void PrintTo(const ModelCase& c, std::ostream* os) {
  *os << c.model << " hidden {";
  for (int w : c.hidden) *os << w << ",";
  *os << "} num_dense " << c.num_dense;
}

// Every model at every instruction-set level this CPU runs.
class GradientCheckTest
    : public ::testing::TestWithParam<std::tuple<ModelCase, Isa>> {
 protected:
  const ModelCase& c = std::get<0>(GetParam());
  TrainConfig Train() const {
    return MakeTrain(c.model, 3, c.hidden, std::get<1>(GetParam()));
  }
};

TEST_P(GradientCheckTest, MatchesCentralDifferencesOfTheMeanLoss) {
  auto model = MustCreate(Train(), 3, c.num_dense);
  ASSERT_NE(model, nullptr);
  PulledBatch pulled = SmallBatch(*model, c.num_dense, /*seed=*/5);
  EXPECT_TRUE(GradientsMatch(*model, pulled));
}

TEST_P(GradientCheckTest, PredictEqualsTheProbabilitiesOfTrain) {
  auto model = MustCreate(Train(), 3, c.num_dense);
  ASSERT_NE(model, nullptr);
  const PulledBatch pulled = SmallBatch(*model, c.num_dense, /*seed=*/9);
  const TrainResult r = RunTrain(*model, pulled);
  std::vector<float> p(pulled.batch.size(), -1.0f);
  model->Predict(pulled.batch, pulled.params(), p);
  EXPECT_EQ(p, r.p);
  // The returned loss is the sum over the batch.
  double expected = 0;
  for (size_t i = 0; i < p.size(); ++i) {
    const double q = r.p[i];
    expected -= pulled.batch.labels[i] > 0.5f ? std::log(q) : std::log(1 - q);
  }
  EXPECT_NEAR(r.loss_sum, expected, 1e-4 * expected);
}

// The models keep per-thread scratch between calls: a call must not see the
// previous one's leftovers, whatever its batch size or model, and another
// thread must compute the same thing.
TEST_P(GradientCheckTest, CallsAreIndependentOfEarlierCalls) {
  auto model = MustCreate(Train(), 3, c.num_dense);
  auto other = MustCreate(MakeTrain("deepfm", 3, {7}), 3, c.num_dense);
  ASSERT_NE(model, nullptr);
  ASSERT_NE(other, nullptr);
  const PulledBatch pulled = SmallBatch(*model, c.num_dense, /*seed=*/2);
  const TrainResult first = RunTrain(*model, pulled);

  const PulledBatch bigger =
      MakeBatch(std::vector<std::vector<std::vector<uint64_t>>>(
                    40, {{1, 2}, {10}, {20, 21}}),
                std::vector<float>(40, 1.0f), c.num_dense, other->row_dim(),
                other->dense_size(), /*seed=*/4);
  RunTrain(*other, bigger);
  const PulledBatch one = MakeBatch({{{3}, {}, {22}}}, {0}, c.num_dense,
                                    model->row_dim(), model->dense_size(), 6);
  RunTrain(*model, one);

  const TrainResult again = RunTrain(*model, pulled);
  EXPECT_EQ(again.p, first.p);
  EXPECT_EQ(again.row_grads, first.row_grads);
  EXPECT_EQ(again.dense_grad, first.dense_grad);
  TrainResult elsewhere;
  std::thread([&] { elsewhere = RunTrain(*model, pulled); }).join();
  EXPECT_EQ(elsewhere.p, first.p);
  EXPECT_EQ(elsewhere.row_grads, first.row_grads);
  EXPECT_EQ(elsewhere.dense_grad, first.dense_grad);
}

INSTANTIATE_TEST_SUITE_P(
    AllModels, GradientCheckTest,
    ::testing::Combine(
        ::testing::Values(ModelCase{"lr", {}, 0}, ModelCase{"fm", {}, 0},
                          ModelCase{"deepfm", {5, 3}, 2},
                          ModelCase{"deepfm", {}, 2},
                          ModelCase{"deepfm", {4}, 0}),
        ::testing::ValuesIn(AvailableIsas())),
    [](const ::testing::TestParamInfo<std::tuple<ModelCase, Isa>>& info) {
      const ModelCase& c = std::get<0>(info.param);
      std::string name = c.model;
      for (int w : c.hidden) name += "_" + std::to_string(w);
      return name + "_dense" + std::to_string(c.num_dense) + "_" +
             IsaName(std::get<1>(info.param));
    });

// What each level computes differs from the baseline only by rounding: the
// modules contract a*b+c into one FMA (one rounding instead of two) and sum
// in a different order (wider vectors, other GEMM blocking). Every output is
// built from sums of at most K = 120 terms per layer here (the widest layer,
// or the batch for a weight gradient), each of which can move by K·u of the
// sum of its terms' magnitudes (u = 2^-24 ≈ 6e-8, so ~7e-6), through up to
// 2 · 3 layers forward and back; 1e-4 of the largest magnitude in each output
// bounds that with room (measured: at most 3.6e-7 of it, deepfm at avx2 and
// avx512 on a Xeon with AVX-512), while a wrong kernel (a lost term, a stale
// register, a transposed block) moves outputs by their own size.
TEST(IsaTest, EveryLevelComputesWhatTheBaselineComputes) {
  constexpr int kSlots = 6;
  constexpr int kDense = 4;
  constexpr int kSamples = 120;
  std::mt19937 rng(17);
  std::vector<std::vector<std::vector<uint64_t>>> samples(kSamples);
  std::vector<float> labels(kSamples);
  for (int i = 0; i < kSamples; ++i) {
    labels[i] = static_cast<float>(rng() % 3 == 0);
    for (int s = 0; s < kSlots; ++s) {
      std::vector<uint64_t> slot(rng() % 3);  // 0, 1 or 2 keys
      for (uint64_t& key : slot) key = s * 1000 + rng() % 40;
      samples[i].push_back(std::move(slot));
    }
  }
  const std::vector<Isa> isas = AvailableIsas();
  for (const auto& [name, hidden] :
       std::vector<std::pair<std::string, std::vector<int>>>{
           {"lr", {}}, {"fm", {}}, {"deepfm", {100, 64, 32}}}) {
    auto baseline = MustCreate(MakeTrain(name, 8, hidden, Isa::kSse2), kSlots,
                               kDense);
    ASSERT_NE(baseline, nullptr);
    const PulledBatch pulled =
        MakeBatch(samples, labels, kDense, baseline->row_dim(),
                  baseline->dense_size(), /*seed=*/3);
    const TrainResult want = RunTrain(*baseline, pulled);
    for (Isa isa : isas) {
      SCOPED_TRACE(std::string(name) + " at " + IsaName(isa));
      auto model = MustCreate(MakeTrain(name, 8, hidden, isa), kSlots, kDense);
      ASSERT_NE(model, nullptr);
      EXPECT_EQ(model->isa(), isa);
      const TrainResult got = RunTrain(*model, pulled);
      const auto expect_close = [](const std::vector<float>& a,
                                   const std::vector<float>& b,
                                   const char* what) {
        ASSERT_EQ(a.size(), b.size()) << what;
        float scale = 0;
        for (float x : b) scale = std::max(scale, std::abs(x));
        ASSERT_GT(scale, 0.0f) << what << " is all zeros";
        float worst = 0;
        for (size_t i = 0; i < a.size(); ++i) {
          worst = std::max(worst, std::abs(a[i] - b[i]));
        }
        EXPECT_LE(worst, 1e-4f * scale) << what;
      };
      expect_close(got.p, want.p, "p");
      expect_close(got.row_grads, want.row_grads, "row grads");
      expect_close(got.dense_grad, want.dense_grad, "dense grad");
      EXPECT_NEAR(got.loss_sum, want.loss_sum, 1e-4 * want.loss_sum);
    }
  }
}

// The levels are found from the CPU here independently of isa.cc: on a CPU
// that has a level, its module must have loaded (an embedding or link
// mistake fails this test), and "auto" must take the highest.
TEST(IsaTest, AutoRunsTheHighestLevelThisCpuHas) {
  std::vector<Isa> expected = {Isa::kSse2};
#if defined(__x86_64__)
  const bool avx2 = __builtin_cpu_supports("avx2") &&
                    __builtin_cpu_supports("fma") &&
                    __builtin_cpu_supports("bmi") &&
                    __builtin_cpu_supports("bmi2");
  const bool avx512 = avx2 && __builtin_cpu_supports("avx512f") &&
                      __builtin_cpu_supports("avx512bw") &&
                      __builtin_cpu_supports("avx512cd") &&
                      __builtin_cpu_supports("avx512dq") &&
                      __builtin_cpu_supports("avx512vl");
  if (avx2) expected.push_back(Isa::kAvx2);
  if (avx512) expected.push_back(Isa::kAvx512);
#endif
  EXPECT_EQ(AvailableIsas(), expected);
  const auto selects = [](const std::string& name, Isa isa) {
    const absl::StatusOr<Isa> selected = SelectIsa(name);
    ASSERT_TRUE(selected.ok()) << name << ": " << selected.status();
    EXPECT_EQ(*selected, isa) << name;
  };
  selects("auto", expected.back());
  TrainConfig automatic = MakeTrain("deepfm", 4, {8});
  automatic.isa = "auto";
  auto chosen = MustCreate(automatic, 3, 0);
  ASSERT_NE(chosen, nullptr);
  EXPECT_EQ(chosen->isa(), expected.back());
  for (Isa isa : expected) selects(IsaName(isa), isa);
  // A level named that this machine cannot run is refused with the reason.
  for (Isa isa : {Isa::kAvx2, Isa::kAvx512}) {
    if (std::find(expected.begin(), expected.end(), isa) != expected.end()) {
      continue;
    }
    EXPECT_THAT(SelectIsa(IsaName(isa)),
                StatusIs(absl::StatusCode::kFailedPrecondition,
                         HasSubstr("cannot run here")));
  }
}

TEST(IsaTest, AnUnknownLevelIsRefusedNamingTheKnownOnes) {
  EXPECT_THAT(SelectIsa("avx1024"),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("'avx1024' (expected auto, sse2, avx2, "
                                 "avx512)")));
  TrainConfig train = MakeTrain("lr");
  train.isa = "neon";
  EXPECT_THAT(Model::Create(train, 3, 0),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("train.isa")));
}

// In-process SGD on a problem only the interactions can solve: the label is
// the XOR of the parities of the two slots' ids, so every first-order weight
// is useless (loss stays at log 2) while FM's <v_a, v_b> can separate it.
TEST(FmModelTest, SgdLearnsAnInteractionOnlyProblem) {
  constexpr int kIds = 8;
  TrainConfig train = MakeTrain("fm", 4);
  auto model = MustCreate(train, 2, 0);
  ASSERT_NE(model, nullptr);
  // Keys 0..7 are slot 0's ids, 8..15 slot 1's; row r is key r.
  std::mt19937 rng(3);
  std::uniform_real_distribution<float> init(-0.1f, 0.1f);
  std::vector<float> rows(2 * kIds * model->row_dim());
  for (float& x : rows) x = init(rng);
  std::vector<float> dense = {0.0f};

  Batch batch;
  batch.num_slots = 2;
  std::vector<uint32_t> row_of_key;
  for (int a = 0; a < kIds; ++a) {
    for (int b = 0; b < kIds; ++b) {
      batch.BeginSample(static_cast<float>((a % 2) ^ (b % 2)));
      batch.AddKey(a);
      batch.EndSlot();
      batch.AddKey(kIds + b);
      batch.EndSlot();
      row_of_key.push_back(a);
      row_of_key.push_back(kIds + b);
    }
  }
  std::vector<float> p(batch.size()), row_grads(rows.size()), dense_grad(1);
  const BatchParams params{row_of_key, rows, dense};
  const double initial = model->Train(batch, params, p, row_grads, dense_grad) /
                         static_cast<double>(batch.size());
  EXPECT_NEAR(initial, std::log(2.0), 0.05);
  const float lr = 0.5f;
  double loss = initial;
  for (int step = 0; step < 600 && loss > 0.05; ++step) {
    loss = model->Train(batch, params, p, row_grads, dense_grad) /
           static_cast<double>(batch.size());
    for (size_t i = 0; i < rows.size(); ++i) rows[i] -= lr * row_grads[i];
    dense[0] -= lr * dense_grad[0];
  }
  EXPECT_LT(loss, 0.05);
}

}  // namespace
}  // namespace hetps
