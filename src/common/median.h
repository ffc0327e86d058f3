// The median of a few numbers (the mean of the middle two for an even
// count; 0 for none): what the calibration and the diagnostics compare
// rates by. And a percentile.
#pragma once

#include <algorithm>
#include <vector>

namespace hetps {

inline double Median(std::vector<double> values) {
  if (values.empty()) return 0;
  std::sort(values.begin(), values.end());
  const size_t m = values.size() / 2;
  return values.size() % 2 ? values[m] : (values[m - 1] + values[m]) / 2;
}

// The value at quantile q in [0, 1] of `values` (nearest rank; 0 for
// none): the benchmarks' p50/p90/p99.
inline double Percentile(std::vector<double> values, double q) {
  if (values.empty()) return 0;
  std::sort(values.begin(), values.end());
  const size_t last = values.size() - 1;
  return values[std::min(last, static_cast<size_t>(q * last + 0.5))];
}

}  // namespace hetps
