#include "table/optimizer.h"

#include <cmath>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "hetps/config.h"

namespace hetps {
namespace {

using ::testing::HasSubstr;

// The expected numbers below were worked out by hand (in double precision)
// from the formulas in the comments; float arithmetic agrees to ~1e-7
// relative, so 1e-6 leaves room without hiding a wrong formula.
void ExpectNearRow(const std::vector<float>& actual,
                   const std::vector<double>& expected, int step) {
  ASSERT_EQ(actual.size(), expected.size());
  for (size_t i = 0; i < actual.size(); ++i) {
    const double tol = 1e-6 * std::max(1.0, std::fabs(expected[i]));
    EXPECT_NEAR(actual[i], expected[i], tol)
        << "step " << step << ", element " << i;
  }
}

std::unique_ptr<Optimizer> MustCreate(const OptimizerConfig& config) {
  auto opt = Optimizer::Create(config);
  EXPECT_TRUE(opt.ok()) << opt.status();
  return opt.ok() ? std::move(*opt) : nullptr;
}

TEST(OptimizerTest, SgdSubtractsScaledGradient) {
  OptimizerConfig config;
  config.type = "sgd";
  config.learning_rate = 0.1f;
  auto opt = MustCreate(config);
  ASSERT_NE(opt, nullptr);
  EXPECT_STREQ(opt->name(), "sgd");
  EXPECT_EQ(opt->StateWidth(2), 0u);

  std::vector<float> w = {1.0f, -2.0f};
  const std::vector<std::vector<float>> grads = {
      {0.5f, -1.0f}, {0.25f, 0.5f}, {-1.0f, 2.0f}};
  // w -= 0.1 * g:
  //   1: [1 - 0.05, -2 + 0.1]        = [0.95, -1.9]
  //   2: [0.95 - 0.025, -1.9 - 0.05] = [0.925, -1.95]
  //   3: [0.925 + 0.1, -1.95 - 0.2]  = [1.025, -2.15]
  const std::vector<std::vector<double>> expected = {
      {0.95, -1.9}, {0.925, -1.95}, {1.025, -2.15}};
  for (int step = 0; step < 3; ++step) {
    opt->Update(w.data(), nullptr, grads[step].data(), 2, step, 1.0f);
    ExpectNearRow(w, expected[step], step + 1);
  }
}

TEST(OptimizerTest, AdagradAccumulatesSquaredGradients) {
  OptimizerConfig config;
  config.type = "adagrad";
  config.learning_rate = 0.5f;
  config.epsilon = 0.1f;
  config.initial_accumulator = 1.0f;
  auto opt = MustCreate(config);
  ASSERT_NE(opt, nullptr);
  EXPECT_STREQ(opt->name(), "adagrad");
  ASSERT_EQ(opt->StateWidth(3), 3u);

  std::vector<float> w = {1.0f, -2.0f, 0.5f};
  std::vector<float> a(3, -7.0f);
  opt->InitState(w.data(), a.data(), 3);
  EXPECT_THAT(a, ::testing::ElementsAre(1.0f, 1.0f, 1.0f));

  const std::vector<std::vector<float>> grads = {
      {3.0f, -1.0f, 0.0f}, {1.0f, 2.0f, 0.5f}, {-2.0f, 0.5f, 4.0f}};
  // a += g², w -= 0.5 * g / (sqrt(a) + 0.1):
  // step 1: a = [10, 2, 1]
  //   w0 = 1 - 1.5/(3.16227766 + 0.1)  = 0.540198550
  //   w1 = -2 + 0.5/(1.41421356 + 0.1) = -1.669795587
  //   w2 = 0.5 (g = 0)
  // step 2: a = [11, 6, 1.25]
  //   w0 = 0.540198550 - 0.5/(3.31662479 + 0.1)  = 0.393855292
  //   w1 = -1.669795587 - 1/(2.44948974 + 0.1)   = -2.062030937
  //   w2 = 0.5 - 0.25/(1.11803399 + 0.1)         = 0.294751212
  // step 3: a = [15, 6.25, 17.25]
  //   w0 = 0.393855292 + 1/(3.87298335 + 0.1)    = 0.645555316
  //   w1 = -2.062030937 - 0.25/(2.5 + 0.1)       = -2.158184783
  //   w2 = 0.294751212 - 2/(4.15331193 + 0.1)    = -0.175470590
  const std::vector<std::vector<double>> expected_w = {
      {0.540198550, -1.669795587, 0.5},
      {0.393855292, -2.062030937, 0.294751212},
      {0.645555316, -2.158184783, -0.175470590}};
  const std::vector<std::vector<double>> expected_a = {
      {10, 2, 1}, {11, 6, 1.25}, {15, 6.25, 17.25}};
  for (int step = 0; step < 3; ++step) {
    opt->Update(w.data(), a.data(), grads[step].data(), 3, step, 1.0f);
    ExpectNearRow(w, expected_w[step], step + 1);
    ExpectNearRow(a, expected_a[step], step + 1);
  }
}

TEST(OptimizerTest, AdamAppliesBiasCorrectedMoments) {
  OptimizerConfig config;
  config.type = "adam";
  config.learning_rate = 0.1f;
  config.beta1 = 0.9f;
  config.beta2 = 0.999f;
  config.epsilon = 1e-8f;
  auto opt = MustCreate(config);
  ASSERT_NE(opt, nullptr);
  EXPECT_STREQ(opt->name(), "adam");
  ASSERT_EQ(opt->StateWidth(2), 4u);

  std::vector<float> w = {1.0f, -2.0f};
  std::vector<float> state(4, 5.0f);
  opt->InitState(w.data(), state.data(), 2);
  EXPECT_THAT(state, ::testing::ElementsAre(0.0f, 0.0f, 0.0f, 0.0f));

  const std::vector<std::vector<float>> grads = {
      {0.5f, -1.0f}, {0.25f, 0.5f}, {-1.0f, 2.0f}};
  // m = 0.9 m + 0.1 g; v = 0.999 v + 0.001 g²;
  // w -= 0.1 * (m / (1 - 0.9^t)) / (sqrt(v / (1 - 0.999^t)) + 1e-8).
  // t=1: m = [0.05, -0.1], v = [0.00025, 0.001]
  //      mhat = [0.5, -1], vhat = [0.25, 1]
  //      w = [1 - 0.1*0.5/0.5, -2 + 0.1*1/1] ≈ [0.9, -1.9] (eps: 1e-9 off)
  // t=2: m = [0.07, -0.04], v = [0.00031225, 0.001249]
  //      mhat = m/0.19 = [0.368421053, -0.210526316]
  //      vhat = v/0.001999 = [0.156203102, 0.624812406]
  //      w = [0.9 - 0.1*0.368421053/0.395225381,
  //           -1.9 + 0.1*0.210526316/0.790450762]
  //        = [0.806782040, -1.873366297]
  // t=3: m = [-0.037, 0.164], v = [0.00131193775, 0.005247751]
  //      mhat = m/0.271 = [-0.136531365, 0.605166052]
  //      vhat = v/0.002997001 = [0.437750188, 1.751000750]
  //      w = [0.806782040 + 0.1*0.136531365/0.661626925,
  //           -1.873366297 - 0.1*0.605166052/1.323253850]
  //        = [0.827417743, -1.919099476]
  const std::vector<std::vector<double>> expected_w = {
      {0.900000002, -1.900000001},
      {0.806782040, -1.873366297},
      {0.827417743, -1.919099476}};
  const std::vector<std::vector<double>> expected_state = {
      {0.05, -0.1, 0.00025, 0.001},
      {0.07, -0.04, 0.00031225, 0.001249},
      {-0.037, 0.164, 0.00131193775, 0.005247751}};
  for (int step = 0; step < 3; ++step) {
    opt->Update(w.data(), state.data(), grads[step].data(), 2, step, 1.0f);
    ExpectNearRow(w, expected_w[step], step + 1);
    ExpectNearRow(state, expected_state[step], step + 1);
  }
}

TEST(OptimizerTest, AdamBiasCorrectionFollowsStepArgument) {
  OptimizerConfig config;
  config.type = "adam";
  config.learning_rate = 0.1f;
  auto opt = MustCreate(config);
  ASSERT_NE(opt, nullptr);
  // With m = 0.1, v = 0.001 (as after one step of g = 1) and g = 1 again at
  // step 99 (t = 100): m = 0.19, v = 0.001999;
  // mhat = 0.19/(1 - 0.9^100) = 0.190005047,
  // vhat = 0.001999/(1 - 0.999^100) = 0.020996167,
  // w = 0 - 0.1 * 0.190005047 / 0.144900543 = -0.131127897.
  std::vector<float> w = {0.0f};
  std::vector<float> state = {0.1f, 0.001f};
  const float g = 1.0f;
  opt->Update(w.data(), state.data(), &g, 1, 99, 1.0f);
  EXPECT_NEAR(w[0], -0.131127897, 1e-6);
}

TEST(OptimizerTest, FtrlFollowsProximalClosedForm) {
  OptimizerConfig config;
  config.type = "ftrl";
  config.learning_rate = 0.5f;  // alpha
  config.ftrl_beta = 1.0f;
  config.l1 = 0.1f;
  config.l2 = 0.2f;
  auto opt = MustCreate(config);
  ASSERT_NE(opt, nullptr);
  EXPECT_STREQ(opt->name(), "ftrl");
  ASSERT_EQ(opt->StateWidth(3), 6u);

  // The initial weights only enter through the first sigma * w term.
  std::vector<float> w = {0.05f, -0.02f, 0.0f};
  std::vector<float> state(6, 3.0f);
  opt->InitState(w.data(), state.data(), 3);
  EXPECT_THAT(state, ::testing::Each(0.0f));

  const std::vector<std::vector<float>> grads = {
      {0.5f, 0.05f, -1.0f}, {0.25f, -0.02f, 2.0f}, {-1.0f, 0.01f, 0.5f}};
  // sigma = (sqrt(n + g²) - sqrt(n)) / 0.5; z += g - sigma*w; n += g²;
  // w = |z| <= 0.1 ? 0 : -(z - sign(z)*0.1) / ((1 + sqrt(n))/0.5 + 0.2).
  // step 1:
  //   e0: sigma = 0.5/0.5 = 1,  z = 0.5 - 0.05 = 0.45, n = 0.25
  //       w = -(0.35)/((1.5)/0.5 + 0.2) = -0.35/3.2 = -0.109375
  //   e1: sigma = 0.1,  z = 0.05 + 0.002 = 0.052, n = 0.0025 → |z|<=l1, w = 0
  //   e2: sigma = 2,    z = -1 - 0 = -1, n = 1
  //       w = -(-1 + 0.1)/(2/0.5 + 0.2) = 0.9/4.2 = 0.214285714
  // step 2:
  //   e0: sigma = (sqrt(0.3125) - 0.5)/0.5 = 0.118033989
  //       z = 0.45 + 0.25 + 0.118033989*0.109375 = 0.712909968, n = 0.3125
  //       w = -(0.612909968)/((1 + 0.559016994)/0.5 + 0.2) = -0.184720823
  //   e1: sigma = (sqrt(0.0029) - 0.05)/0.5, w was 0 → z = 0.052 - 0.02
  //       = 0.032, n = 0.0029 → w = 0
  //   e2: sigma = (sqrt(5) - 1)/0.5 = 2.472135955
  //       z = -1 + 2 - 2.472135955*0.214285714 = 0.470256581, n = 5
  //       w = -(0.370256581)/((1 + 2.236067977)/0.5 + 0.2) = -0.055492961
  // step 3:
  //   e0: sigma = (sqrt(1.3125) - sqrt(0.3125))/0.5 = 1.173253859
  //       z = 0.712909968 - 1 + 1.173253859*0.184720823 = -0.070365615
  //       n = 1.3125 → |z| <= l1, w = 0
  //   e1: z = 0.042, n = 0.003 → w = 0
  //   e2: sigma = (sqrt(5.25) - sqrt(5))/0.5 = 0.110439740
  //       z = 0.470256581 + 0.5 + 0.110439740*0.055492961 = 0.976385209
  //       n = 5.25, w = -(0.876385209)/((1 + 2.291287847)/0.5 + 0.2)
  //       = -0.129211269
  const std::vector<std::vector<double>> expected_w = {
      {-0.109375, 0.0, 0.214285714},
      {-0.184720823, 0.0, -0.055492961},
      {0.0, 0.0, -0.129211269}};
  const std::vector<std::vector<double>> expected_state = {
      {0.45, 0.052, -1, 0.25, 0.0025, 1},
      {0.712909968, 0.032, 0.470256581, 0.3125, 0.0029, 5},
      {-0.0703656147, 0.042, 0.976385209, 1.3125, 0.003, 5.25}};
  for (int step = 0; step < 3; ++step) {
    opt->Update(w.data(), state.data(), grads[step].data(), 3, step, 1.0f);
    ExpectNearRow(w, expected_w[step], step + 1);
    ExpectNearRow(state, expected_state[step], step + 1);
  }
}

// Rows of dim >= 4 go through the four-lane path; each element must come out
// bit-for-bit as if it had been updated alone (the scalar path, which the
// hand-computed tests above check).
// step_scale s (the aggregator's staleness weight) shortens the step and
// leaves the g² statistics alone. By hand, one update from w = 1 (ftrl: 0):
//   sgd     lr 0.1, g 0.5, s 0.5: w = 1 - 0.1 * 0.5 * 0.5            = 0.975
//   adagrad lr 0.5, eps 0.1, a0 1, g 3, s 0.5: a = 10,
//           w = 1 - 0.5 * 0.5 * 3 / (sqrt(10) + 0.1)              = 0.770099275
//   adam    lr 0.1, b1 0.9, b2 0.999, g 0.5, s 0.5: m = 0.1 * 0.5 * 0.5
//           = 0.025, v = 0.001 * 0.25 = 0.00025, m^ = 0.25, v^ = 0.25,
//           w = 1 - 0.1 * 0.25 / 0.5                              = 0.95
//   ftrl    alpha 0.5, beta 1, g 2, s 0.5: n = 4, sigma = 2 / 0.5 = 4,
//           z = 0.5 * 2 - 4 * 0 = 1, w = -1 / ((1 + 2) / 0.5)      =
//           -0.166666667
TEST(OptimizerTest, StepScaleShortensTheStepNotTheAccumulators) {
  struct Case {
    OptimizerConfig config;
    float w0, g;
    double want_w;
    std::vector<double> want_state;
  };
  std::vector<Case> cases(4);
  cases[0].config.type = "sgd";
  cases[0].config.learning_rate = 0.1f;
  cases[0] = {cases[0].config, 1.0f, 0.5f, 0.975, {}};
  cases[1].config.type = "adagrad";
  cases[1].config.learning_rate = 0.5f;
  cases[1].config.epsilon = 0.1f;
  cases[1].config.initial_accumulator = 1.0f;
  cases[1] = {cases[1].config, 1.0f, 3.0f, 0.770099275, {10.0}};
  cases[2].config.type = "adam";
  cases[2].config.learning_rate = 0.1f;
  cases[2].config.beta1 = 0.9f;
  cases[2].config.beta2 = 0.999f;
  cases[2].config.epsilon = 1e-8f;
  cases[2] = {cases[2].config, 1.0f, 0.5f, 0.95, {0.025, 0.00025}};
  cases[3].config.type = "ftrl";
  cases[3].config.learning_rate = 0.5f;
  cases[3].config.ftrl_beta = 1.0f;
  cases[3].config.l1 = 0.0f;
  cases[3].config.l2 = 0.0f;
  cases[3] = {cases[3].config, 0.0f, 2.0f, -0.166666667, {1.0, 4.0}};
  for (const Case& c : cases) {
    SCOPED_TRACE(c.config.type);
    auto opt = MustCreate(c.config);
    ASSERT_NE(opt, nullptr);
    std::vector<float> w = {c.w0};
    std::vector<float> state(opt->StateWidth(1));
    opt->InitState(w.data(), state.data(), 1);
    opt->Update(w.data(), state.data(), &c.g, 1, 0, 0.5f);
    ExpectNearRow(w, {c.want_w}, 1);
    ExpectNearRow(state, c.want_state, 1);
  }
}

// Why the staleness weight is a step scale: adagrad and adam divide the
// gradient by its own running magnitude, so a gradient weighted down by the
// same factor at every step moves the weights exactly as far as the
// unweighted one (epsilon and a0 at 0 make it exact), while step_scale
// does shorten the steps.
TEST(OptimizerTest, AdaptiveRulesIgnoreAUniformGradientWeight) {
  for (const char* type : {"adagrad", "adam"}) {
    SCOPED_TRACE(type);
    OptimizerConfig config;
    config.type = type;
    config.learning_rate = 0.1f;
    config.epsilon = 1e-12f;
    config.initial_accumulator = 0.0f;
    auto opt = MustCreate(config);
    ASSERT_NE(opt, nullptr);
    const std::vector<float> grads = {0.8f, -0.3f, 0.5f, 0.1f};
    auto run = [&](float weight, float step_scale) {
      std::vector<float> w = {1.0f};
      std::vector<float> state(opt->StateWidth(1));
      opt->InitState(w.data(), state.data(), 1);
      for (size_t t = 0; t < grads.size(); ++t) {
        const float g = weight * grads[t];
        opt->Update(w.data(), state.data(), &g, 1, t, step_scale);
      }
      return w[0];
    };
    const float plain = run(1.0f, 1.0f);
    EXPECT_NEAR(run(0.5f, 1.0f), plain, 1e-6);
    EXPECT_GT(std::fabs(run(1.0f, 0.5f) - plain), 0.05);
  }
}

TEST(OptimizerTest, WideRowsMatchElementByElementUpdates) {
  constexpr uint64_t kDim = 11;  // two blocks of four, then a tail of three
  for (const char* type : {"sgd", "adagrad", "adam", "ftrl"}) {
    OptimizerConfig config;
    config.type = type;
    config.learning_rate = 0.3f;
    config.initial_accumulator = 0.2f;
    config.l1 = 0.01f;
    auto opt = MustCreate(config);
    ASSERT_NE(opt, nullptr);
    const uint64_t width = opt->StateWidth(kDim) / kDim;  // 0, 1 or 2

    std::vector<float> w(kDim), state(opt->StateWidth(kDim));
    for (uint64_t i = 0; i < kDim; ++i) w[i] = 0.1f * (i + 1) - 0.5f;
    opt->InitState(w.data(), state.data(), kDim);
    std::vector<std::vector<float>> w1(kDim), s1(kDim);
    for (uint64_t i = 0; i < kDim; ++i) {
      w1[i] = {w[i]};
      s1[i].resize(width);
      opt->InitState(w1[i].data(), s1[i].data(), 1);
    }
    for (uint64_t step = 0; step < 3; ++step) {
      std::vector<float> g(kDim);
      for (uint64_t i = 0; i < kDim; ++i) {
        g[i] = 0.37f * static_cast<float>(i) - 1.1f + 0.5f * step;
      }
      opt->Update(w.data(), state.data(), g.data(), kDim, step, 1.0f);
      for (uint64_t i = 0; i < kDim; ++i) {
        opt->Update(w1[i].data(), s1[i].data(), &g[i], 1, step, 1.0f);
      }
    }
    for (uint64_t i = 0; i < kDim; ++i) {
      EXPECT_EQ(w[i], w1[i][0]) << type << " element " << i;
      for (uint64_t k = 0; k < width; ++k) {
        // State part k of element i: state[k * kDim + i].
        EXPECT_EQ(state[k * kDim + i], s1[i][k]) << type << " element " << i;
      }
    }
  }
}

struct BadField {
  std::string field;
  void (*apply)(OptimizerConfig&);
};

class OptimizerCreateErrorTest : public ::testing::TestWithParam<BadField> {};

TEST_P(OptimizerCreateErrorTest, NamesTheField) {
  for (const char* type : {"sgd", "adagrad", "adam", "ftrl"}) {
    OptimizerConfig config;
    config.type = type;
    GetParam().apply(config);
    auto opt = Optimizer::Create(config);
    ASSERT_FALSE(opt.ok()) << type;
    EXPECT_EQ(opt.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(std::string(opt.status().message()),
                HasSubstr("optimizer." + GetParam().field + ":"))
        << type;
  }
}

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
constexpr float kInf = std::numeric_limits<float>::infinity();

INSTANTIATE_TEST_SUITE_P(
    BadFields, OptimizerCreateErrorTest,
    ::testing::Values(
        BadField{"learning_rate",
                 [](OptimizerConfig& c) { c.learning_rate = 0.0f; }},
        BadField{"learning_rate",
                 [](OptimizerConfig& c) { c.learning_rate = -0.1f; }},
        BadField{"learning_rate",
                 [](OptimizerConfig& c) { c.learning_rate = kNaN; }},
        BadField{"learning_rate",
                 [](OptimizerConfig& c) { c.learning_rate = kInf; }},
        BadField{"beta1", [](OptimizerConfig& c) { c.beta1 = 1.0f; }},
        BadField{"beta1", [](OptimizerConfig& c) { c.beta1 = -0.1f; }},
        BadField{"beta2", [](OptimizerConfig& c) { c.beta2 = 1.5f; }},
        BadField{"beta2", [](OptimizerConfig& c) { c.beta2 = kNaN; }},
        BadField{"epsilon", [](OptimizerConfig& c) { c.epsilon = 0.0f; }},
        BadField{"epsilon", [](OptimizerConfig& c) { c.epsilon = -1e-8f; }},
        BadField{"ftrl_beta", [](OptimizerConfig& c) { c.ftrl_beta = -1.0f; }},
        BadField{"l1", [](OptimizerConfig& c) { c.l1 = -0.5f; }},
        BadField{"l2", [](OptimizerConfig& c) { c.l2 = -0.5f; }},
        BadField{"initial_accumulator",
                 [](OptimizerConfig& c) { c.initial_accumulator = -1.0f; }}));

TEST(OptimizerTest, UnknownTypeIsInvalidArgument) {
  OptimizerConfig config;
  config.type = "foo";
  auto opt = Optimizer::Create(config);
  ASSERT_FALSE(opt.ok());
  EXPECT_EQ(opt.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(opt.status().message(),
            "optimizer.type: unknown optimizer 'foo' (expected sgd, adagrad, "
            "adam, ftrl)");
}

TEST(OptimizerTest, BoundaryValuesAreAccepted) {
  OptimizerConfig config;
  config.type = "adam";
  config.beta1 = 0.0f;
  config.beta2 = 0.0f;
  config.l1 = 0.0f;
  config.l2 = 0.0f;
  config.ftrl_beta = 0.0f;
  config.initial_accumulator = 0.0f;
  EXPECT_TRUE(Optimizer::Create(config).ok());
}

}  // namespace
}  // namespace hetps
