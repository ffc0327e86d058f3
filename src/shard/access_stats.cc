#include "shard/access_stats.h"

#include <algorithm>
#include <cmath>

#include "common/hash.h"
#include "shard/shard_map.h"

namespace hetps {

HotKeys::HotKeys(size_t capacity, uint32_t width)
    : capacity_(std::max<size_t>(capacity, 1)),
      width_(std::max<uint32_t>(width, 1)),
      counts_(size_t{kDepth} * width_, 0.0) {
  entries_.reserve(capacity_);
}

namespace {

// A key's hash for the sketch: tables hashed apart.
uint64_t SketchId(uint32_t table, uint64_t key) {
  return Mix64(key ^ Mix64(table + 1));
}

}  // namespace

size_t HotKeys::Cell(uint64_t id, int row) const {
  const uint32_t column =
      ScaleToRange(Mix64(id + 0x9e3779b97f4a7c15ULL * (row + 1)), width_);
  return size_t{static_cast<size_t>(row)} * width_ + column;
}

double HotKeys::Estimate(uint32_t table, uint64_t key) const {
  const uint64_t id = SketchId(table, key);
  double estimate = counts_[Cell(id, 0)];
  for (int row = 1; row < kDepth; ++row) {
    estimate = std::min(estimate, counts_[Cell(id, row)]);
  }
  return estimate;
}

void HotKeys::Offer(uint32_t table, uint64_t key, double weight) {
  total_ += weight;
  // One counter a row, each row hashed apart; the estimate is the least.
  const uint64_t id = SketchId(table, key);
  double estimate = 0;
  for (int row = 0; row < kDepth; ++row) {
    double& c = counts_[Cell(id, row)];
    c += weight;
    estimate = row == 0 ? c : std::min(estimate, c);
  }
  if (auto it = index_.find(Id{table, key}); it != index_.end()) {
    entries_[it->second].count = estimate;
    return;
  }
  if (entries_.size() < capacity_) {
    index_[Id{table, key}] = entries_.size();
    entries_.push_back({table, key, estimate});
    return;
  }
  // A new candidate displaces the lightest when it outweighs it. The
  // candidates' counts only grow between halvings, so the lightest count
  // found by the last scan stays a lower bound: a key that does not beat it
  // is turned away without scanning the few hundred entries.
  if (estimate <= lightest_bound_) return;
  size_t min = 0;
  for (size_t i = 1; i < entries_.size(); ++i) {
    if (entries_[i].count < entries_[min].count) min = i;
  }
  Entry& e = entries_[min];
  lightest_bound_ = e.count;
  if (estimate <= e.count) return;
  index_.erase(Id{e.table, e.key});
  index_[Id{table, key}] = min;
  e = {table, key, estimate};
}

void HotKeys::Halve() {
  for (double& c : counts_) c /= 2;
  for (Entry& e : entries_) e.count /= 2;
  total_ /= 2;
  lightest_bound_ /= 2;
}

double HotKeys::error() const { return std::exp(1.0) / width_ * total_; }

std::vector<HotKeys::Entry> HotKeys::Top(size_t n) const {
  std::vector<Entry> top = entries_;
  n = std::min(n, top.size());
  std::partial_sort(top.begin(), top.begin() + n, top.end(),
                    [](const Entry& a, const Entry& b) {
                      return a.count > b.count ||
                             (a.count == b.count && a.key < b.key);
                    });
  top.resize(n);
  return top;
}

namespace {

// Threads take lanes in turn, so that a server's handler threads rarely
// share one.
int ThreadLane(int lanes) {
  static std::atomic<int> next{0};
  thread_local const int lane = next.fetch_add(1, std::memory_order_relaxed);
  return lane % lanes;
}

// A request's keys counted per bucket: one array per thread, as long as the
// largest bucket count seen, and room for the buckets touched (to add and
// reset only those).
struct Scratch {
  std::vector<uint32_t> rows;
  std::vector<uint32_t> touched;
};

Scratch& ThreadScratch(uint32_t num_buckets) {
  thread_local Scratch scratch;
  if (scratch.rows.size() < num_buckets) {
    scratch.rows.resize(num_buckets, 0);
    // One more than the buckets: Record writes each key's bucket at the
    // end before it knows whether the bucket is new.
    scratch.touched.resize(num_buckets + 1);
  }
  return scratch;
}

}  // namespace

AccessRecorder::AccessRecorder(uint32_t num_buckets,
                               std::vector<std::string> sparse_tables,
                               Clock& clock)
    : num_buckets_(num_buckets),
      tables_(std::move(sparse_tables)),
      clock_(clock),
      lanes_(std::make_unique<Lane[]>(kLanes)),
      hot_(kHotKeyCapacity, kSketchWidth),
      next_halving_(clock.Now() + kHalfLife) {
  for (int i = 0; i < kLanes; ++i) {
    absl::MutexLock lock(&lanes_[i].mu);
    lanes_[i].buckets.assign(num_buckets, BucketTotals{});
  }
}

void AccessRecorder::RecordOther(absl::Duration service) {
  service_ns_.fetch_add(absl::ToInt64Nanoseconds(service),
                        std::memory_order_relaxed);
}

void AccessRecorder::Record(Access access, std::string_view table,
                            std::span<const uint64_t> keys, uint64_t row_bytes,
                            absl::Duration service) {
  const uint64_t ns = static_cast<uint64_t>(
      std::max<int64_t>(0, absl::ToInt64Nanoseconds(service)));
  service_ns_.fetch_add(ns, std::memory_order_relaxed);
  const auto found = std::find(tables_.begin(), tables_.end(), table);
  if (found == tables_.end() || keys.empty()) return;
  const uint32_t table_id = static_cast<uint32_t>(found - tables_.begin());

  // Plain pointers and locals: through the vectors and members the
  // compiler would reload them after every count it stores.
  Scratch& scratch = ThreadScratch(num_buckets_);
  const uint32_t num_buckets = num_buckets_;
  uint32_t* const counts = scratch.rows.data();
  uint32_t* const touched = scratch.touched.data();
  size_t num_touched = 0;
  // Evenly spaced keys, from an offset that turns with every request, each
  // standing for `stride` rows: every key is counted once in `stride`
  // requests that repeat it, so the totals are exact over time.
  const uint64_t request = requests_.fetch_add(1, std::memory_order_relaxed);
  const uint32_t stride = static_cast<uint32_t>(
      (keys.size() + kCountedKeysPerRequest - 1) / kCountedKeysPerRequest);
  for (size_t i = request % stride; i < keys.size(); i += stride) {
    const uint32_t b = BucketOfKey(keys[i], num_buckets);
    touched[num_touched] = b;
    num_touched += counts[b] == 0;
    counts[b] += stride;
  }
  const double row_ns = static_cast<double>(ns) / keys.size();
  {
    Lane& lane = lanes_[ThreadLane(kLanes)];
    absl::MutexLock lock(&lane.mu);
    for (size_t i = 0; i < num_touched; ++i) {
      const uint32_t b = touched[i];
      BucketTotals& totals = lane.buckets[b];
      const uint32_t rows = counts[b];
      (access == Access::kPull ? totals.pulled : totals.pushed) += rows;
      totals.bytes += rows * row_bytes;
      totals.service_ns += static_cast<uint64_t>(rows * row_ns);
      counts[b] = 0;
    }
  }

  // The sketch's keys are spaced the same way, more widely.
  const size_t hot_stride =
      (keys.size() + kSampledKeysPerRequest - 1) / kSampledKeysPerRequest;
  const absl::Time now = clock_.Now();
  absl::MutexLock lock(&hot_mu_);
  for (; now >= next_halving_; next_halving_ += kHalfLife) {
    hot_.Halve();
    decayed_requests_ /= 2;
  }
  decayed_requests_ += 1;
  for (size_t i = request % hot_stride; i < keys.size(); i += hot_stride) {
    hot_.Offer(table_id, keys[i], static_cast<double>(hot_stride));
  }
}

void AccessRecorder::ToProto(rpc::AccessStats* out, size_t top_keys) const {
  std::vector<BucketTotals> sum(num_buckets_);
  for (int i = 0; i < kLanes; ++i) {
    Lane& lane = lanes_[i];
    absl::MutexLock lock(&lane.mu);
    for (uint32_t b = 0; b < num_buckets_; ++b) {
      sum[b].pulled += lane.buckets[b].pulled;
      sum[b].pushed += lane.buckets[b].pushed;
      sum[b].bytes += lane.buckets[b].bytes;
      sum[b].service_ns += lane.buckets[b].service_ns;
    }
  }
  for (uint32_t b = 0; b < num_buckets_; ++b) {
    if (sum[b].pulled == 0 && sum[b].pushed == 0) continue;
    out->add_buckets(b);
    out->add_pulled_rows(sum[b].pulled);
    out->add_pushed_rows(sum[b].pushed);
    out->add_bytes(sum[b].bytes);
    out->add_service_ns(sum[b].service_ns);
  }
  out->set_service_s(service_ns_.load(std::memory_order_relaxed) * 1e-9);
  out->set_half_life_s(absl::ToDoubleSeconds(kHalfLife));
  absl::MutexLock lock(&hot_mu_);
  for (const HotKeys::Entry& e : hot_.Top(top_keys)) {
    rpc::HotKey* k = out->add_hot_keys();
    k->set_table(tables_[e.table]);
    k->set_key(e.key);
    k->set_requests(e.count);
    k->set_error(hot_.error());
    // (sampling can put an estimate above the requests themselves)
    k->set_share(decayed_requests_ > 0
                     ? std::min(1.0, e.count / decayed_requests_)
                     : 0.0);
  }
}

AccessTotals SumAccess(const rpc::AccessStats& stats) {
  AccessTotals totals;
  totals.buckets = static_cast<uint32_t>(stats.buckets_size());
  for (uint64_t n : stats.pulled_rows()) totals.pulled_rows += n;
  for (uint64_t n : stats.pushed_rows()) totals.pushed_rows += n;
  for (uint64_t n : stats.bytes()) totals.bytes += n;
  for (uint64_t n : stats.service_ns()) totals.bucket_service_s += n * 1e-9;
  return totals;
}

std::vector<ServerHotKey> HottestKeys(
    std::span<const rpc::AccessStats* const> stats, size_t n) {
  std::vector<ServerHotKey> keys;
  for (uint32_t s = 0; s < stats.size(); ++s) {
    for (const rpc::HotKey& key : stats[s]->hot_keys()) {
      keys.push_back({s, key});
    }
  }
  n = std::min(n, keys.size());
  std::partial_sort(keys.begin(), keys.begin() + n, keys.end(),
                    [](const ServerHotKey& a, const ServerHotKey& b) {
                      return a.key.requests() > b.key.requests();
                    });
  keys.resize(n);
  return keys;
}

}  // namespace hetps
