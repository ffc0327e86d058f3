#include "common/finite.h"

#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "gtest/gtest.h"

namespace hetps {
namespace {

float FromBits(uint32_t bits) { return std::bit_cast<float>(bits); }

TEST(FiniteTest, EdgesOfTheFiniteRangeAreFinite) {
  const std::vector<float> values = {
      0.0f,
      -0.0f,
      std::numeric_limits<float>::max(),
      -std::numeric_limits<float>::max(),
      std::numeric_limits<float>::min(),
      std::numeric_limits<float>::denorm_min(),
      FromBits(0x7f7fffffu),  // the largest exponent below all ones
      FromBits(0xff7fffffu),
      1.0f,
      -3.5e-20f};
  EXPECT_EQ(FirstNonFinite(values), -1);
  EXPECT_EQ(FirstNonFinite({}), -1);
}

TEST(FiniteTest, FindsTheFirstNanOrInfinityWherever) {
  const float kBad[] = {std::numeric_limits<float>::infinity(),
                        -std::numeric_limits<float>::infinity(),
                        std::numeric_limits<float>::quiet_NaN(),
                        FromBits(0x7f800001u),  // signalling NaN
                        FromBits(0xffffffffu)};
  // Lengths around the vector widths, the bad value first, inside, last.
  for (size_t n : {1, 3, 4, 7, 8, 15, 16, 17, 33, 1000}) {
    for (float bad : kBad) {
      for (size_t at : {size_t{0}, n / 2, n - 1}) {
        std::vector<float> values(n, 0.25f);
        values[at] = bad;
        if (at + 1 < n) values[n - 1] = bad;  // a later one is not reported
        EXPECT_EQ(FirstNonFinite(values), static_cast<int64_t>(at))
            << "n " << n << ", bits " << std::bit_cast<uint32_t>(bad);
      }
    }
  }
}

TEST(FiniteTest, AgreesWithIsFiniteOnRandomBitPatterns) {
  std::mt19937 rng(7);
  for (int round = 0; round < 2000; ++round) {
    std::vector<float> values(1 + rng() % 40);
    int64_t expected = -1;
    for (size_t i = 0; i < values.size(); ++i) {
      // Mostly finite, a few all-ones exponents.
      uint32_t bits = rng();
      if (rng() % 64 != 0) bits &= ~(uint32_t{1} << (23 + rng() % 8));
      values[i] = FromBits(bits);
      if (expected < 0 && !std::isfinite(values[i])) {
        expected = static_cast<int64_t>(i);
      }
    }
    ASSERT_EQ(FirstNonFinite(values), expected) << "round " << round;
    // The copy with the check: every bit copied (NaNs' payloads too), the
    // same verdict.
    std::vector<float> copy(values.size() + 1, 0.5f);
    ASSERT_EQ(CopyFinite(values, copy.data()), expected < 0)
        << "round " << round;
    ASSERT_EQ(
        std::memcmp(copy.data(), values.data(), values.size() * sizeof(float)),
        0)
        << "round " << round;
    ASSERT_EQ(copy.back(), 0.5f) << "wrote past the end";
  }
}

TEST(FiniteTest, CheckFiniteNamesTheTableValueAndIndex) {
  EXPECT_TRUE(CheckFinite("emb", std::vector<float>{1, 2, 3}).ok());
  const absl::Status s = CheckFinite(
      "emb", std::vector<float>{1, std::numeric_limits<float>::infinity()});
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("table 'emb'"), std::string::npos) << s;
  EXPECT_NE(s.message().find("inf at index 1"), std::string::npos) << s;
}

}  // namespace
}  // namespace hetps
