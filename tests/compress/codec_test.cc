#include "compress/codec.h"

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <new>
#include <random>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "support/test_support.h"

namespace hetps {
namespace {

using ::hetps::testing::StatusIs;
using ::testing::ElementsAre;
using ::testing::ElementsAreArray;
using ::testing::HasSubstr;

constexpr CodecKind kAllKinds[] = {
    CodecKind::kNone,       CodecKind::kFp16,       CodecKind::kInt8,
    CodecKind::kSparseFp32, CodecKind::kSparseFp16, CodecKind::kSparseInt8};

CodecSpec Spec(CodecKind kind, double keep_fraction = 0,
               uint32_t int8_block = 0) {
  return CodecSpec{
      .kind = kind, .keep_fraction = keep_fraction, .int8_block = int8_block};
}

using testing::RandomValues;

std::vector<float> DecodedDense(const std::string& payload, size_t n) {
  std::vector<float> out(n, -1.0f);
  const absl::Status status = DecodeDense(payload, out);
  EXPECT_TRUE(status.ok()) << status;
  return out;
}

std::vector<float> RoundTripDense(const CodecSpec& spec,
                                  const std::vector<float>& values) {
  std::string payload;
  EncodeDense(spec, values, &payload);
  EXPECT_EQ(payload.size(), EncodedSize(spec, ShapeOfDense(values)));
  return DecodedDense(payload, values.size());
}

struct Rows {
  std::vector<uint64_t> keys;
  std::vector<float> values;
};

Rows RoundTripRows(const CodecSpec& spec, uint32_t dim,
                   const std::vector<uint64_t>& keys,
                   const std::vector<float>& rows) {
  std::string payload;
  EncodeRows(spec, dim, keys, rows, &payload);
  EXPECT_EQ(payload.size(), EncodedSize(spec, ShapeOfRows(dim, rows)));
  Rows out;
  const absl::Status status =
      DecodeRows(payload, dim, keys.size(), &out.keys, &out.values);
  EXPECT_TRUE(status.ok()) << status;
  return out;
}

// Every finite binary16 value, in bit-pattern order from 0x0000, computed
// from the definition: subnormal m * 2^-24, normal (1024 + m) * 2^(e - 25).
std::vector<std::pair<uint16_t, float>> FiniteHalves() {
  std::vector<std::pair<uint16_t, float>> halves;
  for (uint32_t sign = 0; sign < 2; ++sign) {
    for (uint32_t e = 0; e < 31; ++e) {
      for (uint32_t m = 0; m < 1024; ++m) {
        const float magnitude = e == 0
                                    ? std::ldexp(static_cast<float>(m), -24)
                                    : std::ldexp(static_cast<float>(1024 + m),
                                                 static_cast<int>(e) - 25);
        halves.emplace_back((sign << 15) | (e << 10) | m,
                            sign ? -magnitude : magnitude);
      }
    }
  }
  return halves;
}

// The int8 bound of codec.h: scale / 2, plus the rounding of q * scale to
// float (half an ulp of the decoded value, at most |decoded| * 2^-24).
void ExpectWithinInt8Bound(float x, float decoded, float scale) {
  const double error =
      std::abs(static_cast<double>(x) - static_cast<double>(decoded));
  const double bound = static_cast<double>(scale) / 2 +
                       std::abs(static_cast<double>(decoded)) * 0x1p-24;
  EXPECT_LE(error, bound) << "x " << x << " decoded " << decoded << " scale "
                          << scale;
}

float BlockScale(std::span<const float> block) {
  float max_abs = 0;
  for (float v : block) max_abs = std::max(max_abs, std::abs(v));
  return max_abs / 127.0f;
}

// Checks the int8 bound for `values` quantized as one segment in blocks of
// `block` (0 = kDefaultDenseInt8Block): each block's scale is recomputed
// here from its max|x|, whatever row boundaries the block runs across.
void ExpectInt8BlocksWithinBound(const std::vector<float>& values,
                                 const std::vector<float>& decoded,
                                 uint32_t block) {
  ASSERT_EQ(decoded.size(), values.size());
  const size_t b = block == 0 ? kDefaultDenseInt8Block : block;
  for (size_t first = 0; first < values.size(); first += b) {
    const size_t last = std::min(first + b, values.size());
    const float scale = BlockScale(
        std::span<const float>(values).subspan(first, last - first));
    for (size_t i = first; i < last; ++i) {
      SCOPED_TRACE(::testing::Message() << "value " << i << " in block at "
                                        << first);
      ExpectWithinInt8Bound(values[i], decoded[i], scale);
    }
  }
}

void SetU32(std::string* payload, size_t offset, uint32_t value) {
  ASSERT_LE(offset + 4, payload->size());
  std::memcpy(payload->data() + offset, &value, 4);
}
void SetU64(std::string* payload, size_t offset, uint64_t value) {
  ASSERT_LE(offset + 8, payload->size());
  std::memcpy(payload->data() + offset, &value, 8);
}
void SetF32(std::string* payload, size_t offset, float value) {
  ASSERT_LE(offset + 4, payload->size());
  std::memcpy(payload->data() + offset, &value, 4);
}
void SetU16(std::string* payload, size_t offset, uint16_t value) {
  ASSERT_LE(offset + 2, payload->size());
  std::memcpy(payload->data() + offset, &value, 2);
}

// ---------------------------------------------------------------- names

TEST(CodecNameTest, ParseAcceptsEveryNameAndCodecNameInvertsIt) {
  for (CodecKind kind : kAllKinds) {
    absl::StatusOr<CodecSpec> spec = ParseCodec(CodecName(kind));
    ASSERT_TRUE(spec.ok()) << spec.status();
    EXPECT_EQ(spec->kind, kind);
    EXPECT_EQ(spec->keep_fraction, 0);
    EXPECT_EQ(spec->int8_block, 0u);
  }
  EXPECT_STREQ(CodecName(CodecKind::kSparseFp32), "sparse");
  EXPECT_STREQ(CodecName(static_cast<CodecKind>(9)), "unknown");
  EXPECT_THAT(ParseCodec("zstd"),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("'zstd'; valid: none, fp16, int8, sparse, "
                                 "sparse+fp16, sparse+int8")));
}

TEST(CodecNameTest, ValidateNamesTheBadField) {
  EXPECT_TRUE(ValidateCodecSpec(Spec(CodecKind::kSparseInt8, 0.5)).ok());
  EXPECT_TRUE(ValidateCodecSpec(Spec(CodecKind::kSparseInt8, 1)).ok());
  EXPECT_THAT(ValidateCodecSpec(Spec(CodecKind::kSparseFp32, 1.5)),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("keep_fraction: 1.5")));
  EXPECT_THAT(
      ValidateCodecSpec(Spec(CodecKind::kSparseFp32, std::nan(""))),
      StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("keep_fraction")));
  EXPECT_THAT(ValidateCodecSpec(Spec(static_cast<CodecKind>(6))),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("codec kind: unknown value 6")));
}

