// ZipfTable: ids 0..n-1 drawn with probability proportional to
// (id + 1)^-s, in O(1) per draw by Walker's alias method (a search of the
// CDF would cost a dozen probes). Id 0 is the most frequent. Used by the
// generated Criteo data (model/criteo_gen) and the sharding bench.
#pragma once

#include <cmath>
#include <cstdint>
#include <vector>

#include "common/hash.h"

namespace hetps {

// splitmix64: 64 random bits a call from one 64-bit state, and a double in
// [0, 1) from the top 53 of them — the random source ZipfTable::Sample
// takes, cheap enough for a stream per sample (model/criteo_gen).
class SplitMix64 {
 public:
  explicit SplitMix64(uint64_t seed) : state_(seed) {}
  uint64_t Next() {
    state_ += 0x9e3779b97f4a7c15ULL;
    return Mix64(state_);
  }
  double Uniform() { return static_cast<double>(Next() >> 11) * 0x1.0p-53; }

 private:
  uint64_t state_;
};

class ZipfTable {
 public:
  // n >= 1 (at most 2^32), s >= 0 (0: uniform).
  ZipfTable(uint64_t n, double s);

  // `rng` has Next() (64 random bits) and Uniform() (in [0, 1)); one of
  // each per draw, in that order.
  template <typename Rng>
  uint32_t Sample(Rng& rng) const {
    const uint32_t k =
        ScaleToRange(rng.Next(), static_cast<uint32_t>(accept_.size()));
    return rng.Uniform() < accept_[k] ? k : alias_[k];
  }

 private:
  std::vector<double> accept_;
  std::vector<uint32_t> alias_;
};

}  // namespace hetps
