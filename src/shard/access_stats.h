// What a server's requests touch, for placement by measured load (SPEC §4):
// per bucket, the rows pulled and pushed and the bytes they carry, and the
// hottest keys. The server records (AccessRecorder); the coordinator reads
// the totals through GetTableInfo (rpc::AccessStats) and takes differences.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/clock.h"
#include "hetps.pb.h"

namespace hetps {

// The hottest (table, key) pairs of a weighted stream: a count-min sketch
// (kDepth rows of `width` counters) estimates every key's weight, never
// under the truth and, but for a small probability, over it by at most
// e / width of the total weight (Cormode and Muthukrishnan); the
// `capacity` keys with the largest estimates so far are kept beside it.
// Space-saving alone would miss them here: a key in every request is only
// 1/R of the keys when requests carry R keys. Not thread-safe.
class HotKeys {
 public:
  static constexpr int kDepth = 4;

  HotKeys(size_t capacity, uint32_t width);

  void Offer(uint32_t table, uint64_t key, double weight);
  // The sketch's estimate of a key's weight (it need not be a candidate).
  double Estimate(uint32_t table, uint64_t key) const;
  // Halves every count (the sketch forgets at a steady rate).
  void Halve();

  struct Entry {
    uint32_t table;
    uint64_t key;
    double count;  // the sketch's estimate
  };
  // The `n` heaviest, heaviest first.
  std::vector<Entry> Top(size_t n) const;
  size_t size() const { return entries_.size(); }
  // What an estimate may exceed the truth by: e / width of the total.
  double error() const;

 private:
  struct Id {
    uint32_t table;
    uint64_t key;
    bool operator==(const Id&) const = default;
    template <typename H>
    friend H AbslHashValue(H h, const Id& id) {
      return H::combine(std::move(h), id.table, id.key);
    }
  };
  // The counter of `row` for a key (by its hash `id`).
  size_t Cell(uint64_t id, int row) const;

  size_t capacity_;
  uint32_t width_;
  std::vector<double> counts_;  // kDepth rows of width_
  double total_ = 0;
  std::vector<Entry> entries_;             // the candidates
  absl::flat_hash_map<Id, size_t> index_;  // → entries_
  // At most the lightest candidate's count (once entries_ is full).
  double lightest_bound_ = 0;
};

enum class Access { kPull, kPush };

// Records a server's sparse requests. Thread-safe: at most
// kCountedKeysPerRequest keys of a request, evenly spaced and each weighted
// by the spacing, are counted per bucket in a per-thread scratch array,
// then added to the totals once per bucket touched (in the thread's lane);
// at most kSampledKeysPerRequest of them, spaced the same way, reach the
// HotKeys sketch under its lock. The spacing starts at an offset that
// turns with each request: a bucket's total is its rows' exact count over
// time, not per request (a request of fewer keys is counted exactly).
class AccessRecorder {
 public:
  // Counting every key of a request of 10,000 cost a tenth of a server's
  // CPU for such requests (docs/BENCHMARKS.md section 1).
  static constexpr size_t kCountedKeysPerRequest = 1024;
  static constexpr size_t kSampledKeysPerRequest = 32;
  static constexpr size_t kHotKeyCapacity = 256;
  static constexpr uint32_t kSketchWidth = 1 << 14;
  static constexpr absl::Duration kHalfLife = absl::Seconds(10);

  // `sparse_tables`: the names Record may be called with.
  AccessRecorder(uint32_t num_buckets, std::vector<std::string> sparse_tables,
                 Clock& clock);

  // One request's `keys` of `table` (a name given at construction; others
  // are ignored), each row `row_bytes` long, served in `service` (the
  // table work, not waits), which each bucket takes its rows' share of.
  void Record(Access access, std::string_view table,
              std::span<const uint64_t> keys, uint64_t row_bytes,
              absl::Duration service);
  // Service time of requests without sparse rows (dense tables).
  void RecordOther(absl::Duration service);

  // The totals of every bucket served so far and the `top_keys` hottest.
  void ToProto(rpc::AccessStats* out, size_t top_keys = 16) const;

 private:
  const uint32_t num_buckets_;
  const std::vector<std::string> tables_;
  Clock& clock_;
  // The totals, split in lanes: a thread adds to its own lane (threads
  // take lanes in turn) under the lane's lock, held for one request's
  // buckets; reading sums the lanes.
  static constexpr int kLanes = 8;
  // A bucket's totals side by side: one cache line a bucket touched.
  struct BucketTotals {
    uint64_t pulled = 0;
    uint64_t pushed = 0;
    uint64_t bytes = 0;
    uint64_t service_ns = 0;
  };
  struct Lane {
    absl::Mutex mu;
    std::vector<BucketTotals> buckets ABSL_GUARDED_BY(mu);
  };
  std::unique_ptr<Lane[]> lanes_;
  std::atomic<uint64_t> requests_{0};    // turns the sampled keys' offsets
  std::atomic<uint64_t> service_ns_{0};  // every request's, buckets or not

  mutable absl::Mutex hot_mu_;
  HotKeys hot_ ABSL_GUARDED_BY(hot_mu_);
  double decayed_requests_ ABSL_GUARDED_BY(hot_mu_) = 0;
  absl::Time next_halving_ ABSL_GUARDED_BY(hot_mu_);
};

// A server's AccessStats summed over its buckets.
struct AccessTotals {
  uint64_t pulled_rows = 0;
  uint64_t pushed_rows = 0;
  uint64_t bytes = 0;
  uint32_t buckets = 0;         // buckets served at least once
  double bucket_service_s = 0;  // the sparse rows' service time
  uint64_t rows() const { return pulled_rows + pushed_rows; }
};
AccessTotals SumAccess(const rpc::AccessStats& stats);

// The servers' hot keys merged (a key lives on one server, so no key
// appears twice), the `n` hottest first; `server` indexes `stats`.
struct ServerHotKey {
  uint32_t server;
  rpc::HotKey key;
};
std::vector<ServerHotKey> HottestKeys(
    std::span<const rpc::AccessStats* const> stats, size_t n);

}  // namespace hetps