TEST(CodecNameTest, KeptLimitRoundsAndKeepsAtLeastOne) {
  EXPECT_EQ(KeptLimit(1000, 0), 1000u);
  EXPECT_EQ(KeptLimit(1000, 1), 1000u);
  EXPECT_EQ(KeptLimit(1000, 0.1), 100u);
  EXPECT_EQ(KeptLimit(200, 0.1), 20u);  // 0.1 * 200 is 20.000000000000004
  EXPECT_EQ(KeptLimit(10, 0.25), 3u);   // 2.5 rounds away from zero
  EXPECT_EQ(KeptLimit(10, 0.01), 1u);
  EXPECT_EQ(KeptLimit(0, 0.5), 0u);
}

// ---------------------------------------------------------------- dense

TEST(DenseCodecTest, NoneIsBitExact) {
  std::vector<float> values = RandomValues(1000, 1);
  values[0] = FLT_MAX;
  values[1] = -FLT_MAX;
  values[2] = 1e-40f;  // a float subnormal
  values[3] = -0.0f;
  const std::vector<float> decoded =
      RoundTripDense(Spec(CodecKind::kNone), values);
  ASSERT_EQ(decoded.size(), values.size());
  EXPECT_EQ(std::memcmp(decoded.data(), values.data(), values.size() * 4), 0);
  std::string payload;
  EncodeDense(Spec(CodecKind::kNone), values, &payload);
  EXPECT_EQ(payload.size(), 16u + 4 * 1000);
}

TEST(DenseCodecTest, Fp16IsExactForEveryRepresentableValue) {
  const std::vector<std::pair<uint16_t, float>> halves = FiniteHalves();
  ASSERT_EQ(halves.size(), 2u * 31 * 1024);
  std::vector<float> values;
  for (const auto& [bits, value] : halves) values.push_back(value);
  std::string payload;
  EncodeDense(Spec(CodecKind::kFp16), values, &payload);
  ASSERT_EQ(payload.size(), 16 + 2 * values.size());
  for (size_t i = 0; i < halves.size(); ++i) {
    uint16_t bits;
    std::memcpy(&bits, payload.data() + 16 + 2 * i, 2);
    ASSERT_EQ(bits, halves[i].first) << "value " << values[i];
  }
  const std::vector<float> decoded = DecodedDense(payload, values.size());
  ASSERT_EQ(std::memcmp(decoded.data(), values.data(), values.size() * 4), 0);
}

TEST(DenseCodecTest, Fp16RelativeErrorAtMostTwoToMinus11InNormalRange) {
  std::mt19937_64 rng(7);
  // Log-uniform over [2^-14, 65504], both signs.
  std::uniform_real_distribution<double> exponent(-14, std::log2(65504.0));
  std::vector<float> values(20000);
  for (size_t i = 0; i < values.size(); ++i) {
    const float v = static_cast<float>(std::exp2(exponent(rng)));
    values[i] = (i % 2) ? -v : v;
  }
  const std::vector<float> decoded =
      RoundTripDense(Spec(CodecKind::kFp16), values);
  double worst = 0;
  for (size_t i = 0; i < values.size(); ++i) {
    const double relative =
        std::abs(static_cast<double>(decoded[i]) - values[i]) /
        std::abs(static_cast<double>(values[i]));
    ASSERT_LE(relative, 0x1p-11) << values[i] << " -> " << decoded[i];
    worst = std::max(worst, relative);
  }
  // The bound is tight: random values come within 1% of it.
  EXPECT_GT(worst, 0.99 * 0x1p-11);
}

TEST(DenseCodecTest, Fp16RoundsToNearestEvenIncludingSubnormals) {
  const std::vector<float> values = {
      1 + 0x1p-11f,             // halfway between 1 and 1 + 2^-10: even is 1
      1 + 3 * 0x1p-11f,         // halfway, even is 1 + 2^-9
      1 + 0x1p-11f + 0x1p-20f,  // above halfway
      0x1p-25f,                 // halfway between 0 and 2^-24: 0
      1.5f * 0x1p-25f,          // above halfway: 2^-24
      2.5f * 0x1p-24f,          // tie between 2 and 3 units: 2
      3.5f * 0x1p-24f,          // tie between 3 and 4 units: 4
      0x1p-14f - 0x1p-26f,      // rounds up into the smallest normal
      1e-30f,                   // far below: 0
      -(1 + 3 * 0x1p-11f),      // negatives mirror
      -0.0f,
  };
  const std::vector<float> decoded =
      RoundTripDense(Spec(CodecKind::kFp16), values);
  EXPECT_THAT(decoded, ElementsAre(1.0f, 1 + 0x1p-9f, 1 + 0x1p-10f, 0.0f,
                                   0x1p-24f, 0x1p-23f, 4 * 0x1p-24f, 0x1p-14f,
                                   0.0f, -(1 + 0x1p-9f), 0.0f));
  EXPECT_TRUE(std::signbit(decoded[10]));
}

