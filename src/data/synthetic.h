// Synthetic click data from a hidden logistic-regression teacher: each sample
// has `fields` categorical features with Zipf-like (log-uniform) ids; the
// label is drawn from sigmoid(teacher logit). Every sample is a pure function
// of (seed, split, index), so any worker can produce any share of it without
// coordination.
#pragma once

#include <cstdint>
#include <span>

#include "hetps/config.h"

namespace hetps {

class SyntheticLrData {
 public:
  explicit SyntheticLrData(const DataConfig& config);

  int fields() const { return config_.fields; }
  uint64_t train_size() const { return config_.train_samples; }
  uint64_t test_size() const { return config_.test_samples; }

  // Writes the feature keys of sample `index` (fields() keys) and returns
  // its label (0 or 1).
  float TrainSample(uint64_t index, std::span<uint64_t> keys) const;
  float TestSample(uint64_t index, std::span<uint64_t> keys) const;

 private:
  float Sample(uint64_t stream, uint64_t index, std::span<uint64_t> keys) const;

  const DataConfig config_;
};

}  // namespace hetps
