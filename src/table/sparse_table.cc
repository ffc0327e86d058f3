#include "table/sparse_table.h"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <functional>
#include <latch>
#include <limits>
#include <memory>
#include <mutex>
#include <span>
#include <thread>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "table/initializer.h"

namespace hetps {
namespace {

// Why the layout below: on a table larger than the caches, a lookup costs
// its random cache-line misses, so each key should touch as few lines as
// possible, through arrays as small as possible, with the misses of many
// keys in flight at once (prefetched ahead in a software pipeline).

// Stages of the per-stripe pipeline: the index entry of key j + 2*kAhead is
// prefetched, then the row of key j + kAhead, then key j is used.
constexpr uint32_t kAhead = 8;
constexpr uint32_t kRing = 4 * kAhead;  // power of two, > 2 * kAhead

// Requests at least this large are split over two threads (a thread start
// costs tens of microseconds; see bench/table_bench.cc).
constexpr size_t kParallelKeys = 200'000;

// Larger requests are cut into pieces whose indices fit the 32-bit scratch.
constexpr size_t kMaxChunk = size_t{1} << 31;

// Stripe ids are kept in 16 bits in the scratch arrays.
constexpr int kMaxStripes = 1 << 16;

// Rows live in fixed-size chunks, so growth never copies rows (no latency
// spike and no transient double memory when a stripe holds millions).
constexpr uint32_t kChunkShift = 14;
constexpr uint32_t kChunkRows = uint32_t{1} << kChunkShift;

constexpr uint32_t kAbsent = std::numeric_limits<uint32_t>::max();

// splitmix64's finalizer: every input bit affects every output bit, so
// structured keys (sequential ids, field << 32 | id) spread evenly. The high
// half picks the stripe, the low half the place in the stripe's index, so
// the two choices are independent.
uint64_t Mix64(uint64_t x) {
  x ^= x >> 30;
  x *= 0xbf58476d1ce4e5b9ULL;
  x ^= x >> 27;
  x *= 0x94d049bb133111ebULL;
  x ^= x >> 31;
  return x;
}

// Maps the high half of a mixed key onto [0, n) without a division.
uint32_t StripeFor(uint64_t hash, uint32_t n) {
  return static_cast<uint32_t>(((hash >> 32) * n) >> 32);
}

uint64_t Load64(const float* at) {
  uint64_t v;
  std::memcpy(&v, at, sizeof(v));
  return v;
}

void Store64(float* at, uint64_t v) { std::memcpy(at, &v, sizeof(v)); }

// Row block of a slot, in floats: the key (64 bits), the update count
// (64 bits), dim weights, the optimizer state. Keeping the key in the block
// lets the index hold only 8-byte entries, and the count there means a push
// touches one place per key.
constexpr uint64_t kKeyAt = 0;
constexpr uint64_t kCountAt = 2;
constexpr uint64_t kWeightsAt = 4;

// Open-addressing index (linear probing) from the low 32 bits of a key's
// hash to its slot. Entries carry those bits as a fingerprint, so a probe
// reads a row (to compare the full key) almost only when it is the right
// one, and growing rehashes from the entries alone. Load stays below 5/8.
class SlotIndex {
 public:
  SlotIndex() : entries_(kMinCapacity), mask_(kMinCapacity - 1) {}

  void Prefetch(uint32_t fp) const { __builtin_prefetch(&entries_[fp & mask_]); }

  // The first slot whose fingerprint matches (a guess, for prefetching).
  uint32_t Candidate(uint32_t fp) const {
    for (uint32_t i = fp & mask_;; i = (i + 1) & mask_) {
      const Entry e = entries_[i];
      if (e.slot == kAbsent || e.fp == fp) return e.slot;
    }
  }

  // The slot with fingerprint `fp` for which is_key(slot) holds, or kAbsent.
  template <typename IsKey>
  uint32_t Find(uint32_t fp, IsKey is_key) const {
    for (uint32_t i = fp & mask_;; i = (i + 1) & mask_) {
      const Entry e = entries_[i];
      if (e.slot == kAbsent) return kAbsent;
      if (e.fp == fp && is_key(e.slot)) return e.slot;
    }
  }

  // REQUIRES: the key is absent, slot != kAbsent.
  void Insert(uint32_t fp, uint32_t slot) {
    if ((size_ + 1) * 8 > entries_.size() * 5) Grow();
    Place(fp, slot);
    ++size_;
  }

 private:
  struct Entry {
    uint32_t fp = 0;
    uint32_t slot = kAbsent;
  };
  static constexpr size_t kMinCapacity = 16;