TEST(DenseCodecTest, Fp16ClampsFiniteOverflowTo65504) {
  const std::vector<float> values = {65504.0f, 65519.0f,  65520.0f, 1e6f,
                                     FLT_MAX,  -65520.0f, -FLT_MAX};
  const std::vector<float> decoded =
      RoundTripDense(Spec(CodecKind::kFp16), values);
  // 65520 and above would round to Inf; they are clamped instead.
  EXPECT_THAT(decoded, ElementsAre(65504.0f, 65504.0f, 65504.0f, 65504.0f,
                                   65504.0f, -65504.0f, -65504.0f));
  // Inf is not clamped: it is not a gradient and the decoder refuses it.
  std::string payload;
  EncodeDense(Spec(CodecKind::kFp16),
              std::vector<float>{1, std::numeric_limits<float>::infinity()},
              &payload);
  std::vector<float> out(2);
  EXPECT_THAT(DecodeDense(payload, out),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("fp16 value 1 is Inf or NaN (0x7c00)")));
}

TEST(DenseCodecTest, Int8ErrorAtMostHalfTheBlockScale) {
  // Blocks of very different magnitude, so a shared scale would fail.
  std::vector<float> values = RandomValues(1000, 3);
  for (size_t i = 0; i < values.size(); ++i) {
    values[i] *= std::ldexp(1.0f, static_cast<int>(i / 100) * 3 - 12);
  }
  for (size_t i = 256; i < 512; ++i) values[i] = 0;  // an all-zero block
  for (uint32_t block : {0u, 1u, 7u, 256u, 5000u}) {
    SCOPED_TRACE(block);
    const CodecSpec spec = Spec(CodecKind::kInt8, 0, block);
    std::string payload;
    EncodeDense(spec, values, &payload);
    const uint32_t b = block == 0 ? 256 : block;
    const size_t blocks = (values.size() + b - 1) / b;
    EXPECT_EQ(payload.size(), 16 + 4 * blocks + values.size());
    const std::vector<float> decoded = DecodedDense(payload, values.size());
    for (size_t first = 0; first < values.size(); first += b) {
      const size_t last = std::min<size_t>(first + b, values.size());
      const float scale = BlockScale(
          std::span<const float>(values).subspan(first, last - first));
      for (size_t i = first; i < last; ++i) {
        ExpectWithinInt8Bound(values[i], decoded[i], scale);
      }
    }
  }
  const std::vector<float> decoded =
      RoundTripDense(Spec(CodecKind::kInt8), values);
  for (size_t i = 256; i < 512; ++i) ASSERT_EQ(decoded[i], 0.0f);

  // At the top of the float range the scale is capped (kMaxInt8Scale) so
  // that 127 * scale stays finite; the bound still holds.
  const std::vector<float> huge = {FLT_MAX, -FLT_MAX, 1e37f, 1.0f};
  const std::vector<float> huge_decoded =
      RoundTripDense(Spec(CodecKind::kInt8), huge);
  for (size_t i = 0; i < huge.size(); ++i) {
    ASSERT_TRUE(std::isfinite(huge_decoded[i]));
    ExpectWithinInt8Bound(huge[i], huge_decoded[i], kMaxInt8Scale);
  }
}

TEST(DenseCodecTest, SparseTopKKeepsExactlyTheLargestMagnitudes) {
  std::vector<float> values(100);
  for (size_t i = 0; i < values.size(); ++i) {
    // Distinct magnitudes in a scrambled order, alternating signs.
    const float magnitude = static_cast<float>((i * 37) % 100 + 1);
    values[i] = (i % 2) ? -magnitude : magnitude;
  }
  const std::vector<float> decoded =
      RoundTripDense(Spec(CodecKind::kSparseFp32, 0.1), values);
  for (size_t i = 0; i < values.size(); ++i) {
    if (std::abs(values[i]) > 90) {
      EXPECT_EQ(decoded[i], values[i]) << i;
    } else {
      EXPECT_EQ(decoded[i], 0.0f) << i;
    }
  }
}

TEST(DenseCodecTest, SparseTiesKeepTheEarlierIndex) {
  const std::vector<float> values = {1, 3, -3, 0, 3, 2, -3};
  // KeptLimit(7, 2/7) = 2: the first two entries of magnitude 3.
  EXPECT_THAT(RoundTripDense(Spec(CodecKind::kSparseFp32, 2.0 / 7), values),
              ElementsAre(0, 3, -3, 0, 0, 0, 0));
  // 3 of them: indices 1, 2 and 4; -3 at index 6 loses.
  EXPECT_THAT(RoundTripDense(Spec(CodecKind::kSparseFp32, 3.0 / 7), values),
              ElementsAre(0, 3, -3, 0, 3, 0, 0));
}

TEST(DenseCodecTest, SparseNonZeroOnlyIsLossless) {
  std::vector<float> values = RandomValues(1000, 4);
  size_t nonzero = 0;
  for (size_t i = 0; i < values.size(); ++i) {
    if (i % 10 != 3) values[i] = 0;
    nonzero += values[i] != 0;
  }
  ASSERT_EQ(nonzero, 100u);
  std::string payload;
  EncodeDense(Spec(CodecKind::kSparseFp32), values, &payload);
  EXPECT_EQ(payload.size(), 16 + 8 * nonzero);
  EXPECT_EQ(DecodedDense(payload, values.size()), values);
}

TEST(DenseCodecTest, SparseWithFp16AndInt8KeepsTheSameEntries) {
  std::vector<float> values = RandomValues(600, 5);
  values[17] = 0;
  const std::vector<float> kept =
      RoundTripDense(Spec(CodecKind::kSparseFp32, 0.2), values);
  ASSERT_EQ(
      std::count_if(kept.begin(), kept.end(), [](float v) { return v != 0; }),
      120);
  const std::vector<float> fp16 =
      RoundTripDense(Spec(CodecKind::kSparseFp16, 0.2), values);
  const std::vector<float> int8 =
      RoundTripDense(Spec(CodecKind::kSparseInt8, 0.2, 50), values);
  // The int8 blocks run over the kept values, 50 at a time.
  std::vector<float> kept_values;
  for (float v : kept) {
    if (v != 0) kept_values.push_back(v);
  }
  size_t j = 0;
  for (size_t i = 0; i < values.size(); ++i) {
    if (kept[i] == 0) {
      EXPECT_EQ(fp16[i], 0.0f);
      EXPECT_EQ(int8[i], 0.0f);
      continue;
    }
    EXPECT_LE(std::abs(fp16[i] - kept[i]), std::abs(kept[i]) * 0x1p-11f);
    const size_t first = j / 50 * 50;
    const size_t length = std::min<size_t>(50, kept_values.size() - first);
    ExpectWithinInt8Bound(
        kept[i], int8[i],
        BlockScale(std::span<const float>(kept_values).subspan(first, length)));
    ++j;
  }
  EXPECT_EQ(j, 120u);
}

