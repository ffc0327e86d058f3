#include "compress/error_feedback.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <map>
#include <ostream>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "compress/codec.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "support/test_support.h"

namespace hetps {
namespace {

using ::hetps::testing::StatusIs;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;

using testing::RandomValues;

double Norm(const std::vector<double>& v) {
  double squares = 0;
  for (double x : v) squares += x * x;
  return std::sqrt(squares);
}

struct FeedbackCase {
  const char* name;
  CodecSpec spec;
  bool rows;  // a row set of 100 rows x dim 10, else a dense tensor of 1000
};

void PrintTo(const FeedbackCase& c, std::ostream* os) { *os << c.name; }

class ResidualIdentityTest : public ::testing::TestWithParam<FeedbackCase> {};

// Σ true = Σ decoded + residual, up to the float rounding of the two
// additions per step, while the gap without feedback keeps growing.
TEST_P(ResidualIdentityTest, DecodedSumTracksTheTrueSum) {
  const FeedbackCase& c = GetParam();
  constexpr uint32_t kDim = 10;
  constexpr size_t kValues = 1000;
  constexpr int kSteps = 200;
  std::vector<uint64_t> keys(kValues / kDim);
  for (size_t r = 0; r < keys.size(); ++r) keys[r] = 1000 + 3 * r;

  ErrorFeedback feedback;
  // The residual as a dense vector (rows: row r at [r * dim, (r + 1) * dim)).
  auto residual = [&]() {
    std::vector<float> out(kValues, 0.0f);
    if (!c.rows) {
      const std::span<const float> held = feedback.dense_residual("w");
      std::copy(held.begin(), held.end(), out.begin());
      return out;
    }
    for (size_t r = 0; r < keys.size(); ++r) {
      const std::span<const float> held = feedback.row_residual("emb", keys[r]);
      std::copy(held.begin(), held.end(), out.begin() + r * kDim);
    }
    return out;
  };
  // Decodes a payload the way the server does, back to a dense vector.
  auto decode = [&](const std::string& payload) {
    std::vector<float> out(kValues, 0.0f);
    if (!c.rows) {
      EXPECT_TRUE(DecodeDense(payload, out).ok());
      return out;
    }
    std::vector<uint64_t> sent_keys;
    std::vector<float> sent_rows;
    EXPECT_TRUE(
        DecodeRows(payload, kDim, keys.size(), &sent_keys, &sent_rows).ok());
    for (size_t j = 0; j < sent_keys.size(); ++j) {
      const size_t r = (sent_keys[j] - 1000) / 3;
      std::copy_n(sent_rows.begin() + j * kDim, kDim, out.begin() + r * kDim);
    }
    return out;
  };

  std::vector<double> sum_true(kValues), sum_decoded(kValues),
      sum_plain(kValues), rounding(kValues);
  double fed_gap_early = 0, fed_gap_late = 0, plain_gap_50 = 0;
  for (int step = 1; step <= kSteps; ++step) {
    const std::vector<float> grad = RandomValues(kValues, step);
    const std::vector<float> before = residual();
    std::string payload;
    const absl::Status status =
        c.rows ? feedback.EncodeRows("emb", c.spec, kDim, keys, grad, &payload)
               : feedback.EncodeDense("w", c.spec, grad, &payload);
    ASSERT_TRUE(status.ok()) << status;
    const std::vector<float> decoded = decode(payload);
    std::string plain_payload;
    if (c.rows) {
      EncodeRows(c.spec, kDim, keys, grad, &plain_payload);
    } else {
      EncodeDense(c.spec, grad, &plain_payload);
    }
    const std::vector<float> plain = decode(plain_payload);
    const std::vector<float> after = residual();

    std::vector<double> fed_gap(kValues), plain_gap(kValues);
    for (size_t i = 0; i < kValues; ++i) {
      sum_true[i] += grad[i];
      sum_decoded[i] += decoded[i];
      sum_plain[i] += plain[i];
      // Each step rounds grad + old residual, then that sum - decoded.
      rounding[i] +=
          (std::abs(grad[i] + before[i]) + std::abs(after[i])) * 0x1p-24;
      const double identity_error =
          std::abs(sum_true[i] - sum_decoded[i] - after[i]);
      ASSERT_LE(identity_error, rounding[i] * (1 + 1e-6) + 1e-9)
          << "step " << step << " value " << i;
      fed_gap[i] = sum_true[i] - sum_decoded[i];
      plain_gap[i] = sum_true[i] - sum_plain[i];
    }
    if (step <= kSteps / 2) {
      fed_gap_early = std::max(fed_gap_early, Norm(fed_gap));
    } else {
      fed_gap_late = std::max(fed_gap_late, Norm(fed_gap));
    }
    if (step == 50) plain_gap_50 = Norm(plain_gap);
    if (step == kSteps) {
      const double plain_gap_200 = Norm(plain_gap);
      // With feedback the gap is the residual: it does not grow.
      EXPECT_LE(fed_gap_late, 1.25 * fed_gap_early);
      // Without, it is a random walk: about twice as far after 4x the steps,
      // and well beyond the residual.
      EXPECT_GT(plain_gap_200, 1.6 * plain_gap_50);
      EXPECT_GT(plain_gap_200, 3 * Norm(fed_gap));
    }
  }
}

INSTANTIATE_TEST_SUITE_P(
    Codecs, ResidualIdentityTest,
    ::testing::Values(
        FeedbackCase{"DenseInt8", {.kind = CodecKind::kInt8}, false},
        FeedbackCase{"DenseSparseTenth",
                     {.kind = CodecKind::kSparseFp32, .keep_fraction = 0.1},
                     false},
        FeedbackCase{"RowsInt8", {.kind = CodecKind::kInt8}, true},
        FeedbackCase{"RowsSparseTenth",
                     {.kind = CodecKind::kSparseFp32, .keep_fraction = 0.1},
                     true}),
    [](const ::testing::TestParamInfo<FeedbackCase>& info) {
      return std::string(info.param.name);
    });

const CodecSpec kInt8{.kind = CodecKind::kInt8};
// With two rows, keeps the one of larger norm; the other's residual is then
// the whole row.
const CodecSpec kKeepHalf{.kind = CodecKind::kSparseFp32, .keep_fraction = 0.5};

TEST(ErrorFeedbackTest, CodecNoneSendsTheResidualAndKeepsNothing) {
  ErrorFeedback feedback;
  std::string payload;
  const std::vector<float> first = RandomValues(100, 1);
  ASSERT_TRUE(feedback.EncodeDense("w", kInt8, first, &payload).ok());
  const std::vector<float> held(feedback.dense_residual("w").begin(),
                                feedback.dense_residual("w").end());
  ASSERT_EQ(held.size(), 100u);

  const std::vector<float> second = RandomValues(100, 2);
  ASSERT_TRUE(feedback.EncodeDense("w", CodecSpec{}, second, &payload).ok());
  std::vector<float> decoded(100);
  ASSERT_TRUE(DecodeDense(payload, decoded).ok());
  for (size_t i = 0; i < 100; ++i) EXPECT_EQ(decoded[i], second[i] + held[i]);
  EXPECT_THAT(feedback.dense_residual("w"), IsEmpty());

  // Rows: the pushed rows' residuals are sent and dropped.
  const std::vector<uint64_t> keys = {5, 9};
  ASSERT_TRUE(feedback
                  .EncodeRows("emb", kKeepHalf, 2, keys,
                              std::vector<float>{0.5f, 0, 3, 4}, &payload)
                  .ok());
  EXPECT_THAT(feedback.row_residual("emb", 5), ElementsAre(0.5f, 0.0f));
  ASSERT_TRUE(feedback
                  .EncodeRows("emb", CodecSpec{}, 2, keys,
                              std::vector<float>{1, 1, 1, 1}, &payload)
                  .ok());
  std::vector<uint64_t> sent_keys;
  std::vector<float> sent_rows;
  ASSERT_TRUE(DecodeRows(payload, 2, 2, &sent_keys, &sent_rows).ok());
  EXPECT_THAT(sent_rows, ElementsAre(1.5f, 1, 1, 1));
  EXPECT_EQ(feedback.residual_rows("emb"), 0u);
}

TEST(ErrorFeedbackTest, LosslessSparseKeepsNothing) {
  ErrorFeedback feedback;
  std::vector<float> grad = RandomValues(100, 3);
  for (size_t i = 0; i < grad.size(); i += 2) grad[i] = 0;
  std::string payload;
  ASSERT_TRUE(feedback
                  .EncodeDense("w", CodecSpec{.kind = CodecKind::kSparseFp32},
                               grad, &payload)
                  .ok());
  EXPECT_THAT(feedback.dense_residual("w"), IsEmpty());
}

TEST(ErrorFeedbackTest, ResidualIsDroppedAfterMaxAgeEncodesWithoutTheRow) {
  ErrorFeedback feedback(
      ErrorFeedbackLimits{.max_rows_per_table = 100, .max_age = 3});
  std::string payload;
  auto push = [&](std::vector<uint64_t> keys, std::vector<float> rows) {
    ASSERT_TRUE(
        feedback.EncodeRows("emb", kKeepHalf, 2, keys, rows, &payload).ok());
  };
  // Encode 1: key 1 is dropped by the codec, its row becomes the residual.
  push({1, 2}, {0.25f, 0.5f, 5, 5});
  EXPECT_THAT(feedback.row_residual("emb", 1), ElementsAre(0.25f, 0.5f));
  EXPECT_THAT(feedback.row_residual("emb", 2), IsEmpty());  // sent whole
  // Encodes 2 and 3 miss key 1 (key 3 alone is sent losslessly).
  push({3}, {1, 1});
  push({3}, {1, 1});
  EXPECT_EQ(feedback.residual_rows("emb"), 1u);
  EXPECT_THAT(feedback.row_residual("emb", 1), ElementsAre(0.25f, 0.5f));
  // Encode 4 is the third miss: dropped.
  push({3}, {1, 1});
  EXPECT_EQ(feedback.residual_rows("emb"), 0u);
  EXPECT_THAT(feedback.row_residual("emb", 1), IsEmpty());

  // Pushing a row again refreshes it, carrying the old residual along.
  push({1, 2}, {0.25f, 0.5f, 5, 5});  // encode 5
  push({3}, {1, 1});                  // 6
  push({1, 2}, {0.25f, 0.5f, 5, 5});  // 7: residual 0.25 + 0.25, 0.5 + 0.5
  EXPECT_THAT(feedback.row_residual("emb", 1), ElementsAre(0.5f, 1.0f));
  push({3}, {1, 1});  // 8
  push({3}, {1, 1});  // 9
  EXPECT_EQ(feedback.residual_rows("emb"), 1u);
  push({3}, {1, 1});  // 10: third encode since 7 without key 1
  EXPECT_EQ(feedback.residual_rows("emb"), 0u);
  // Other tables age on their own encodes only.
  EXPECT_EQ(feedback.residual_rows("other"), 0u);
}

TEST(ErrorFeedbackTest, CapDropsTheLeastRecentlyRefreshedRows) {
  ErrorFeedback feedback(
      ErrorFeedbackLimits{.max_rows_per_table = 4, .max_age = 100});
  std::string payload;
  // Keys 1..5 small, key 6 large; keeping 1 of 6 rows sends only key 6.
  const std::vector<uint64_t> keys = {1, 2, 3, 4, 5, 6};
  std::vector<float> rows;
  for (uint64_t k : keys) {
    rows.push_back(k == 6 ? 10.0f : 0.125f * k);
    rows.push_back(0);
  }
  const CodecSpec keep_one{.kind = CodecKind::kSparseFp32,
                           .keep_fraction = 1.0 / 6};
  ASSERT_TRUE(
      feedback.EncodeRows("emb", keep_one, 2, keys, rows, &payload).ok());
  // Five residuals, room for four: key 1, the first given, is dropped.
  EXPECT_EQ(feedback.residual_rows("emb"), 4u);
  EXPECT_THAT(feedback.row_residual("emb", 1), IsEmpty());
  EXPECT_THAT(feedback.row_residual("emb", 2), ElementsAre(0.25f, 0.0f));

  ASSERT_TRUE(feedback
                  .EncodeRows("emb", kKeepHalf, 2, std::vector<uint64_t>{7, 8},
                              std::vector<float>{1, 0, 10, 0}, &payload)
                  .ok());
  // Key 7's residual displaces key 2, refreshed longest ago.
  EXPECT_EQ(feedback.residual_rows("emb"), 4u);
  EXPECT_THAT(feedback.row_residual("emb", 2), IsEmpty());
  for (uint64_t k : {3, 4, 5, 7}) {
    EXPECT_THAT(feedback.row_residual("emb", k), ::testing::SizeIs(2)) << k;
  }
}

TEST(ErrorFeedbackTest, LongRunKeepsExactlyTheRowsTheRulesAllow) {
  constexpr uint32_t kMaxAge = 10;
  constexpr uint32_t kDim = 4;
  ErrorFeedback aged(
      ErrorFeedbackLimits{.max_rows_per_table = 1 << 20, .max_age = kMaxAge});
  ErrorFeedback capped(
      ErrorFeedbackLimits{.max_rows_per_table = 50, .max_age = 1000});
  const CodecSpec spec{.kind = CodecKind::kSparseFp32, .keep_fraction = 0.1};
  std::mt19937_64 rng(11);
  std::uniform_int_distribution<uint64_t> key_of(0, 2000);
  // Key → the encode that last pushed it, and whether it was sent then.
  std::map<uint64_t, std::pair<int, bool>> last;
  for (int encode = 1; encode <= 200; ++encode) {
    std::map<uint64_t, bool> unique;
    while (unique.size() < 40) unique[key_of(rng)] = true;
    std::vector<uint64_t> keys;
    for (const auto& [k, unused] : unique) keys.push_back(k);
    const std::vector<float> rows = RandomValues(keys.size() * kDim, encode);
    std::string payload;
    ASSERT_TRUE(aged.EncodeRows("emb", spec, kDim, keys, rows, &payload).ok());
    std::vector<uint64_t> sent;
    std::vector<float> sent_rows;
    ASSERT_TRUE(DecodeRows(payload, kDim, keys.size(), &sent, &sent_rows).ok());
    for (uint64_t k : keys) last[k] = {encode, false};
    for (uint64_t k : sent) last[k].second = true;

    // A row holds a residual iff it was not sent (sent rows are exact) and
    // fewer than kMaxAge encodes have missed it.
    size_t expected = 0;
    for (const auto& [k, seen] : last) {
      const bool held = !seen.second && encode - seen.first < int{kMaxAge};
      expected += held;
      ASSERT_EQ(aged.row_residual("emb", k).empty(), !held)
          << "key " << k << " at encode " << encode;
    }
    EXPECT_EQ(aged.residual_rows("emb"), expected);

    ASSERT_TRUE(
        capped.EncodeRows("emb", spec, kDim, keys, rows, &payload).ok());
    ASSERT_EQ(capped.residual_rows("emb"), std::min<size_t>(50, 36 * encode));
  }
}

TEST(ErrorFeedbackTest, ZeroLimitsKeepNoRows) {
  for (ErrorFeedbackLimits limits :
       {ErrorFeedbackLimits{.max_rows_per_table = 0, .max_age = 5},
        ErrorFeedbackLimits{.max_rows_per_table = 5, .max_age = 0}}) {
    ErrorFeedback feedback(limits);
    std::string payload;
    ASSERT_TRUE(feedback
                    .EncodeRows("emb", kKeepHalf, 1,
                                std::vector<uint64_t>{1, 2},
                                std::vector<float>{0.5f, 9}, &payload)
                    .ok());
    EXPECT_EQ(feedback.residual_rows("emb"), 0u);
  }
}

TEST(ErrorFeedbackTest, BadInputIsRefusedWithTheResidualUnchanged) {
  ErrorFeedback feedback;
  std::string payload;
  ASSERT_TRUE(
      feedback.EncodeDense("w", kInt8, RandomValues(10, 4), &payload).ok());
  const std::vector<float> held(feedback.dense_residual("w").begin(),
                                feedback.dense_residual("w").end());
  ASSERT_EQ(held.size(), 10u);

  EXPECT_THAT(feedback.EncodeDense("w", kInt8, RandomValues(11, 5), &payload),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("tensor 'w': gradient of 11 values, but its "
                                 "residual holds 10")));
  EXPECT_TRUE(payload.empty());
  std::vector<float> with_nan = RandomValues(10, 6);
  with_nan[3] = std::numeric_limits<float>::quiet_NaN();
  EXPECT_THAT(feedback.EncodeDense("w", kInt8, with_nan, &payload),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("tensor 'w' not encodable: gradient payload: "
                                 "int8 scale 0 is nan")));
  EXPECT_TRUE(payload.empty());
  EXPECT_THAT(feedback.dense_residual("w"), ::testing::ElementsAreArray(held));

