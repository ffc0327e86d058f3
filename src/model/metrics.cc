#include "model/metrics.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

namespace hetps {

double Auc(std::span<const float> scores, std::span<const float> labels) {
  const size_t n = scores.size();
  std::vector<size_t> order(n);
  std::iota(order.begin(), order.end(), 0);
  std::sort(order.begin(), order.end(),
            [&](size_t a, size_t b) { return scores[a] < scores[b]; });
  // Sum of the (1-based, tie-averaged) ranks of the positives.
  double positive_rank_sum = 0;
  double positives = 0;
  for (size_t i = 0; i < n;) {
    size_t j = i;
    while (j < n && scores[order[j]] == scores[order[i]]) ++j;
    const double avg_rank = (static_cast<double>(i + 1) + j) / 2.0;
    for (size_t k = i; k < j; ++k) {
      if (labels[order[k]] > 0.5f) {
        positive_rank_sum += avg_rank;
        positives += 1;
      }
    }
    i = j;
  }
  const double negatives = static_cast<double>(n) - positives;
  if (positives == 0 || negatives == 0) return 0.5;
  return (positive_rank_sum - positives * (positives + 1) / 2) /
         (positives * negatives);
}

double LogLoss(std::span<const float> p, std::span<const float> labels) {
  if (p.empty()) return 0;
  double sum = 0;
  for (size_t i = 0; i < p.size(); ++i) {
    const double q = std::clamp(static_cast<double>(p[i]), 1e-7, 1 - 1e-7);
    sum -= labels[i] > 0.5f ? std::log(q) : std::log(1 - q);
  }
  return sum / static_cast<double>(p.size());
}

}  // namespace hetps