TEST(DenseCodecTest, EmptyTensorIsAHeaderOnly) {
  for (CodecKind kind : kAllKinds) {
    SCOPED_TRACE(CodecName(kind));
    std::string payload;
    EncodeDense(Spec(kind, 0.5), {}, &payload);
    EXPECT_EQ(payload.size(), kPayloadHeaderBytes);
    EXPECT_TRUE(DecodeDense(payload, {}).ok());
    std::vector<float> one(1);
    EXPECT_THAT(DecodeDense(payload, one),
                StatusIs(absl::StatusCode::kInvalidArgument,
                         HasSubstr("tensor length 0, expected 1")));
  }
}

TEST(DenseCodecTest, EncodedSizeMatchesThePayload) {
  std::vector<float> values = RandomValues(777, 6);
  for (size_t i = 0; i < values.size(); i += 3) values[i] = 0;
  for (CodecKind kind : kAllKinds) {
    for (double keep : {0.0, 0.01, 0.5, 0.9, 1.0}) {
      for (uint32_t block : {0u, 10u}) {
        const CodecSpec spec = Spec(kind, keep, block);
        std::string payload;
        EncodeDense(spec, values, &payload);
        EXPECT_EQ(payload.size(), EncodedSize(spec, ShapeOfDense(values)))
            << CodecName(kind) << " keep " << keep << " block " << block;
      }
    }
  }
}

// ---------------------------------------------------------------- rows

std::vector<uint64_t> Keys(size_t n) {
  std::vector<uint64_t> keys(n);
  for (size_t i = 0; i < n; ++i) keys[i] = (uint64_t{i} << 40) ^ (i * 7919);
  return keys;
}

TEST(RowCodecTest, LosslessKindsAreExactForDim1And16) {
  for (uint32_t dim : {1u, 16u}) {
    SCOPED_TRACE(dim);
    const std::vector<uint64_t> keys = Keys(50);
    const std::vector<float> rows = RandomValues(50 * dim, dim);
    for (CodecKind kind : {CodecKind::kNone, CodecKind::kSparseFp32}) {
      const Rows out = RoundTripRows(Spec(kind), dim, keys, rows);
      EXPECT_EQ(out.keys, keys);
      EXPECT_EQ(out.values, rows);
    }
  }
}

TEST(RowCodecTest, Fp16AndInt8StayWithinTheirBounds) {
  for (uint32_t dim : {1u, 9u, 16u}) {
    for (uint32_t block : {0u, 1u, 5u, 9u, 100u, 5000u}) {
      SCOPED_TRACE(::testing::Message() << "dim " << dim << " block " << block);
      const std::vector<uint64_t> keys = Keys(40);
      std::vector<float> rows = RandomValues(40 * dim, 10 + dim);
      for (size_t r = 0; r < 40; ++r) {
        for (uint32_t c = 0; c < dim; ++c) {
          rows[r * dim + c] *= std::ldexp(1.0f, static_cast<int>(r % 8) - 4);
        }
      }
      const Rows fp16 = RoundTripRows(Spec(CodecKind::kFp16), dim, keys, rows);
      EXPECT_EQ(fp16.keys, keys);
      for (size_t i = 0; i < rows.size(); ++i) {
        // Relative 2^-11 in the normal range; below 2^-14 the spacing is
        // 2^-24, so the error is at most 2^-25.
        EXPECT_LE(std::abs(fp16.values[i] - rows[i]),
                  std::max(std::abs(rows[i]) * 0x1p-11f, 0x1p-25f));
      }
      const Rows int8 =
          RoundTripRows(Spec(CodecKind::kInt8, 0, block), dim, keys, rows);
      EXPECT_EQ(int8.keys, keys);
      // All 40 * dim values form one segment: blocks run across rows, and
      // 0 means 256.
      ExpectInt8BlocksWithinBound(rows, int8.values, block);
      const uint32_t b = block == 0 ? 256 : block;
      std::string payload;
      EncodeRows(Spec(CodecKind::kInt8, 0, block), dim, keys, rows, &payload);
      uint32_t header_block;
      std::memcpy(&header_block, payload.data() + 12, 4);
      EXPECT_EQ(header_block, b);  // not capped at the row width
      EXPECT_EQ(payload.size(),
                16 + 40 * 8 + (40 * dim + b - 1) / b * 4 + 40 * dim);
    }
  }
}

TEST(RowCodecTest, Int8ScalesAreSharedAcrossRows) {
  // d = 9, r = 100, block 256: 900 values share ceil(900 / 256) = 4 scales,
  // not one per row.
  const uint32_t dim = 9;
  const std::vector<uint64_t> keys = Keys(100);
  const std::vector<float> rows = RandomValues(100 * dim, 40);
  for (uint32_t block : {0u, 256u}) {
    SCOPED_TRACE(block);
    const CodecSpec spec = Spec(CodecKind::kInt8, 0, block);
    std::string payload;
    EncodeRows(spec, dim, keys, rows, &payload);
    EXPECT_EQ(payload.size(), 16u + 100 * 8 + 4 * 4 + 900);
    EXPECT_EQ(payload.size(), 16u + 100 * 8 + (900 + 255) / 256 * 4 + 900);
    EXPECT_EQ(EncodedSize(spec, ShapeOfRows(dim, rows)), payload.size());
    // The scales are the blocks' max|x| / 127, blocks cut across rows.
    for (size_t s = 0; s < 4; ++s) {
      float scale;
      std::memcpy(&scale, payload.data() + 16 + 800 + 4 * s, 4);
      const size_t first = s * 256;
      const size_t length = std::min<size_t>(256, 900 - first);
      EXPECT_EQ(scale, BlockScale(std::span<const float>(rows).subspan(
                           first, length)))
          << "scale " << s;
    }
    const Rows out = RoundTripRows(spec, dim, keys, rows);
    EXPECT_EQ(out.keys, keys);
    ExpectInt8BlocksWithinBound(rows, out.values, 256);
  }
}

