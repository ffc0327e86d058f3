#include "data/synthetic.h"

#include <cmath>

#include "common/hash.h"
#include "data/feature_key.h"

namespace hetps {
namespace {

// Uniform in [0, 1) from a 64-bit hash.
double Unit(uint64_t h) { return static_cast<double>(h >> 11) * 0x1.0p-53; }

constexpr uint64_t kTrainStream = 1;
constexpr uint64_t kTestStream = 2;

}  // namespace

SyntheticLrData::SyntheticLrData(const DataConfig& config)
    : config_(config) {}

float SyntheticLrData::TrainSample(uint64_t index,
                                   std::span<uint64_t> keys) const {
  return Sample(kTrainStream, index, keys);
}

float SyntheticLrData::TestSample(uint64_t index,
                                  std::span<uint64_t> keys) const {
  return Sample(kTestStream, index, keys);
}

float SyntheticLrData::Sample(uint64_t stream, uint64_t index,
                              std::span<uint64_t> keys) const {
  const uint64_t base = Mix64(config_.seed ^ Mix64(stream * 0x9e37 + index));
  const double log_ids = std::log(static_cast<double>(config_.ids_per_field) + 1);
  double logit = -0.5;  // the teacher's bias: a minority of positives
  for (int f = 0; f < config_.fields; ++f) {
    const uint64_t h = Mix64(base + static_cast<uint64_t>(f) + 1);
    // Log-uniform ids: small ids are frequent, like real categorical data.
    uint64_t id = static_cast<uint64_t>(std::exp(Unit(h) * log_ids)) - 1;
    if (id >= config_.ids_per_field) id = config_.ids_per_field - 1;
    keys[f] = FeatureKey(static_cast<uint32_t>(f), id);
    // The teacher's weight of (field, id): a fixed function of the seed.
    const uint64_t w = Mix64(config_.seed * 31 + keys[f]);
    logit += (Unit(w) * 2.0 - 1.0) * 1.2;
  }
  const double p = 1.0 / (1.0 + std::exp(-logit));
  return Unit(Mix64(base ^ 0x5bd1e995)) < p ? 1.0f : 0.0f;
}

}  // namespace hetps
