// Evaluation metrics over a held-out set.
#pragma once

#include <span>

namespace hetps {

// Exact ROC AUC: the probability that a random positive scores above a
// random negative, ties counted as one half (average ranks). Returns 0.5
// when one class is absent. Sizes must match.
double Auc(std::span<const float> scores, std::span<const float> labels);

// Mean binary cross-entropy of probabilities `p` (clamped to [1e-7, 1-1e-7]).
double LogLoss(std::span<const float> p, std::span<const float> labels);

}  // namespace hetps