TEST(RowCodecTest, Int8BlockSpanningRowsUsesTheLargerRowsScale) {
  // dim 4, block 6: block 0 holds row 0 and the first half of row 1, block
  // 1 the rest of row 1 and row 2. Row 0 is tiny, row 1 huge: the tiny row's
  // error is bounded by the shared scale (row 1's max / 127), not its own.
  const uint32_t dim = 4;
  const std::vector<uint64_t> keys = {10, 20, 30};
  const std::vector<float> rows = {0.001f, -0.002f, 0.0005f, 0.003f,  // tiny
                                   1000.0f, -500.0f, 250.0f, -750.0f,  // huge
                                   0.01f,   0.02f,   -0.03f,  0.04f};
  const CodecSpec spec = Spec(CodecKind::kInt8, 0, 6);
  std::string payload;
  EncodeRows(spec, dim, keys, rows, &payload);
  ASSERT_EQ(payload.size(), 16u + 3 * 8 + 2 * 4 + 12);
  float scales[2];
  std::memcpy(scales, payload.data() + 16 + 24, 8);
  EXPECT_EQ(scales[0], 1000.0f / 127.0f);  // rows 0 and 1 (first half)
  EXPECT_EQ(scales[1], 750.0f / 127.0f);   // row 1 (second half) and row 2
  const Rows out = RoundTripRows(spec, dim, keys, rows);
  ExpectInt8BlocksWithinBound(rows, out.values, 6);
  // The tiny values are below half the shared scale: they decode as 0, an
  // error within scale / 2 but far above their own row's scale / 2.
  for (size_t i = 0; i < 4; ++i) {
    EXPECT_EQ(out.values[i], 0.0f) << i;
    ExpectWithinInt8Bound(rows[i], out.values[i], scales[0]);
  }
  for (size_t i = 8; i < 12; ++i) {
    EXPECT_EQ(out.values[i], 0.0f) << i;
    ExpectWithinInt8Bound(rows[i], out.values[i], scales[1]);
  }
  // The huge row is exact to its scale: 1000 = 127 * scale.
  EXPECT_FLOAT_EQ(out.values[4], 1000.0f);
}

TEST(RowCodecTest, SparseInt8BlocksRunOverTheKeptRows) {
  const uint32_t dim = 9;
  const std::vector<uint64_t> keys = Keys(100);
  std::vector<float> rows = RandomValues(100 * dim, 41);
  for (size_t r = 0; r < 100; ++r) {
    for (uint32_t c = 0; c < dim; ++c) {
      rows[r * dim + c] *= std::ldexp(1.0f, static_cast<int>(r % 5) * 2);
    }
  }
  const Rows kept =
      RoundTripRows(Spec(CodecKind::kSparseFp32, 0.3), dim, keys, rows);
  ASSERT_EQ(kept.keys.size(), 30u);
  for (uint32_t block : {0u, 7u, 20u}) {
    SCOPED_TRACE(block);
    const CodecSpec spec = Spec(CodecKind::kSparseInt8, 0.3, block);
    std::string payload;
    EncodeRows(spec, dim, keys, rows, &payload);
    const uint32_t b = block == 0 ? 256 : block;
    EXPECT_EQ(payload.size(), 16 + 30 * 8 + (270 + b - 1) / b * 4 + 270);
    const Rows int8 = RoundTripRows(spec, dim, keys, rows);
    EXPECT_EQ(int8.keys, kept.keys);
    // Blocks of the 270 kept values, across the kept rows' boundaries.
    ExpectInt8BlocksWithinBound(kept.values, int8.values, block);
  }
}

TEST(RowCodecTest, SparseKeepsTheRowsOfLargestNormInInputOrder) {
  const uint32_t dim = 16;
  const std::vector<uint64_t> keys = Keys(20);
  std::vector<float> rows(20 * dim);
  // Row r has norm 4 * ((r * 7) % 20 + 1): distinct, scrambled.
  for (size_t r = 0; r < 20; ++r) {
    for (uint32_t c = 0; c < dim; ++c) {
      rows[r * dim + c] =
          static_cast<float>((r * 7) % 20 + 1) * (c % 2 ? -1 : 1);
    }
  }
  const Rows out =
      RoundTripRows(Spec(CodecKind::kSparseFp32, 0.25), dim, keys, rows);
  std::vector<uint64_t> expected_keys;
  std::vector<float> expected_rows;
  for (size_t r = 0; r < 20; ++r) {
    if ((r * 7) % 20 + 1 > 15) {
      expected_keys.push_back(keys[r]);
      expected_rows.insert(expected_rows.end(), rows.begin() + r * dim,
                           rows.begin() + (r + 1) * dim);
    }
  }
  ASSERT_EQ(expected_keys.size(), 5u);
  EXPECT_EQ(out.keys, expected_keys);
  EXPECT_EQ(out.values, expected_rows);

  // sparse+fp16 / sparse+int8 send the same rows.
  EXPECT_EQ(
      RoundTripRows(Spec(CodecKind::kSparseFp16, 0.25), dim, keys, rows).keys,
      expected_keys);
  EXPECT_EQ(
      RoundTripRows(Spec(CodecKind::kSparseInt8, 0.25), dim, keys, rows).keys,
      expected_keys);
}