  void Place(uint32_t fp, uint32_t slot) {
    uint32_t i = fp & mask_;
    while (entries_[i].slot != kAbsent) i = (i + 1) & mask_;
    entries_[i] = Entry{fp, slot};
  }

  void Grow() {
    std::vector<Entry> old(entries_.size() * 2);
    old.swap(entries_);
    mask_ = static_cast<uint32_t>(entries_.size() - 1);
    for (const Entry& e : old) {
      if (e.slot != kAbsent) Place(e.fp, e.slot);
    }
  }

  std::vector<Entry> entries_;  // size is a power of two, at most 2^32
  uint32_t mask_;
  size_t size_ = 0;
};

// One request's keys grouped by stripe: for position p in
// [begin[s], begin[s + 1]), keys[p] is the request's key number order[p],
// which lies in stripe s. Kept per calling thread and reused, so a request
// allocates nothing once the buffers have grown.
struct StripeGroups {
  std::vector<uint16_t> stripe_of;  // by request index
  std::vector<uint32_t> counts[2];  // per stripe, per grouping thread
  std::vector<uint32_t> begin;
  std::vector<uint32_t> cursor;  // pass 2 write positions, single-threaded
  std::vector<uint32_t> order;
  std::vector<uint64_t> keys;
};

StripeGroups& ThreadGroups() {
  thread_local StripeGroups groups;
  return groups;
}

void Reserve(StripeGroups& g, size_t count, uint32_t n) {
  if (g.order.size() < count) {
    g.stripe_of.resize(count);
    g.order.resize(count);
    g.keys.resize(count);
  }
  g.counts[0].assign(n, 0);
  g.counts[1].assign(n, 0);
  g.begin.assign(n + 1, 0);
}

// Counting sort, pass 1 over request indices [from, to): stripe of each key
// into `counts`.
void CountStripes(std::span<const uint64_t> keys, size_t from, size_t to,
                  uint32_t n, uint16_t* stripe_of, uint32_t* counts) {
  for (size_t i = from; i < to; ++i) {
    const uint32_t s = StripeFor(Mix64(keys[i]), n);
    stripe_of[i] = static_cast<uint16_t>(s);
    ++counts[s];
  }
}

// Pass 2: place [from, to) starting at the per-stripe `cursor`s.
void PlaceKeys(std::span<const uint64_t> keys, size_t from, size_t to,
               const uint16_t* stripe_of, uint32_t* cursor, StripeGroups& g) {
  uint32_t* order = g.order.data();
  uint64_t* grouped = g.keys.data();
  for (size_t i = from; i < to; ++i) {
    const uint32_t p = cursor[stripe_of[i]]++;
    order[p] = static_cast<uint32_t>(i);
    grouped[p] = keys[i];
  }
}

// Groups `keys` by stripe and calls fn(stripe, first, count) for every
// stripe holding some, where [first, first + count) are its positions in
// `g`. Large requests are grouped and processed by the calling thread and
// one helper, each taking half of the keys to group and then a disjoint set
// of stripes (holding about half of the keys) to process.
template <typename Fn>
void ForEachStripeGroup(std::span<const uint64_t> keys, uint32_t n,
                        StripeGroups& g, Fn fn) {
  const size_t total = keys.size();
  Reserve(g, total, n);
  const bool parallel = total >= kParallelKeys && n >= 2;
  const size_t half = parallel ? total / 2 : total;

  auto run = [&](uint32_t from, uint32_t to) {
    for (uint32_t s = from; s < to; ++s) {
      const uint32_t b = g.begin[s];
      const uint32_t e = g.begin[s + 1];
      if (b != e) fn(s, b, e - b);
    }
  };
  // Both threads derive the same offsets from both halves' counts; thread
  // `part` places its keys after the other half's keys of the same stripe
  // when part == 1. Returns the first stripe of the helper's share.
  auto offsets = [&](int part, std::vector<uint32_t>& cursor) {
    uint32_t mid = n;
    uint32_t at = 0;
    cursor.resize(n);
    for (uint32_t s = 0; s < n; ++s) {
      if (part == 0) g.begin[s] = at;
      if (mid == n && s > 0 && at >= total / 2) mid = s;
      cursor[s] = at + (part == 1 ? g.counts[0][s] : 0);
      at += g.counts[0][s] + g.counts[1][s];
    }
    if (part == 0) g.begin[n] = at;
    return std::min(std::max(mid, 1u), n - 1);
  };

  if (!parallel) {
    std::vector<uint32_t>& cursor = g.cursor;
    CountStripes(keys, 0, total, n, g.stripe_of.data(), g.counts[0].data());
    offsets(0, cursor);
    PlaceKeys(keys, 0, total, g.stripe_of.data(), cursor.data(), g);
    run(0, n);
    return;
  }
  std::latch counted(2);
  std::latch placed(2);
  auto share = [&](int part) {
    const size_t from = part == 0 ? 0 : half;
    const size_t to = part == 0 ? half : total;
    CountStripes(keys, from, to, n, g.stripe_of.data(),
                 g.counts[part].data());
    counted.arrive_and_wait();
    std::vector<uint32_t> cursor;  // one small allocation per large request
    const uint32_t mid = offsets(part, cursor);
    PlaceKeys(keys, from, to, g.stripe_of.data(), cursor.data(), g);
    placed.arrive_and_wait();
    if (part == 0) {
      run(0, mid);
    } else {
      run(mid, n);
    }
  };
  std::thread helper(share, 1);
  share(0);
  helper.join();
}

}  // namespace

// One lock stripe: the index and the row chunks it points into.
struct SparseTable::Stripe {
  mutable std::mutex mu;
  SlotIndex index ABSL_GUARDED_BY(mu);
  std::vector<std::unique_ptr<float[]>> chunks ABSL_GUARDED_BY(mu);
  uint32_t rows ABSL_GUARDED_BY(mu) = 0;

