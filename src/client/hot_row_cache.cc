#include "client/hot_row_cache.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

namespace hetps {
namespace {

// The sketch's size: hot rows are a few thousand at most (a share of every
// pull), so its error, e / width of the pulls' keys, is far below them.
constexpr size_t kCandidates = 4096;
constexpr uint32_t kSketchWidth = 1 << 15;

// The moving average of lag bounds (Table::typical_lag) spans about this
// many rows' measures, each counted up to kTypicalLagCap applies.
constexpr double kTypicalLagRows = 64;
constexpr uint64_t kTypicalLagCap = 1024;

}  // namespace

HotRowCache::HotRowCache(const HotRowsConfig& config)
    : config_(config), hotness_(kCandidates, kSketchWidth) {}

void HotRowCache::Observe(uint32_t table, std::span<const uint64_t> keys) {
  if (++pulls_since_halving_ > kHalfLifePulls) {
    hotness_.Halve();
    pulls_ /= 2;
    pulls_since_halving_ = 1;
  }
  pulls_ += 1;
  const size_t stride = (keys.size() + kSampledKeys - 1) / kSampledKeys;
  const size_t first = stride > 1 ? static_cast<size_t>(pulls_) % stride : 0;
  for (size_t i = first; i < keys.size(); i += stride) {
    hotness_.Offer(table, keys[i], static_cast<double>(stride));
  }
}

bool HotRowCache::IsHot(uint32_t table, uint64_t key) const {
  return pulls_ > 0 &&
         hotness_.Estimate(table, key) >= config_.hot_share * pulls_;
}

HotRowCache::Table& HotRowCache::TableOf(uint32_t table, uint64_t dim) {
  if (tables_.size() <= table) tables_.resize(table + 1);
  Table& t = tables_[table];
  if (t.dim == 0) t.dim = dim;
  return t;
}

std::optional<HotRowCache::Kept> HotRowCache::Read(uint32_t table,
                                                   uint64_t key, uint64_t known,
                                                   uint64_t bound,
                                                   std::span<float> out) {
  if (table >= tables_.size()) return std::nullopt;
  Table& t = tables_[table];
  auto it = t.rows.find(key);
  if (it == t.rows.end()) return std::nullopt;
  const Entry& e = it->second;
  const uint64_t lag = std::min(e.lag, bound);
  if (known > e.version + lag) return std::nullopt;
  std::memcpy(out.data(), &t.pool[e.slot * t.dim], t.dim * sizeof(float));
  return Kept{e.version, lag};
}

void HotRowCache::Bound(Table& t, Entry& e) const {
  if (e.pace < 0 || e.weight < 0) {
    e.lag = static_cast<uint64_t>(t.typical_lag);
    return;
  }
  constexpr double kUnbounded = std::numeric_limits<uint32_t>::max();
  // (The pace is infinite for a row of length 0 that moved: bound 0. Rows
  // are finite, the servers refuse what is not, so it is never NaN.)
  const double cost = static_cast<double>(e.pace) * e.weight;
  e.lag = cost > 0 ? static_cast<uint64_t>(
                         std::min(kUnbounded, config_.sample_drift / cost))
                   : static_cast<uint64_t>(kUnbounded);
}

void HotRowCache::Store(uint32_t table, uint64_t key, uint64_t version,
                        std::span<const float> row) {
  Table& t = TableOf(table, row.size());
  const bool by_drift = config_.sample_drift > 0;
  auto it = t.rows.find(key);
  if (it == t.rows.end()) {
    if (t.rows.size() >= config_.max_rows) return;
    uint32_t slot;
    if (!t.free.empty()) {
      slot = t.free.back();
      t.free.pop_back();
    } else {
      slot = static_cast<uint32_t>(t.pool.size() / t.dim);
      t.pool.resize(t.pool.size() + t.dim);
    }
    it = t.rows.emplace(key, Entry{version, 0, slot}).first;
    if (by_drift) {
      Bound(t, it->second);
    } else {
      it->second.lag = std::numeric_limits<uint64_t>::max();
    }
  } else if (by_drift) {
    Entry& e = it->second;
    // A read at the same version tells no pace: the copy stays as it is.
    if (version <= e.version) return;
    const float* kept = &t.pool[e.slot * t.dim];
    double moved = 0;
    double length = 0;
    for (size_t c = 0; c < row.size(); ++c) {
      const double d = static_cast<double>(row[c]) - kept[c];
      moved += d * d;
      length += static_cast<double>(row[c]) * row[c];
    }
    const double relative =
        length > 0 ? std::sqrt(moved / length)
                   : (moved > 0 ? std::numeric_limits<double>::infinity() : 0);
    e.pace =
        static_cast<float>(relative / static_cast<double>(version - e.version));
    Bound(t, e);
    if (e.weight >= 0) {
      t.typical_lag += (static_cast<double>(std::min(e.lag, kTypicalLagCap)) -
                        t.typical_lag) /
                       kTypicalLagRows;
    }
  }
  it->second.version = version;
  std::memcpy(&t.pool[it->second.slot * t.dim], row.data(),
              t.dim * sizeof(float));
}

void HotRowCache::NotePush(uint32_t table, std::span<const uint64_t> keys,
                           std::span<const uint32_t> uses, uint32_t samples) {
  if (config_.sample_drift <= 0 || table >= tables_.size() || samples == 0) {
    return;
  }
  Table& t = tables_[table];
  const double per_use = static_cast<double>(keys.size()) / samples;
  for (size_t i = 0; i < keys.size(); ++i) {
    auto it = t.rows.find(keys[i]);
    if (it == t.rows.end()) continue;
    Entry& e = it->second;
    e.weight = static_cast<float>((uses.empty() ? 1.0 : uses[i]) * per_use);
    if (e.pace >= 0) Bound(t, e);
  }
}

void HotRowCache::Expire(uint32_t table,
                         const std::function<bool(uint64_t, uint64_t)>& stale) {
  if (table >= tables_.size()) return;
  Table& t = tables_[table];
  absl::erase_if(t.rows, [&](const auto& entry) {
    if (!stale(entry.first, entry.second.version)) return false;
    t.free.push_back(entry.second.slot);
    return true;
  });
}

size_t HotRowCache::rows(uint32_t table) const {
  return table < tables_.size() ? tables_[table].rows.size() : 0;
}

}  // namespace hetps