TEST(RowCodecTest, SparseRowTiesKeepTheEarlierRowAndDropZeroRows) {
  const uint32_t dim = 2;
  const std::vector<uint64_t> keys = {100, 200, 300, 400, 500};
  // Norms: 5, 0, 5, 5 (as (-4, 3)), 1.
  const std::vector<float> rows = {3, 4, 0, 0, 4, 3, -4, 3, 1, 0};
  EXPECT_THAT(
      RoundTripRows(Spec(CodecKind::kSparseFp32, 0.4), dim, keys, rows).keys,
      ElementsAre(100, 300));
  // keep_fraction 0: every non-zero row, the zero row is not sent.
  const Rows all = RoundTripRows(Spec(CodecKind::kSparseFp32), dim, keys, rows);
  EXPECT_THAT(all.keys, ElementsAre(100, 300, 400, 500));
  EXPECT_THAT(all.values, ElementsAre(3, 4, 4, 3, -4, 3, 1, 0));
  // A tiny fraction still keeps one row.
  EXPECT_THAT(
      RoundTripRows(Spec(CodecKind::kSparseFp32, 0.001), dim, keys, rows).keys,
      ElementsAre(100));
}

TEST(RowCodecTest, EmptyRowSetIsAHeaderOnly) {
  for (CodecKind kind : kAllKinds) {
    SCOPED_TRACE(CodecName(kind));
    std::string payload;
    EncodeRows(Spec(kind, 0.5), 4, {}, {}, &payload);
    EXPECT_EQ(payload.size(), kPayloadHeaderBytes);
    std::vector<uint64_t> keys = {1};
    std::vector<float> rows = {1, 2, 3, 4};
    EXPECT_TRUE(DecodeRows(payload, 4, 10, &keys, &rows).ok());
    EXPECT_TRUE(keys.empty());
    EXPECT_TRUE(rows.empty());
  }
}

TEST(RowCodecTest, EncodedSizeMatchesThePayload) {
  for (uint32_t dim : {1u, 3u, 16u}) {
    const std::vector<uint64_t> keys = Keys(61);
    std::vector<float> rows = RandomValues(61 * dim, 20 + dim);
    for (size_t r = 0; r < 61; r += 4) {
      std::fill_n(rows.begin() + r * dim, dim, 0.0f);
    }
    for (CodecKind kind : kAllKinds) {
      for (double keep : {0.0, 0.01, 0.5, 1.0}) {
        for (uint32_t block : {0u, 2u, 64u}) {
          const CodecSpec spec = Spec(kind, keep, block);
          std::string payload;
          EncodeRows(spec, dim, keys, rows, &payload);
          EXPECT_EQ(payload.size(), EncodedSize(spec, ShapeOfRows(dim, rows)))
              << CodecName(kind) << " dim " << dim << " keep " << keep
              << " block " << block;
        }
      }
    }
  }
  // codec none: the keys and fp32 values plus the header.
  const std::vector<float> rows(10 * 4, 1.0f);
  EXPECT_EQ(EncodedSize(Spec(CodecKind::kNone), ShapeOfRows(4, rows)),
            16u + 10 * (8 + 16));
}

// ---------------------------------------------------------------- refusals

std::string DensePayload(CodecKind kind, size_t n = 300) {
  std::vector<float> values = RandomValues(n, 30);
  for (size_t i = 0; i < n; i += 5) values[i] = 0;
  std::string payload;
  EncodeDense(Spec(kind, 0.5), values, &payload);
  return payload;
}

std::string RowPayload(CodecKind kind, uint32_t dim = 3, size_t n = 40,
                       uint32_t int8_block = 0) {
  std::vector<float> rows = RandomValues(n * dim, 31);
  std::string payload;
  EncodeRows(Spec(kind, 0.5, int8_block), dim, Keys(n), rows, &payload);
  return payload;
}

absl::Status DecodeDenseOf(std::string_view payload, size_t n) {
  std::vector<float> out(n, 7.0f);
  absl::Status status = DecodeDense(payload, out);
  if (!status.ok()) {
    // Refused payloads leave the output untouched.
    for (float v : out) EXPECT_EQ(v, 7.0f);
  }
  return status;
}

absl::Status DecodeRowsOf(std::string_view payload, uint32_t dim,
                          size_t max_rows = 1000) {
  std::vector<uint64_t> keys = {42};
  std::vector<float> rows = {7.0f};
  absl::Status status = DecodeRows(payload, dim, max_rows, &keys, &rows);
  if (!status.ok()) {
    EXPECT_THAT(keys, ElementsAre(42u));
    EXPECT_THAT(rows, ElementsAre(7.0f));
  }
  return status;
}

TEST(PayloadRefusalTest, EveryTruncationIsRefused) {
  for (CodecKind kind : kAllKinds) {
    SCOPED_TRACE(CodecName(kind));
    const std::string dense = DensePayload(kind);
    ASSERT_TRUE(DecodeDenseOf(dense, 300).ok());
    for (size_t length = 0; length < dense.size(); ++length) {
      ASSERT_THAT(
          DecodeDenseOf(std::string_view(dense).substr(0, length), 300),
          StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("truncated")))
          << "dense prefix of " << length;
    }
    // Row sets of width 3 and 9, int8 blocks that do and do not divide the
    // row width (one scale for all, or several running across rows).
    for (const auto& [dim, block] : std::vector<std::pair<uint32_t, uint32_t>>{
             {3, 0}, {9, 0}, {9, 7}, {9, 18}, {3, 1}}) {
      SCOPED_TRACE(::testing::Message() << "dim " << dim << " block " << block);
      const std::string rows = RowPayload(kind, dim, 40, block);
      ASSERT_TRUE(DecodeRowsOf(rows, dim).ok());
      for (size_t length = 0; length < rows.size(); ++length) {
        ASSERT_THAT(DecodeRowsOf(std::string_view(rows).substr(0, length), dim),
                    StatusIs(absl::StatusCode::kInvalidArgument,
                             HasSubstr("truncated")))
            << "row prefix of " << length;
      }
    }
  }
}

