// Criteo-format data with a known answer: GenerateCriteo writes a TSV file
// (data/criteo_format.h) whose labels come from a hidden teacher, so a
// training run can be judged against the best AUC the data allows.
//
// The teacher is a factorisation machine over exactly the keys the criteo
// reader yields (13 bucketised integer slots, 26 hashed categorical slots):
//   logit = bias + sum_k w(k) + sum_{k<l} <v(k), v(l)>,  v(k) in R^rank,
// every w(k) and v(k) a fixed hash of (seed, key); the bias is chosen so
// that about `positive_rate` of the samples are positive, and each label is
// drawn from Bernoulli(sigmoid(logit)). Low rank and moderate strength keep
// it learnable by an FM or DeepFM with 8-dimensional embeddings.
//
// Inputs: categorical column c draws ids 0..(vocab >> (c % 4)) - 1 from a
// Zipf(zipf_s) law, written as distinct 8-digit hex strings; integer columns
// are log-uniform counts of different ranges (column I2 also negative now
// and then); any field is missing (empty) with probability missing_rate.
//
// The file is a pure function of the config: same config, same bytes.
#pragma once

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"

namespace hetps {

struct CriteoGenConfig {
  uint64_t samples = 100000;
  uint64_t seed = 1;
  double zipf_s = 1.1;  // Zipf exponent of the categorical ids, >= 0
  // Ids of column c: vocab >> (c % 4); 8..2^24 (sampling tables take about
  // 24 bytes per id of the largest column).
  uint64_t vocab = 10000;
  double missing_rate = 0.05;  // per field, in [0, 1)
  int teacher_rank = 4;        // pairwise interaction rank, 0..64
  // Standard deviation of the teacher's first-order part and of its
  // pairwise part (before the bias). 1.0 and 1.0 give a teacher AUC of
  // about 0.8 with the other defaults.
  double teacher_scale = 1.0;
  double pair_scale = 1.0;
  double positive_rate = 0.25;  // the bias aims at this, in (0, 1)
};

struct CriteoGenReport {
  uint64_t samples = 0;
  uint64_t positives = 0;
  // Exact AUC of the teacher's click probabilities against the drawn
  // labels over all samples: what a perfect model would score.
  double teacher_auc = 0.5;
};

// Writes `config.samples` lines to `path`, atomically (a temporary file in
// the same directory, renamed over `path` once complete). INVALID_ARGUMENT
// naming the field for a bad config; the errno-derived code (NOT_FOUND for a
// missing directory, RESOURCE_EXHAUSTED for a full disk, ...) when writing
// fails, in which case `path` is left untouched. Holds 8 bytes per sample in
// memory for the AUC.
absl::StatusOr<CriteoGenReport> GenerateCriteo(const CriteoGenConfig& config,
                                               const std::string& path);

}  // namespace hetps
