// The Criteo display-ads TSV format and the features hetps derives from it,
// shared by the reader (criteo_reader.cc) and the generator (criteo_gen.cc)
// so the generator's teacher sees exactly the keys a model is trained on.
//
// A line is 40 tab-separated fields: the label (0 or 1), 13 integer columns
// I1..I13, 26 categorical columns C1..C26 (hex strings); an empty field is
// missing. Per sample the reader yields 39 slots and 13 dense values:
//   slot j (0..12): integer column j, bucketised by CriteoIntBucket;
//   slot 13 + c (c = 0..25): categorical column c, hashed;
//   dense j: CriteoDense(value of column j), 0 when missing.
// A missing field leaves its slot empty.
#pragma once

#include <xxhash.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <string_view>

#include "data/feature_key.h"

namespace hetps {

inline constexpr int kCriteoIntColumns = 13;
inline constexpr int kCriteoCatColumns = 26;
inline constexpr int kCriteoFields = 1 + kCriteoIntColumns + kCriteoCatColumns;
inline constexpr int kCriteoSlots = kCriteoIntColumns + kCriteoCatColumns;

// Log2 buckets: counts spread over orders of magnitude, and what matters is
// the magnitude, not the exact count. v < 0 → -1 (one bucket for every
// negative value), 0 → 0, v > 0 → floor(log2(v)) + 1 (1 → 1, 2..3 → 2,
// 4..7 → 3, ...).
constexpr int64_t CriteoIntBucket(int64_t v) {
  if (v < 0) return -1;
  if (v == 0) return 0;
  return std::bit_width(static_cast<uint64_t>(v));
}

constexpr uint64_t CriteoIntKey(int column, int64_t value) {
  return FeatureKey(static_cast<uint32_t>(column),
                    static_cast<uint64_t>(CriteoIntBucket(value)));
}

// `hex` as written in the file (not decoded: "0a" and "a" are different
// values, as they would be to anyone reading the file).
inline uint64_t CriteoCatKey(int column, std::string_view hex) {
  return FeatureKey(static_cast<uint32_t>(kCriteoIntColumns + column),
                    XXH3_64bits(hex.data(), hex.size()));
}

// Dense value of integer column value v: log1p(max(v, 0)) / 10, which maps
// the counts seen in practice (up to ~10^6) into [0, ~1.5].
inline float CriteoDense(int64_t v) {
  return static_cast<float>(std::log1p(static_cast<double>(v > 0 ? v : 0)) /
                            10.0);
}

}  // namespace hetps
