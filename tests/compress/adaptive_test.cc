#include "compress/adaptive.h"

#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "absl/status/status.h"
#include "compress/codec.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "support/test_support.h"

namespace hetps {
namespace {

using ::hetps::testing::StatusIs;
using ::testing::HasSubstr;

// The numbers below are binary fractions, so budgets are exact:
// 0.25 x 0.5 s = 0.125 s of transfer.
constexpr double kCompute = 0.5;

// 1000 non-zero floats. Sizes (codec.h): none 16 + 4000 = 4016,
// fp16 16 + 2000 = 2016, int8 16 + 4 scales x 4 + 1000 = 1032,
// sparse+int8 keeping k: 16 + 5k + 4 ceil(k / 256).
const GradientShape kDense{
    .layout = PayloadLayout::kDense, .dim = 1, .count = 1000, .nonzero = 1000};

CodecDecision Choose(double bytes_per_second,
                     std::vector<GradientShape> parts = {kDense}) {
  return ChooseCodec(AdaptiveConfig{}, bytes_per_second, kCompute, parts);
}

TEST(ChooseCodecTest, NoneOnAFastLink) {
  // Budget 0.125 s x 40000 B/s = 5000 B.
  const CodecDecision d = Choose(40000);
  EXPECT_EQ(d.spec.kind, CodecKind::kNone);
  EXPECT_EQ(d.raw_bytes, 4016u);
  EXPECT_EQ(d.encoded_bytes, 4016u);
  EXPECT_EQ(d.budget_seconds, 0.125);
  EXPECT_DOUBLE_EQ(d.transfer_seconds, 4016.0 / 40000);
  EXPECT_TRUE(d.within_budget);
  EXPECT_EQ(d.reason,
            "none: 4016 B in 100.4 ms at 40000 B/s, within 0.25 x 500 ms "
            "compute = 125 ms");
  // Exactly at the budget still fits: 4016 B = 0.125 s x 32128 B/s.
  EXPECT_EQ(Choose(32128).spec.kind, CodecKind::kNone);
}

TEST(ChooseCodecTest, Fp16ThenInt8AsBandwidthDrops) {
  const CodecDecision fp16 = Choose(32127);  // budget just under 4016 B
  EXPECT_EQ(fp16.spec.kind, CodecKind::kFp16);
  EXPECT_EQ(fp16.encoded_bytes, 2016u);

  const CodecDecision half = Choose(20000);  // budget 2500 B
  EXPECT_EQ(half.spec.kind, CodecKind::kFp16);
  EXPECT_EQ(half.reason,
            "fp16: 2016 B in 100.8 ms at 20000 B/s, within 0.25 x 500 ms "
            "compute = 125 ms; none needs 4016 B = 200.8 ms");

  const CodecDecision int8 = Choose(10000);  // budget 1250 B
  EXPECT_EQ(int8.spec.kind, CodecKind::kInt8);
  EXPECT_EQ(int8.encoded_bytes, 1032u);
  EXPECT_EQ(int8.raw_bytes, 4016u);
  EXPECT_EQ(int8.reason,
            "int8: 1032 B in 103.2 ms at 10000 B/s, within 0.25 x 500 ms "
            "compute = 125 ms; fp16 needs 2016 B = 201.6 ms");
}

TEST(ChooseCodecTest, SparseInt8WithTheLargestKThatFits) {
  // Budget 500 B: 16 + 5k + 4 ceil(k / 256) <= 500 holds up to k = 96,
  // which fills it exactly.
  const CodecDecision d = Choose(4000);
  EXPECT_EQ(d.spec.kind, CodecKind::kSparseInt8);
  EXPECT_EQ(KeptLimit(1000, d.spec.keep_fraction), 96u);
  EXPECT_EQ(d.spec.keep_fraction, 0.096);
  EXPECT_EQ(d.encoded_bytes, 500u);
  EXPECT_TRUE(d.within_budget);
  EXPECT_EQ(d.reason,
            "sparse+int8 keeping 9.6%: 500 B in 125 ms at 4000 B/s, within "
            "0.25 x 500 ms compute = 125 ms; int8 needs 1032 B = 258 ms");
  // One byte less of budget: 95 entries.
  const CodecDecision less = Choose(3992);  // 499 B
  EXPECT_EQ(KeptLimit(1000, less.spec.keep_fraction), 95u);
  EXPECT_EQ(less.encoded_bytes, 495u);
}

TEST(ChooseCodecTest, OverBudgetKeepsOneEntryAndSaysSo) {
  // Budget 12.5 B; one entry is 16 + 5 + 4 = 25 B.
  const CodecDecision d = Choose(100);
  EXPECT_EQ(d.spec.kind, CodecKind::kSparseInt8);
  EXPECT_EQ(KeptLimit(1000, d.spec.keep_fraction), 1u);
  EXPECT_EQ(d.encoded_bytes, 25u);
  EXPECT_FALSE(d.within_budget);
  EXPECT_EQ(d.reason,
            "sparse+int8 keeping 0.1%: 25 B in 250 ms at 100 B/s, still over "
            "0.25 x 500 ms compute = 125 ms");
}

TEST(ChooseCodecTest, MostlyZeroGradientGoesSparseWithoutLoss) {
  const GradientShape sparse{
      .layout = PayloadLayout::kDense, .dim = 1, .count = 1000, .nonzero = 10};
  // Sparse fp32 is 16 + 10 x 8 = 96 B against 4016: lossless and smaller.
  const CodecDecision d = Choose(40000, {sparse});
  EXPECT_EQ(d.spec.kind, CodecKind::kSparseFp32);
  EXPECT_EQ(d.spec.keep_fraction, 0);
  EXPECT_EQ(d.encoded_bytes, 96u);
  EXPECT_THAT(d.reason, HasSubstr("sparse (non-zeros): 96 B"));
  // Even on a slow link: 96 B fit 0.125 s x 800 B/s = 100 B.
  EXPECT_EQ(Choose(800, {sparse}).spec.kind, CodecKind::kSparseFp32);
}

TEST(ChooseCodecTest, RowSetsAndMultiTensorPushes) {
  // 100 rows of 16: none 16 + 100 x (8 + 64) = 7216, fp16 16 + 100 x 40 =
  // 4016, int8 (1600 values share ceil(1600 / 256) = 7 scales) 16 + 100 x 8
  // + 7 x 4 + 1600 = 2444, top-k k rows 16 + 24k + 4 ceil(16k / 256).
  const GradientShape rows{
      .layout = PayloadLayout::kRows, .dim = 16, .count = 100, .nonzero = 100};
  EXPECT_EQ(EncodedSize({.kind = CodecKind::kInt8}, rows), 2444u);
  EXPECT_EQ(Choose(7216 * 8, {rows}).spec.kind, CodecKind::kNone);
  EXPECT_EQ(Choose(4016 * 8, {rows}).spec.kind, CodecKind::kFp16);
  EXPECT_EQ(Choose(2444 * 8, {rows}).spec.kind, CodecKind::kInt8);
  EXPECT_EQ(Choose(2443 * 8, {rows}).spec.kind, CodecKind::kSparseInt8);
  // 1000 B: 16 + 24k + 4 ceil(k / 16) <= 1000 up to k = 40 (988 B; 41 rows
  // take 1012).
  const CodecDecision topk = Choose(8000, {rows});
  EXPECT_EQ(topk.spec.kind, CodecKind::kSparseInt8);
  EXPECT_EQ(KeptLimit(100, topk.spec.keep_fraction), 40u);
  EXPECT_EQ(topk.encoded_bytes, 988u);

  // Both tensors in one push share the codec and the budget.
  const std::vector<GradientShape> push = {kDense, rows};
  EXPECT_EQ(Choose(8000, push).raw_bytes, 4016u + 7216u);
  EXPECT_EQ(Choose((2016 + 4016) * 8, push).spec.kind, CodecKind::kFp16);
  const CodecDecision both = Choose(8000, push);  // 1000 B
  ASSERT_EQ(both.spec.kind, CodecKind::kSparseInt8);
  EXPECT_TRUE(both.within_budget);
  EXPECT_EQ(both.encoded_bytes,
            EncodedSize(both.spec, kDense) + EncodedSize(both.spec, rows));
  EXPECT_LE(both.encoded_bytes, 1000u);
  // The largest fraction: one more entry of the dense tensor is over.
  CodecSpec more = both.spec;
  more.keep_fraction += 0.001;
  EXPECT_GT(EncodedSize(more, kDense) + EncodedSize(more, rows), 1000u);
}

TEST(ChooseCodecTest, NoMeasurementMeansNone) {
  const CodecDecision unknown = Choose(0);
  EXPECT_EQ(unknown.spec.kind, CodecKind::kNone);
  EXPECT_EQ(unknown.reason, "none: link bandwidth not measured yet");
  EXPECT_EQ(unknown.encoded_bytes, 4016u);
  const std::vector<GradientShape> parts = {kDense};
  EXPECT_EQ(ChooseCodec(AdaptiveConfig{}, 100, 0, parts).reason,
            "none: no compute time measured yet");
}

TEST(BandwidthEstimatorTest, AveragesBytesAndSecondsSeparately) {
  BandwidthEstimator estimator(0.25);
  EXPECT_EQ(estimator.bytes_per_second(), 0);
  estimator.Observe(1000, 1);
  EXPECT_EQ(estimator.bytes_per_second(), 1000);
  // b = 0.25 x 5000 + 0.75 x 1000 = 2000, s = 0.25 x 2 + 0.75 x 1 = 1.25.
  estimator.Observe(5000, 2);
  EXPECT_EQ(estimator.bytes_per_second(), 1600);
  // No duration, no information.
  estimator.Observe(100, 0);
  estimator.Observe(100, -1);
  estimator.Observe(100, std::numeric_limits<double>::infinity());
  estimator.Observe(100, std::nan(""));
  EXPECT_EQ(estimator.bytes_per_second(), 1600);
  // b = 0.25 x 0 + 0.75 x 2000 = 1500, s = 0.25 x 0.5 + 0.75 x 1.25 = 1.0625.
  estimator.Observe(0, 0.5);
  EXPECT_DOUBLE_EQ(estimator.bytes_per_second(), 1500 / 1.0625);
}

TEST(AdaptiveCodecTest, UsesTheEmulatedOrTheMeasuredBandwidth) {
  const std::vector<GradientShape> parts = {kDense};
  AdaptiveCodec emulated(AdaptiveConfig{.emulated_bytes_per_second = 20000});
  emulated.RecordTransfer(1, 1);  // ignored: emulation wins
  EXPECT_EQ(emulated.bytes_per_second(), 20000);
  EXPECT_EQ(emulated.Choose(kCompute, parts).spec.kind, CodecKind::kFp16);
  EXPECT_EQ(emulated.last_decision().encoded_bytes, 2016u);

  AdaptiveCodec measured(AdaptiveConfig{.bandwidth_ewma_alpha = 0.5});
  EXPECT_EQ(measured.Choose(kCompute, parts).spec.kind, CodecKind::kNone);
  measured.RecordTransfer(10000, 1);
  EXPECT_EQ(measured.Choose(kCompute, parts).spec.kind, CodecKind::kInt8);
  measured.RecordTransfer(70000, 1);  // (0.5 x 70000 + 0.5 x 10000) / 1
  EXPECT_EQ(measured.bytes_per_second(), 40000);
  EXPECT_EQ(measured.Choose(kCompute, parts).spec.kind, CodecKind::kNone);
  EXPECT_EQ(measured.last_decision().bytes_per_second, 40000);
}

TEST(AdaptiveConfigTest, ValidateNamesTheField) {
  EXPECT_TRUE(AdaptiveConfig{}.Validate().ok());
  EXPECT_THAT(AdaptiveConfig{.max_transfer_fraction = 0}.Validate(),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("max_transfer_fraction: 0")));
  EXPECT_THAT(
      AdaptiveConfig{.bandwidth_ewma_alpha = 1.5}.Validate(),
      StatusIs(absl::StatusCode::kInvalidArgument,
               HasSubstr("bandwidth_ewma_alpha: 1.5 is outside (0, 1]")));
  EXPECT_THAT(AdaptiveConfig{.emulated_bytes_per_second = -1}.Validate(),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("emulated_bytes_per_second: -1")));
}

}  // namespace
}  // namespace hetps
