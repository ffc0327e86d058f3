#include "common/zipf.h"

namespace hetps {

ZipfTable::ZipfTable(uint64_t n, double s) : accept_(n), alias_(n) {
  std::vector<double> p(n);
  double total = 0;
  for (uint64_t k = 0; k < n; ++k) {
    p[k] = std::pow(static_cast<double>(k + 1), -s);
    total += p[k];
  }
  std::vector<uint32_t> small;
  std::vector<uint32_t> large;
  for (uint64_t k = 0; k < n; ++k) {
    p[k] = p[k] * static_cast<double>(n) / total;
    (p[k] < 1 ? small : large).push_back(static_cast<uint32_t>(k));
  }
  while (!small.empty() && !large.empty()) {
    const uint32_t lo = small.back();
    small.pop_back();
    const uint32_t hi = large.back();
    accept_[lo] = p[lo];
    alias_[lo] = hi;
    p[hi] -= 1 - p[lo];
    if (p[hi] < 1) {
      large.pop_back();
      small.push_back(hi);
    }
  }
  // Leftovers are 1 up to rounding.
  for (const auto* rest : {&small, &large}) {
    for (uint32_t k : *rest) {
      accept_[k] = 1;
      alias_[k] = k;
    }
  }
}

}  // namespace hetps