  // REQUIRES: mu held, slot < rows.
  float* Row(uint32_t slot, uint64_t stride) const {
    return chunks[slot >> kChunkShift].get() +
           (slot & (kChunkRows - 1)) * stride;
  }

  // REQUIRES: mu held.
  uint32_t Find(uint64_t key, uint64_t hash, uint64_t stride) const {
    return index.Find(static_cast<uint32_t>(hash), [&](uint32_t slot) {
      return Load64(Row(slot, stride) + kKeyAt) == key;
    });
  }
};

SparseTable::SparseTable(const TableConfig& config,
                         std::unique_ptr<Optimizer> optimizer, int stripes)
    : config_(config),
      optimizer_(std::move(optimizer)),
      state_width_(optimizer_->StateWidth(config_.dim)),
      row_stride_((kWeightsAt + config_.dim + state_width_ + 1) &
                  ~uint64_t{1}) {
  const int count = std::clamp(stripes, 1, kMaxStripes);
  stripes_.reserve(count);
  for (int i = 0; i < count; ++i) {
    stripes_.push_back(std::make_unique<Stripe>());
  }
}

SparseTable::~SparseTable() = default;

int SparseTable::StripeOf(uint64_t key) const {
  return static_cast<int>(
      StripeFor(Mix64(key), static_cast<uint32_t>(stripes_.size())));
}

uint32_t SparseTable::CreateRow(Stripe& stripe, uint64_t key, uint64_t hash) {
  const uint32_t slot = stripe.rows;
  if ((slot & (kChunkRows - 1)) == 0) {
    stripe.chunks.push_back(
        std::make_unique_for_overwrite<float[]>(kChunkRows * row_stride_));
  }
  ++stripe.rows;
  stripe.index.Insert(static_cast<uint32_t>(hash), slot);
  float* row = stripe.Row(slot, row_stride_);
  Store64(row + kKeyAt, key);
  Store64(row + kCountAt, 0);
  const uint64_t dim = config_.dim;
  float* weights = row + kWeightsAt;
  for (uint64_t c = 0; c < dim; ++c) {
    weights[c] = InitialValue(config_.init, key, c);
  }
  optimizer_->InitState(weights, weights + dim, dim);
  // Padding, so that every float of a block has a defined value.
  for (uint64_t f = kWeightsAt + dim + state_width_; f < row_stride_; ++f) {
    row[f] = 0.0f;
  }
  return slot;
}

// The software pipeline over one stripe's keys. At step j: the index entry
// of key j + 2*kAhead is prefetched; the row of key j + kAhead is prefetched
// from its candidate slot (the index line is in cache by then); key j is
// found for certain (both lines in cache when the guesses were right),
// created when missing, and handed to use(j, row).
template <typename Use>
void SparseTable::VisitRows(Stripe& stripe, const uint64_t* keys,
                            uint32_t count, Use use) {
  const uint64_t stride = row_stride_;
  uint64_t hashes[kRing];
  const uint32_t lead = std::min(count, 2 * kAhead);
  for (uint32_t j = 0; j < lead; ++j) {
    hashes[j % kRing] = Mix64(keys[j]);
    stripe.index.Prefetch(static_cast<uint32_t>(hashes[j % kRing]));
  }
  for (uint32_t j = 0; j < count; ++j) {
    if (j + 2 * kAhead < count) {
      const uint64_t h = Mix64(keys[j + 2 * kAhead]);
      hashes[(j + 2 * kAhead) % kRing] = h;
      stripe.index.Prefetch(static_cast<uint32_t>(h));
    }
    if (j + kAhead < count) {
      const uint32_t guess = stripe.index.Candidate(
          static_cast<uint32_t>(hashes[(j + kAhead) % kRing]));
      if (guess != kAbsent) __builtin_prefetch(stripe.Row(guess, stride));
    }
    const uint64_t h = hashes[j % kRing];
    uint32_t slot = stripe.Find(keys[j], h, stride);
    if (slot == kAbsent) slot = CreateRow(stripe, keys[j], h);
    use(j, stripe.Row(slot, stride));
  }
}

void SparseTable::Pull(std::span<const uint64_t> keys, std::span<float> out) {
  const uint64_t dim = config_.dim;
  if (keys.size() > kMaxChunk) {
    Pull(keys.first(kMaxChunk), out.first(kMaxChunk * dim));
    Pull(keys.subspan(kMaxChunk), out.subspan(kMaxChunk * dim));
    return;
  }
  StripeGroups& g = ThreadGroups();
  float* const dst = out.data();
  ForEachStripeGroup(
      keys, static_cast<uint32_t>(stripes_.size()), g,
      [&](uint32_t s, uint32_t first, uint32_t count) {
        Stripe& stripe = *stripes_[s];
        const uint32_t* order = g.order.data() + first;
        std::lock_guard<std::mutex> lock(stripe.mu);
        VisitRows(stripe, g.keys.data() + first, count,
                  [&](uint32_t j, const float* row) {
                    float* to = dst + order[j] * dim;
                    if (dim == 1) {
                      *to = row[kWeightsAt];  // LR: no memcpy call
                    } else {
                      std::memcpy(to, row + kWeightsAt, dim * sizeof(float));
                    }
                  });
      });
}

void SparseTable::Push(std::span<const uint64_t> keys,
                       std::span<const float> grads) {
  const uint64_t dim = config_.dim;
  if (keys.size() > kMaxChunk) {
    Push(keys.first(kMaxChunk), grads.first(kMaxChunk * dim));
    Push(keys.subspan(kMaxChunk), grads.subspan(kMaxChunk * dim));
    return;
  }
  StripeGroups& g = ThreadGroups();
  const float* const src = grads.data();
  const Optimizer& opt = *optimizer_;
  ForEachStripeGroup(
      keys, static_cast<uint32_t>(stripes_.size()), g,
      [&](uint32_t s, uint32_t first, uint32_t count) {
        Stripe& stripe = *stripes_[s];
        const uint32_t* order = g.order.data() + first;
        std::lock_guard<std::mutex> lock(stripe.mu);
        VisitRows(stripe, g.keys.data() + first, count,
                  [&](uint32_t j, float* row) {
                    const uint64_t updates = Load64(row + kCountAt);
                    float* weights = row + kWeightsAt;
                    opt.Update(weights, weights + dim, src + order[j] * dim,
                               dim, updates);
                    Store64(row + kCountAt, updates + 1);
                  });
      });
}

uint64_t SparseTable::size() const {
  uint64_t total = 0;
  for (const auto& stripe : stripes_) {
    std::lock_guard<std::mutex> lock(stripe->mu);
    total += stripe->rows;
  }
  return total;
}

bool SparseTable::Lookup(uint64_t key, std::span<float> out) const {
  const uint64_t hash = Mix64(key);
  const Stripe& stripe =
      *stripes_[StripeFor(hash, static_cast<uint32_t>(stripes_.size()))];
  std::lock_guard<std::mutex> lock(stripe.mu);
  const uint32_t slot = stripe.Find(key, hash, row_stride_);
  if (slot == kAbsent) return false;
  std::memcpy(out.data(), stripe.Row(slot, row_stride_) + kWeightsAt,
              config_.dim * sizeof(float));
  return true;
}

void SparseTable::ForEachRow(
    const std::function<void(uint64_t, std::span<const float>, uint64_t)>& fn)
    const {
  for (const auto& stripe : stripes_) {
    std::lock_guard<std::mutex> lock(stripe->mu);
    for (uint32_t slot = 0; slot < stripe->rows; ++slot) {
      const float* row = stripe->Row(slot, row_stride_);
      fn(Load64(row + kKeyAt),
         std::span<const float>(row + kWeightsAt, config_.dim),
         Load64(row + kCountAt));
    }
  }
}

}  // namespace hetps