TEST(PayloadRefusalTest, BadHeaderFieldsAreNamed) {
  const std::string good = DensePayload(CodecKind::kFp16);
  auto refused = [&](size_t offset, char byte, const std::string& message) {
    std::string bad = good;
    bad[offset] = byte;
    EXPECT_THAT(
        DecodeDenseOf(bad, 300),
        StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr(message)));
  };
  refused(0, 0x00, "bad magic byte 0x00, expected 0xc5");
  refused(1, 2, "unknown format version 2");
  refused(2, 6, "unknown codec kind 6");
  refused(3, 7, "unknown layout 7");
  refused(3, 1, "a row-set payload where a dense tensor was expected");
  EXPECT_THAT(DecodeRowsOf(good, 3),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("a dense-tensor payload where a row set")));

  std::string trailing = good + "x";
  EXPECT_THAT(DecodeDenseOf(trailing, 300),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("1 trailing bytes")));
  EXPECT_THAT(DecodeDenseOf(good, 299),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("tensor length 300, expected 299")));

  std::string block = good;
  SetU32(&block, 12, 4);
  EXPECT_THAT(DecodeDenseOf(block, 300),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("block size 4 set for codec fp16")));
  std::string no_block = DensePayload(CodecKind::kInt8);
  SetU32(&no_block, 12, 0);
  EXPECT_THAT(DecodeDenseOf(no_block, 300),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("int8 block size 0")));
  std::string no_row_block = RowPayload(CodecKind::kSparseInt8);
  SetU32(&no_row_block, 12, 0);
  EXPECT_THAT(DecodeRowsOf(no_row_block, 3),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("int8 block size 0")));
  std::string fp16_rows = RowPayload(CodecKind::kFp16);
  SetU32(&fp16_rows, 12, 1);
  EXPECT_THAT(DecodeRowsOf(fp16_rows, 3),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("block size 1 set for codec fp16")));
}

TEST(PayloadRefusalTest, RowSetBlocksWiderThanTheRowsAreValid) {
  // Blocks run across rows, so any block in 1..2^32-1 is valid for row sets.
  const std::vector<float> rows = RandomValues(40 * 3, 32);
  for (uint32_t block : {4u, 120u, 121u, 0xffffffffu}) {
    SCOPED_TRACE(block);
    const CodecSpec spec = Spec(CodecKind::kInt8, 0, block);
    std::string payload;
    EncodeRows(spec, 3, Keys(40), rows, &payload);
    EXPECT_EQ(payload.size(),
              16u + 40 * 8 + (120 + uint64_t{block} - 1) / block * 4 + 120);
    std::vector<uint64_t> keys;
    std::vector<float> values;
    ASSERT_TRUE(DecodeRows(payload, 3, 40, &keys, &values).ok());
    ExpectInt8BlocksWithinBound(rows, values, block);
  }
}

TEST(PayloadRefusalTest, RowSetScaleCountMustBeCeilOfValuesOverBlock) {
  // d = 9, r = 10, block 4: 90 values need ceil(90 / 4) = 23 scales.
  const uint32_t dim = 9;
  const std::vector<float> rows = RandomValues(10 * dim, 33);
  std::string good;
  EncodeRows(Spec(CodecKind::kInt8, 0, 4), dim, Keys(10), rows, &good);
  ASSERT_EQ(good.size(), 16u + 80 + 23 * 4 + 90);
  ASSERT_TRUE(DecodeRowsOf(good, dim).ok());
  const std::string keys = good.substr(0, 16 + 80);
  const std::string scales = good.substr(16 + 80, 23 * 4);
  const std::string quantized = good.substr(16 + 80 + 23 * 4);

  // The old per-row layout: ceil(9 / 4) = 3 scales per row, 30 in all.
  std::string per_row = keys + scales + std::string(7 * 4, '\0') + quantized;
  EXPECT_THAT(DecodeRowsOf(per_row, dim),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("28 trailing bytes after 10 rows with 23 "
                                 "int8 scales")));
  // One scale too many, one too few.
  EXPECT_THAT(DecodeRowsOf(keys + scales + std::string(4, '\0') + quantized,
                           dim),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("4 trailing bytes")));
  EXPECT_THAT(DecodeRowsOf(keys + scales.substr(4) + quantized, dim),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("truncated: 274 bytes, but 10 rows with 23 "
                                 "int8 scales need 278")));
  // A header block that implies another scale count: 9 (10 scales), 3 (30).
  std::string block9 = good;
  SetU32(&block9, 12, 9);
  EXPECT_THAT(DecodeRowsOf(block9, dim),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("52 trailing bytes after 10 rows with 10 "
                                 "int8 scales")));
  std::string block3 = good;
  SetU32(&block3, 12, 3);
  EXPECT_THAT(DecodeRowsOf(block3, dim),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("truncated: 278 bytes, but 10 rows with 30 "
                                 "int8 scales need 306")));
  // The same for sparse+int8.
  std::string sparse;
  EncodeRows(Spec(CodecKind::kSparseInt8, 0, 4), dim, Keys(10), rows, &sparse);
  ASSERT_EQ(sparse.size(), good.size());
  sparse.insert(16 + 80, std::string(4, '\0'));
  EXPECT_THAT(DecodeRowsOf(sparse, dim),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("4 trailing bytes")));
}

TEST(PayloadRefusalTest, CountsThatDisagreeWithThePayloadAreRefused) {
  // A dense count larger than the payload holds.
  std::string dense = DensePayload(CodecKind::kNone, 10);
  SetU32(&dense, 4, 1000);
  SetU32(&dense, 8, 1000);
  EXPECT_THAT(DecodeDenseOf(dense, 1000),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("truncated: 56 bytes, but 1000 entries need "
                                 "4016")));
  // Stored entries that disagree with the length.
  std::string entries = DensePayload(CodecKind::kNone, 10);
  SetU32(&entries, 8, 9);
  EXPECT_THAT(DecodeDenseOf(entries, 10),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("9 entries for a tensor of length 10")));
  std::string sparse = DensePayload(CodecKind::kSparseFp32, 10);
  SetU32(&sparse, 8, 11);
  EXPECT_THAT(DecodeDenseOf(sparse, 10),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("11 entries for a tensor of length 10")));
  // A row count larger than the payload holds, and one above the limit.
  std::string rows = RowPayload(CodecKind::kNone, 3, 40);
  SetU32(&rows, 4, 41);
  EXPECT_THAT(DecodeRowsOf(rows, 3),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("truncated: 816 bytes hold 40 rows of 20 "
                                 "bytes, the header says 41")));
  EXPECT_THAT(DecodeRowsOf(RowPayload(CodecKind::kNone, 3, 40), 3, 39),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("40 rows, more than the 39 allowed")));
  EXPECT_THAT(DecodeRowsOf(RowPayload(CodecKind::kNone, 3, 40), 4),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("row width 3, expected 4")));
  std::string zero_width = RowPayload(CodecKind::kNone, 3, 0);
  SetU32(&zero_width, 8, 0);
  EXPECT_THAT(
      DecodeRowsOf(zero_width, 0),
      StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("row width 0")));
}