  ASSERT_TRUE(feedback
                  .EncodeRows("emb", kKeepHalf, 2, std::vector<uint64_t>{1, 2},
                              std::vector<float>{0.5f, 0, 3, 4}, &payload)
                  .ok());
  EXPECT_THAT(
      feedback.EncodeRows("emb", kKeepHalf, 3, std::vector<uint64_t>{1},
                          std::vector<float>{1, 2, 3}, &payload),
      StatusIs(absl::StatusCode::kInvalidArgument,
               HasSubstr("rows of dim 3, but its residuals have dim 2")));
  EXPECT_THAT(feedback.EncodeRows("emb", kKeepHalf, 2, std::vector<uint64_t>{1},
                                  std::vector<float>{1, 2, 3}, &payload),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("1 keys of dim 2 need 2 values, got 3")));
  EXPECT_THAT(feedback.EncodeRows("emb", kInt8, 2, std::vector<uint64_t>{4, 4},
                                  std::vector<float>{1, 2, 3, 4}, &payload),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("duplicate key 4")));
  EXPECT_TRUE(payload.empty());
  EXPECT_THAT(feedback.row_residual("emb", 1), ElementsAre(0.5f, 0.0f));
  EXPECT_EQ(feedback.residual_rows("emb"), 1u);
}

}  // namespace
}  // namespace hetps
