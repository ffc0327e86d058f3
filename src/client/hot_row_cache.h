// HotRowCache: a worker's copies of the sparse rows it pulls most (SPEC §4,
// client.hot_rows). A row is hot when the worker's pulls hold it in at least
// `hot_share` of them (a count-min sketch over the pulls' keys, halved every
// kHalfLifePulls pulls, shard/access_stats.h); a hot row pulled is kept with
// its version (the server's applies when it read it,
// PullSparseResponse.applied_rounds). PsClient reads a kept row instead of
// pulling it while the server's applies known to the worker are at most the
// bound past its version, checks that against the applies the step's pull
// reports, and pulls again what is over it; it reports the oldest version
// a step used with the push (PushRequest.oldest_read), so that the servers
// record the lag themselves. Not thread-safe: PsClient holds it under a
// lock.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <span>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "hetps/config.h"
#include "shard/access_stats.h"

namespace hetps {

class HotRowCache {
 public:
  static constexpr uint64_t kHalfLifePulls = 256;
  // Keys a pull offers the sketch at most (evenly spaced, weighted by the
  // spacing).
  static constexpr size_t kSampledKeys = 256;

  explicit HotRowCache(const HotRowsConfig& config);

  // Notes one pull of `keys` (unique) of table `table` (an index the caller
  // keeps per table).
  void Observe(uint32_t table, std::span<const uint64_t> keys);
  bool IsHot(uint32_t table, uint64_t key) const;

  // The kept row of `key` if its version is at least `min_version`: copies
  // it to `out` (its dim floats) and returns the version.
  std::optional<uint64_t> Read(uint32_t table, uint64_t key,
                               uint64_t min_version, std::span<float> out);
  // Keeps (or refreshes) the row of `key` read at `version`, if there is
  // room (config.max_rows per table).
  void Store(uint32_t table, uint64_t key, uint64_t version,
             std::span<const float> row);
  // Drops the rows of table `table` for which `stale(key, version)` holds
  // (too old to be read any more).
  void Expire(uint32_t table,
              const std::function<bool(uint64_t, uint64_t)>& stale);

  size_t rows(uint32_t table) const;

 private:
  struct Entry {
    uint64_t version;
    uint32_t slot;  // row slot in the table's pool
  };
  struct Table {
    uint64_t dim = 0;
    std::vector<float> pool;     // slots of dim floats
    std::vector<uint32_t> free;  // slots given back
    absl::flat_hash_map<uint64_t, Entry> rows;
  };
  Table& TableOf(uint32_t table, uint64_t dim);

  HotRowsConfig config_;
  HotKeys hotness_;
  double pulls_ = 0;  // decayed as the sketch
  uint64_t pulls_since_halving_ = 0;
  std::vector<Table> tables_;
};

}  // namespace hetps