TEST(PayloadRefusalTest, BadIndicesAndKeysAreRefused) {
  // Sparse dense payload: indices from offset 16.
  std::string good = DensePayload(CodecKind::kSparseFp32, 10);
  uint32_t first, second;
  std::memcpy(&first, good.data() + 16, 4);
  std::memcpy(&second, good.data() + 20, 4);
  ASSERT_LT(first, second);

  std::string out_of_range = good;
  SetU32(&out_of_range, 16 + 4 * 4, 10);  // the last of 5 entries
  EXPECT_THAT(DecodeDenseOf(out_of_range, 10),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("index 10 of entry 4 out of range for tensor "
                                 "length 10")));
  std::string repeated = good;
  SetU32(&repeated, 20, first);
  EXPECT_THAT(
      DecodeDenseOf(repeated, 10),
      StatusIs(absl::StatusCode::kInvalidArgument,
               HasSubstr("of entry 1 is not above the previous index")));
  std::string decreasing = good;
  SetU32(&decreasing, 16, second);
  SetU32(&decreasing, 20, first);
  EXPECT_THAT(DecodeDenseOf(decreasing, 10),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("is not above the previous index")));

  std::string duplicate = RowPayload(CodecKind::kNone, 3, 5);
  const uint64_t key = Keys(5)[1];
  SetU64(&duplicate, 16 + 8 * 3, key);
  EXPECT_THAT(DecodeRowsOf(duplicate, 3),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr(absl::StrCat("duplicate key ", key))));
}

TEST(PayloadRefusalTest, BadValuesAndScalesAreRefused) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const float inf = std::numeric_limits<float>::infinity();
  // none, dense of 10: values from offset 16.
  for (float bad : {nan, inf, -inf}) {
    std::string payload = DensePayload(CodecKind::kNone, 10);
    SetF32(&payload, 16 + 4 * 3, bad);
    EXPECT_THAT(DecodeDenseOf(payload, 10),
                StatusIs(absl::StatusCode::kInvalidArgument,
                         HasSubstr(absl::StrCat("value 3 is ", bad))));
  }
  // Rows of dim 3, 5 rows: values after 5 keys.
  std::string rows = RowPayload(CodecKind::kNone, 3, 5);
  SetF32(&rows, 16 + 8 * 5 + 4 * 14, nan);
  EXPECT_THAT(DecodeRowsOf(rows, 3),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("value 14 is nan")));
  std::string fp16 = DensePayload(CodecKind::kFp16, 10);
  SetU16(&fp16, 16 + 2 * 9, 0xfe00);
  EXPECT_THAT(DecodeDenseOf(fp16, 10),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("fp16 value 9 is Inf or NaN (0xfe00)")));

  // int8, dense of 300 in blocks of 256: 2 scales from offset 16.
  for (float bad : {nan, inf, -1.0f, FLT_MAX}) {
    std::string payload = DensePayload(CodecKind::kInt8);
    SetF32(&payload, 16 + 4, bad);
    EXPECT_THAT(DecodeDenseOf(payload, 300),
                StatusIs(absl::StatusCode::kInvalidArgument,
                         HasSubstr(absl::StrCat("int8 scale 1 is ", bad))));
  }
  std::string largest = DensePayload(CodecKind::kInt8);
  SetF32(&largest, 16, kMaxInt8Scale);
  EXPECT_TRUE(DecodeDenseOf(largest, 300).ok());
  EXPECT_TRUE(std::isfinite(-127.0f * kMaxInt8Scale));
  EXPECT_FALSE(std::isfinite(127.0f * std::nextafter(kMaxInt8Scale, FLT_MAX)));
  std::string minus_128 = DensePayload(CodecKind::kInt8);
  minus_128[16 + 8 + 5] = static_cast<char>(-128);
  EXPECT_THAT(DecodeDenseOf(minus_128, 300),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("int8 value 5 is -128")));
  // A NaN in the gradient gives a NaN scale: refused, not applied.
  std::vector<float> with_nan(10, 1.0f);
  with_nan[4] = nan;
  std::string encoded;
  EncodeDense(Spec(CodecKind::kSparseInt8), with_nan, &encoded);
  EXPECT_THAT(DecodeDenseOf(encoded, 10),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("int8 scale 0 is nan")));
}

TEST(PayloadRefusalTest, HugeCountsAllocateNothing) {
  std::string rows = RowPayload(CodecKind::kInt8, 4, 2);
  SetU32(&rows, 4, 0xffffffff);
  std::string dense = DensePayload(CodecKind::kSparseFp32, 10);
  SetU32(&dense, 4, 0xffffffff);
  SetU32(&dense, 8, 0xffffffff);
  std::vector<uint64_t> keys;
  std::vector<float> values;
  std::vector<float> out(10);

  const absl::Status unlimited =
      DecodeRows(rows, 4, std::numeric_limits<size_t>::max(), &keys, &values);
  const absl::Status limited = DecodeRows(rows, 4, 1000, &keys, &values);
  const absl::Status dense_status = DecodeDense(dense, out);

  EXPECT_THAT(unlimited, StatusIs(absl::StatusCode::kInvalidArgument,
                                  HasSubstr("the header says 4294967295")));
  EXPECT_THAT(
      limited,
      StatusIs(absl::StatusCode::kInvalidArgument,
               HasSubstr("4294967295 rows, more than the 1000 allowed")));
  EXPECT_THAT(dense_status,
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("tensor length 4294967295, expected 10")));
  // Refused before anything was sized by the count.
  EXPECT_EQ(keys.capacity(), 0u);
  EXPECT_EQ(values.capacity(), 0u);
}

}  // namespace
}  // namespace hetps
