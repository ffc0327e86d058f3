// The median of a few numbers (the mean of the middle two for an even
// count; 0 for none): what the calibration and the diagnostics compare
// rates by.
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

}  // namespace hetps
