// HotRowCache: a worker's copies of the sparse rows it pulls most (SPEC §4,
// client.hot_rows). A row is hot when the worker's pulls hold it in at least
// `hot_share` of them (a count-min sketch over the pulls' keys, halved every
// kHalfLifePulls pulls, shard/access_stats.h); a hot row pulled is kept with
// its version (the server's applies when it read it,
// PullSparseResponse.applied_rounds). PsClient reads a kept row instead of
// pulling it while the server's applies known to the worker are at most the
// bound past its version (and its own bound, from how fast it moves and
// how much the worker uses it: client.hot_rows.sample_drift, Store and
// NotePush), checks that against the
// applies the step's pull reports, and pulls again what is over it; it
// reports the oldest version a step used with the push
// (PushRequest.oldest_read), so that the servers record the lag
// themselves. Not thread-safe: PsClient holds it under a lock.
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

  // A kept row: the server's applies when it was read, and how many
  // applies past that it may still be read (its own lag bound, at most the
  // servers' bound).
  struct Kept {
    uint64_t version;
    uint64_t lag;
  };
  // The kept row of `key` if the server's applies `known` are at most its
  // lag past its version (the lag being at most `bound`): copies it to
  // `out` (its dim floats).
  std::optional<Kept> Read(uint32_t table, uint64_t key, uint64_t known,
                           uint64_t bound, std::span<float> out);
  // Keeps (or refreshes) the row of `key` read at `version`, if there is
  // room (config.max_rows per table). With config.sample_drift, how far
  // the row moved since the copy it replaces (relative to its length) and
  // in how many applies is its pace: with its weight (NotePush), its bound
  // is the applies in which pace × weight × applies reaches sample_drift.
  // A row whose pace or weight is not known yet has the table's typical
  // bound (an average of those measured lately); a read at a version no
  // newer than the copy's changes nothing.
  void Store(uint32_t table, uint64_t key, uint64_t version,
             std::span<const float> row);
  // Notes a push of the worker's: `keys` (distinct) of table `table`,
  // used uses[i] times by the `samples` samples it sums (each once when
  // `uses` is empty). A kept row's weight is its share of the samples
  // times the push's rows, so that rows weighted so and drifting at their
  // bounds drift sample_drift per sample together.
  void NotePush(uint32_t table, std::span<const uint64_t> keys,
                std::span<const uint32_t> uses, uint32_t samples);
  // Drops the rows of table `table` for which `stale(key, version)` holds
  // (too old to be read any more).
  void Expire(uint32_t table,
              const std::function<bool(uint64_t, uint64_t)>& stale);

  size_t rows(uint32_t table) const;

 private:
  struct Entry {
    uint64_t version;
    uint64_t lag;   // its own bound (Kept::lag), before the servers'
    uint32_t slot;  // row slot in the table's pool
    float pace = -1;    // relative drift per apply; < 0: not measured yet
    float weight = -1;  // from the last push that carried it; < 0: none
  };
  struct Table {
    uint64_t dim = 0;
    std::vector<float> pool;     // slots of dim floats
    std::vector<uint32_t> free;  // slots given back
    absl::flat_hash_map<uint64_t, Entry> rows;
    // With sample_drift: the lag bounds measured lately (a moving average
    // over the reads that measured the pace of a row with a weight), which
    // a row not measured yet has.
    double typical_lag = 0;
  };
  // With sample_drift: `e`'s bound from its pace and weight once both are
  // known, else t's typical bound.
  void Bound(Table& t, Entry& e) const;
  Table& TableOf(uint32_t table, uint64_t dim);

  HotRowsConfig config_;
  HotKeys hotness_;
  double pulls_ = 0;  // decayed as the sketch
  uint64_t pulls_since_halving_ = 0;
  std::vector<Table> tables_;
};

}  // namespace hetps
