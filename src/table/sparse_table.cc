#include "table/sparse_table.h"

#include <algorithm>
#include <atomic>
#include <bit>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <functional>
#include <latch>
#include <memory>
#include <span>
#include <system_error>
#include <thread>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/hash/hash.h"
#include "absl/synchronization/blocking_counter.h"
#include "absl/synchronization/mutex.h"
#include "common/task_pool.h"
#include "table/initializer.h"

namespace hetps {
namespace {

// On a table larger than the caches a request is bound by cache misses, not
// arithmetic, so the passes below keep the misses of many keys in flight:
// the hash index and the rows are prefetched this many keys ahead of use.
constexpr uint32_t kPrefetchAhead = 16;

// ... but only on tables of at least this many rows. Below it the table
// mostly sits in cache and the prefetches are pure overhead (measured on a
// 2-core EPYC: -8% at 100k rows, +25% at 1M rows).
constexpr uint64_t kPrefetchMinRows = uint64_t{1} << 18;

// Requests of at least this much work (SplitWorth: keys times the floats
// of a row, plus kKeyWork a key) are grouped and processed by two threads,
// the caller and its helper (ThreadHelper). In process a split costs
// ~20-30 us (table_bench, 2 cores: a 3,000 x 16 push 32 -> 50 us) and pays
// from ~10k keys of dim 16 (push 121 -> 97 us). In a server it pays later:
// the helper's core is the one gRPC and the clients use too, and rows move
// between the cores' caches (push_pull_bench 1x1: 10k x 16 1.2x slower,
// 30k x 16 level, 100k x 16 0.85-0.95x, 100k x 1 push 0.85-0.93x;
// docs/BENCHMARKS.md §1).
constexpr uint64_t kParallelWork = 1'000'000;
// A key's own work (hashing it twice, finding its row), in floats.
constexpr uint64_t kKeyWork = 8;

constexpr uint64_t kCacheLine = 64;

// Larger requests are cut into pieces whose indices fit the 32-bit scratch.
constexpr size_t kMaxChunk = size_t{1} << 31;

// Rows live in chunks of about this many bytes, so a growing stripe never
// copies its rows (no multi-millisecond stall under the lock, no transient
// double memory when a stripe holds millions of rows).
constexpr uint64_t kChunkBytes = uint64_t{1} << 20;

// Stripe choice. Folding the high half of the key into the low half and
// multiplying by 2^64/phi makes the top bits of the product depend on all 64
// key bits, so sequential ids and packed keys (field << 32 | id) spread
// evenly; those top bits are mapped onto [0, n) without a division. It runs
// twice per key per request, hence cheaper than a full mixer; the stripe's
// own index then hashes the key independently (absl::Hash).
uint32_t StripeFor(uint64_t key, uint32_t n) {
  const uint64_t h = (key ^ (key >> 32)) * 0x9e3779b97f4a7c15ULL;
  return static_cast<uint32_t>(((h >> 32) * n) >> 32);
}

// log2 of the rows per chunk: the largest power of two that fits
// kChunkBytes, at least 2.
uint32_t ChunkShift(uint64_t row_stride) {
  const uint64_t rows = kChunkBytes / (row_stride * sizeof(float));
  return static_cast<uint32_t>(std::bit_width(std::max<uint64_t>(rows, 2))) - 1;
}

uint64_t LoadCount(const float* at) {
  uint64_t count;
  std::memcpy(&count, at, sizeof(count));
  return count;
}

void StoreCount(float* at, uint64_t count) {
  std::memcpy(at, &count, sizeof(count));
}

// One request's keys grouped by stripe: for position p in
// [begin[s], begin[s + 1]), keys[p] is the request's key number order[p],
// which lies in stripe s, and slots[p] receives its slot. Kept per calling
// thread and reused, so a request allocates nothing once they have grown.
struct StripeGroups {
  std::vector<uint32_t> counts[2];  // per stripe, per grouping thread
  std::vector<uint32_t> cursors[2];
  std::vector<uint32_t> begin;
  std::vector<uint32_t> order;
  std::vector<uint64_t> keys;
  std::vector<uint32_t> slots;
  std::vector<uint64_t> moves;  // per stripe, for a KeyPlan
};

StripeGroups& ThreadGroups() {
  thread_local StripeGroups groups;
  return groups;
}

// Counting sort by stripe, pass 1 over request indices [from, to).
void CountStripes(std::span<const uint64_t> keys, size_t from, size_t to,
                  uint32_t n, uint32_t* counts) {
  for (size_t i = from; i < to; ++i) ++counts[StripeFor(keys[i], n)];
}

// Pass 2: places [from, to) from the per-stripe `cursor`s on. Hashing again
// is cheaper than storing each key's stripe and reading it back.
void PlaceKeys(std::span<const uint64_t> keys, size_t from, size_t to,
               uint32_t n, uint32_t* cursor, StripeGroups& g) {
  uint32_t* order = g.order.data();
  uint64_t* grouped = g.keys.data();
  for (size_t i = from; i < to; ++i) {
    const uint32_t p = cursor[StripeFor(keys[i], n)]++;
    order[p] = static_cast<uint32_t>(i);
    grouped[p] = keys[i];
  }
}

// The calling thread's helper for the requests it splits: one thread kept
// per caller (a server's gRPC or reader threads), so callers never wait on
// each other's halves; it ends after idling like any TaskPool thread.
TaskPool& ThreadHelper() {
  thread_local TaskPool helper("table-helper", 1);
  return helper;
}

// Until `done()`: the two threads of a split request meet between phases
// microseconds apart, while a thread blocked in the kernel takes tens of
// microseconds to wake on a virtual machine's idle core (3-5 such wakes
// made a split 3,000-key push 5x slower); so spin first, yielding now and
// then (on a busy core the other half may be waiting for this one), then
// block.
template <typename Done, typename Block>
void SpinThenBlock(Done done, Block block) {
  constexpr auto kSpinFor = std::chrono::microseconds(50);
  const auto until = std::chrono::steady_clock::now() + kSpinFor;
  for (uint32_t i = 1;; ++i) {
    if (done()) return;
    if (i % 64 == 0) {
      if (std::chrono::steady_clock::now() >= until) break;
      std::this_thread::yield();
    }
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#endif
  }
  block();
}

void ArriveAndWait(std::latch& latch) {
  latch.count_down();
  SpinThenBlock([&] { return latch.try_wait(); }, [&] { latch.wait(); });
}

// Whether a request of `keys` keys, each touching `floats` floats of row
// and values, is worth splitting between two threads.
bool SplitWorth(size_t keys, uint64_t floats) {
  return keys * (floats + kKeyWork) >= kParallelWork;
}

// Groups `keys` by stripe into `g` and calls fn(stripe, first, count) for
// every stripe holding some, [first, first + count) being its positions.
// When `in_two`, the calling thread and its helper each group half of the
// keys, then process a disjoint run of stripes holding about half of them,
// so the two never contend for a stripe lock.
template <typename Fn>
void ForEachStripeGroup(std::span<const uint64_t> keys, uint32_t n,
                        StripeGroups& g, bool in_two, Fn fn) {
  const size_t total = keys.size();
  if (g.order.size() < total) {
    g.order.resize(total);
    g.keys.resize(total);
    g.slots.resize(total);
  }
  g.begin.resize(n + 1);
  for (auto* v : {&g.counts[0], &g.counts[1]}) v->assign(n, 0);
  for (auto* v : {&g.cursors[0], &g.cursors[1]}) v->resize(n);

  // Stripe s's positions hold its keys from the first half of the request,
  // then those from the second half. part 0 lays out begin[] and returns
  // the first stripe of the helper's share (stripes [mid, n) hold about half
  // of the keys); part 1 only needs its own cursors.
  auto lay_out = [&](int part) {
    uint32_t at = 0;
    uint32_t mid = n;
    for (uint32_t s = 0; s < n; ++s) {
      if (part == 0) {
        if (mid == n && at >= total / 2) mid = s;
        g.begin[s] = at;
        g.cursors[0][s] = at;
      } else {
        g.cursors[1][s] = at + g.counts[0][s];
      }
      at += g.counts[0][s] + g.counts[1][s];
    }
    if (part == 0) g.begin[n] = at;
    return mid;
  };
  auto run = [&](uint32_t from, uint32_t to) {
    for (uint32_t s = from; s < to; ++s) {
      const uint32_t b = g.begin[s];
      const uint32_t e = g.begin[s + 1];
      if (b != e) fn(s, b, e - b);
    }
  };

  auto sequential = [&] {
    CountStripes(keys, 0, total, n, g.counts[0].data());
    lay_out(0);
    PlaceKeys(keys, 0, total, n, g.cursors[0].data(), g);
    run(0, n);
  };
  if (!in_two || n < 2) {
    sequential();
    return;
  }
  // The latches order the phases: both halves counted before any layout,
  // all keys placed (and `mid` set) before any stripe is processed.
  std::latch counted(2);
  std::latch placed(2);
  uint32_t mid = 0;
  auto share = [&](int part) {
    const size_t from = part == 0 ? 0 : total / 2;
    const size_t to = part == 0 ? total / 2 : total;
    CountStripes(keys, from, to, n, g.counts[part].data());
    ArriveAndWait(counted);
    const uint32_t split = lay_out(part);
    if (part == 0) mid = split;
    PlaceKeys(keys, from, to, n, g.cursors[part].data(), g);
    ArriveAndWait(placed);
    if (part == 0) {
      run(0, mid);
    } else {
      run(mid, n);
    }
  };
  // `finished` is only spun on; `helped` is what may be destroyed as soon
  // as its wait returns.
  std::atomic<bool> finished = false;
  absl::BlockingCounter helped(1);
  try {
    ThreadHelper().Run([&] {
      share(1);
      finished.store(true, std::memory_order_release);
      helped.DecrementCount();
    });
  } catch (const std::system_error&) {
    sequential();  // no thread to be had: slower, still correct
    return;
  }
  share(0);
  SpinThenBlock([&] { return finished.load(std::memory_order_acquire); },
                [] {});
  helped.Wait();
}

// Scratch for requests beyond this many keys is freed afterwards, so that a
// rare huge request does not pin its buffers in every thread that served
// one.
constexpr size_t kRetainedScratchKeys = size_t{1} << 20;

void ReleaseIfLarge(StripeGroups& g) {
  if (g.order.size() > kRetainedScratchKeys) g = StripeGroups{};
}

// Requests of kPlanMinKeys to kPlanMaxKeys keys may keep their KeyPlan
// (a smaller one groups and finds its rows in a few microseconds, about
// what a plan's lock and allocations cost); a table's plans hold at most
// kPlanBudgetKeys keys in all, at 16 bytes a key (8 MiB), the least
// recently used dropped first.
constexpr size_t kPlanMinKeys = 512;
constexpr uint64_t kPlanBudgetKeys = uint64_t{1} << 19;
constexpr size_t kPlanMaxKeys = kPlanBudgetKeys / 4;
// Keeping a plan costs its copies, a third of the request (table_bench,
// every plan kept and none found: 10k-key pull 76 -> 101 us), and pays only
// when a later request finds it (the same pull 80 -> 34 us). So each plan
// kept spends a credit and each one found earns two back, up to
// kPlanMaxCredit. Without credit, as a table starts, a request keeps its
// plan when one of the last 16 that found none without credit had its keys
// (a request asked for twice is likely asked for again), and otherwise one
// request in kPlanProbeEvery, drawn at random, keeps its own, so that a
// request whose keys come once more, as a training step's push after its
// pull, is noticed. (Not every 16th request: pulls and pushes come in
// turn, every 16th would be a pull, and the next step's push never finds a
// pull's plan.)
constexpr uint32_t kPlanMaxCredit = 16;
constexpr uint32_t kPlanProbeEvery = 16;

// What a plan is looked up by: the number of keys and five of them.
uint64_t SampleOf(std::span<const uint64_t> keys) {
  const size_t n = keys.size();
  return absl::Hash<
      std::tuple<size_t, uint64_t, uint64_t, uint64_t, uint64_t, uint64_t>>()(
      std::make_tuple(n, keys[0], keys[n / 4], keys[n / 2], keys[3 * n / 4],
                      keys[n - 1]));
}

}  // namespace

// How a request's keys group by stripe and where their rows are. A
// training step pulls its batch's keys and pushes their gradients in the
// same order: the push finds them grouped and located. Made whole, then
// only read (shared by the requests that find it).
struct SparseTable::KeyPlan {
  std::vector<uint64_t> keys;   // the request's, in its order
  std::vector<uint32_t> begin;  // stripe s: positions [begin[s], begin[s+1])
  std::vector<uint32_t> order;  // position -> index in `keys`
  std::vector<uint32_t> slots;  // position -> its row's slot
  std::vector<uint64_t> moves;  // stripe -> its `moves` when found
};

std::shared_ptr<const SparseTable::KeyPlan> SparseTable::FindPlan(
    std::span<const uint64_t> keys, uint64_t sample) {
  std::shared_ptr<const KeyPlan> found;
  {
    absl::MutexLock lock(&plans_mu_);
    for (KeptPlan& kept : plans_) {
      if (kept.sample == sample && kept.keys == keys.size()) {
        kept.used = ++plan_uses_;
        found = kept.plan;
        break;
      }
    }
  }
  if (found == nullptr ||
      std::memcmp(found->keys.data(), keys.data(), keys.size_bytes()) != 0) {
    return nullptr;
  }
  absl::MutexLock lock(&plans_mu_);
  ++plan_counts_.found;
  plan_credit_ = std::min(plan_credit_ + 2, kPlanMaxCredit);
  return found;
}

bool SparseTable::PlanWanted(uint64_t sample) {
  absl::MutexLock lock(&plans_mu_);
  if (plan_credit_ > 0) {
    --plan_credit_;
    return true;
  }
  if (std::find(unplanned_.begin(), unplanned_.end(), sample) !=
      unplanned_.end()) {
    return true;
  }
  unplanned_[next_unplanned_] = sample;
  next_unplanned_ = (next_unplanned_ + 1) % unplanned_.size();
  // xorshift64
  plan_draw_ ^= plan_draw_ << 13;
  plan_draw_ ^= plan_draw_ >> 7;
  plan_draw_ ^= plan_draw_ << 17;
  return plan_draw_ % kPlanProbeEvery == 0;
}

void SparseTable::KeepPlan(std::shared_ptr<const KeyPlan> plan,
                           uint64_t sample) {
  const size_t keys = plan->keys.size();
  std::vector<std::shared_ptr<const KeyPlan>> dropped;  // freed unlocked
  absl::MutexLock lock(&plans_mu_);
  ++plan_counts_.kept;
  planned_keys_ += keys;
  plans_.push_back({sample, keys, std::move(plan), ++plan_uses_});
  while (planned_keys_ > kPlanBudgetKeys) {
    auto oldest = std::min_element(
        plans_.begin(), plans_.end(),
        [](const KeptPlan& a, const KeptPlan& b) { return a.used < b.used; });
    planned_keys_ -= oldest->keys;
    dropped.push_back(std::move(oldest->plan));
    *oldest = std::move(plans_.back());
    plans_.pop_back();
  }
}

template <typename Fn>
void SparseTable::ForEachLocatedGroup(std::span<const uint64_t> keys,
                                      bool in_two, Fn fn) {
  const uint32_t n = static_cast<uint32_t>(stripes_.size());
  const bool plannable =
      !in_two && keys.size() >= kPlanMinKeys && keys.size() <= kPlanMaxKeys;
  StripeGroups& g = ThreadGroups();
  const uint64_t sample = plannable ? SampleOf(keys) : 0;
  if (plannable) {
    if (const std::shared_ptr<const KeyPlan> plan = FindPlan(keys, sample)) {
      if (g.slots.size() < keys.size()) {
        g.keys.resize(keys.size());
        g.slots.resize(keys.size());
      }
      for (uint32_t s = 0; s < n; ++s) {
        const uint32_t first = plan->begin[s];
        const uint32_t count = plan->begin[s + 1] - first;
        if (count == 0) continue;
        Stripe& stripe = *stripes_[s];
        absl::MutexLock lock(&stripe.mu);
        const uint32_t* slots = plan->slots.data() + first;
        if (stripe.moves != plan->moves[s]) {
          // Rows left their slots since: found again.
          uint64_t* grouped = g.keys.data() + first;
          for (uint32_t j = 0; j < count; ++j) {
            grouped[j] = keys[plan->order[first + j]];
          }
          LocateRows(stripe, grouped, count, g.slots.data() + first);
          slots = g.slots.data() + first;
        }
        fn(stripe, plan->order.data() + first, slots, count);
      }
      return;
    }
  }
  g.moves.resize(n);
  ForEachStripeGroup(keys, n, g, in_two,
                     [&](uint32_t s, uint32_t first, uint32_t count) {
                       Stripe& stripe = *stripes_[s];
                       uint32_t* slots = g.slots.data() + first;
                       absl::MutexLock lock(&stripe.mu);
                       LocateRows(stripe, g.keys.data() + first, count, slots);
                       g.moves[s] = stripe.moves;
                       fn(stripe, g.order.data() + first, slots, count);
                     });
  if (plannable && PlanWanted(sample)) {
    const size_t total = keys.size();
    auto plan = std::make_shared<KeyPlan>();
    plan->keys.assign(keys.begin(), keys.end());
    plan->begin = g.begin;
    plan->order.assign(g.order.begin(), g.order.begin() + total);
    plan->slots.assign(g.slots.begin(), g.slots.begin() + total);
    plan->moves = g.moves;
    KeepPlan(std::move(plan), sample);
  }
  ReleaseIfLarge(g);
}

SparseTable::SparseTable(const TableConfig& config,
                         std::unique_ptr<Optimizer> optimizer, int stripes)
    : config_(config),
      optimizer_(std::move(optimizer)),
      state_width_(optimizer_->StateWidth(config_.dim)),
      row_stride_((config_.dim + state_width_ + 2 + 1) & ~uint64_t{1}),
      chunk_shift_(ChunkShift(row_stride_)) {
  const int count = std::max(stripes, 1);
  stripes_.reserve(count);
  for (int i = 0; i < count; ++i) {
    stripes_.push_back(std::make_unique<Stripe>());
  }
}

SparseTable::~SparseTable() = default;

int SparseTable::StripeOf(uint64_t key) const {
  return static_cast<int>(
      StripeFor(key, static_cast<uint32_t>(stripes_.size())));
}

float* SparseTable::Row(const Stripe& stripe, uint32_t slot) const {
  const uint32_t mask = (uint32_t{1} << chunk_shift_) - 1;
  return stripe.chunks[slot >> chunk_shift_].get() +
         uint64_t{slot & mask} * row_stride_;
}

uint64_t& SparseTable::KeyOf(const Stripe& stripe, uint32_t slot) const {
  const uint32_t mask = (uint32_t{1} << chunk_shift_) - 1;
  return stripe.key_chunks[slot >> chunk_shift_][slot & mask];
}

uint32_t SparseTable::AddSlot(Stripe& stripe, uint64_t key) {
  const uint32_t slot = stripe.rows;
  if ((slot & ((uint32_t{1} << chunk_shift_) - 1)) == 0) {
    // Not zeroed: only the rows in use are ever touched, so a chunk's pages
    // are committed as it fills.
    stripe.chunks.push_back(std::make_unique_for_overwrite<float[]>(
        (uint64_t{1} << chunk_shift_) * row_stride_));
    stripe.key_chunks.push_back(std::make_unique_for_overwrite<uint64_t[]>(
        uint64_t{1} << chunk_shift_));
  }
  ++stripe.rows;
  KeyOf(stripe, slot) = key;
  stripe.index.insert(IndexEntry::Of(key, slot));
  return slot;
}

uint32_t SparseTable::CreateRow(Stripe& stripe, uint64_t key) {
  const uint32_t slot = AddSlot(stripe, key);
  float* row = Row(stripe, slot);
  const uint64_t dim = config_.dim;
  for (uint64_t c = 0; c < dim; ++c) {
    row[c] = InitialValue(config_.init, key, c);
  }
  optimizer_->InitState(row, row + dim, dim);
  const uint64_t count_at = dim + state_width_;
  StoreCount(row + count_at, 0);
  if (count_at + 2 < row_stride_) row[count_at + 2] = 0.0f;  // padding
  return slot;
}

bool SparseTable::WorthPrefetching(const Stripe& stripe) const {
  // Keys spread evenly over stripes, so one stripe tells the table's size.
  return uint64_t{stripe.rows} * stripes_.size() >= kPrefetchMinRows;
}

void SparseTable::LocateRows(Stripe& stripe, const uint64_t* keys,
                             uint32_t count, uint32_t* slots) {
  const bool prefetch = WorthPrefetching(stripe);
  for (uint32_t j = 0; j < count; ++j) {
    if (prefetch && j + kPrefetchAhead < count) {
      stripe.index.prefetch(keys[j + kPrefetchAhead]);
    }
    // Warm rows are the common case: a plain find, with the creation path
    // out of line.
    const auto it = stripe.index.find(keys[j]);
    slots[j] = it != stripe.index.end() ? it->slot : CreateRow(stripe, keys[j]);
  }
}

void SparseTable::Pull(std::span<const uint64_t> keys, std::span<float> out) {
  PullAhead(keys, {}, 1.0f, out);
}

void SparseTable::PullAhead(std::span<const uint64_t> keys,
                            std::span<const float* const> ahead,
                            float step_scale, std::span<float> out) {
  const uint64_t dim = config_.dim;
  if (keys.size() > kMaxChunk) {
    PullAhead(keys.first(kMaxChunk),
              ahead.empty() ? ahead : ahead.first(kMaxChunk), step_scale,
              out.first(kMaxChunk * dim));
    PullAhead(keys.subspan(kMaxChunk),
              ahead.empty() ? ahead : ahead.subspan(kMaxChunk), step_scale,
              out.subspan(kMaxChunk * dim));
    return;
  }
  const uint64_t count_at = dim + state_width_;
  float* const dst = out.data();
  // Output rows narrower than a cache line share lines between the two
  // threads' writes, which costs more than a split saves while the table
  // sits in cache (table_bench: 1.2x at 100k x 1); once it misses, a split
  // pays again (0.6x at 1M x 1).
  bool in_two = SplitWorth(keys.size(), row_stride_);
  if (in_two && dim * sizeof(float) < kCacheLine) {
    absl::MutexLock lock(&stripes_[0]->mu);
    in_two = WorthPrefetching(*stripes_[0]);
  }
  ForEachLocatedGroup(
      keys, in_two,
      [&](Stripe& stripe, const uint32_t* order, const uint32_t* slots,
          uint32_t count) {
        stripe.mu.AssertHeld();
        // A row stepped ahead is worked on here, never in the table.
        std::vector<float> scratch(ahead.empty() ? 0 : count_at);
        const bool prefetch = WorthPrefetching(stripe);
        for (uint32_t j = 0; j < count; ++j) {
          if (prefetch && j + kPrefetchAhead < count) {
            __builtin_prefetch(Row(stripe, slots[j + kPrefetchAhead]));
          }
          const float* row = Row(stripe, slots[j]);
          float* to = dst + order[j] * dim;
          if (!ahead.empty() && ahead[order[j]] != nullptr) {
            std::memcpy(scratch.data(), row, count_at * sizeof(float));
            optimizer_->Update(scratch.data(), scratch.data() + dim,
                               ahead[order[j]], dim, LoadCount(row + count_at),
                               step_scale);
            std::memcpy(to, scratch.data(), dim * sizeof(float));
          } else if (dim == 1) {
            *to = *row;  // logistic regression: no memcpy call
          } else {
            std::memcpy(to, row, dim * sizeof(float));
          }
        }
      });
}

void SparseTable::Push(std::span<const uint64_t> keys,
                       std::span<const float> grads, float step_scale) {
  if (!holding_.load(std::memory_order_acquire)) {
    return ApplyPush(keys, grads, step_scale);
  }
  HeldPush now(step_scale);  // the rows not held, when some are
  bool some_held = false;
  {
    absl::MutexLock lock(&hold_mu_);
    if (held_ != nullptr &&
        std::any_of(keys.begin(), keys.end(), std::cref(held_))) {
      HeldPush held(step_scale);
      SplitHeld(keys, grads, &held, &now);
      held_pushes_.push_back(std::move(held));
      some_held = true;
    }
  }
  // The rows not held are applied outside the lock (pushes go on in
  // parallel): no later hold names them, since their buckets were here
  // when this push was checked.
  if (!some_held) return ApplyPush(keys, grads, step_scale);
  if (!now.keys.empty()) ApplyPush(now.keys, now.grads, step_scale);
}

void SparseTable::SplitHeld(std::span<const uint64_t> keys,
                            std::span<const float> grads, HeldPush* held,
                            HeldPush* other) const {
  const uint64_t dim = config_.dim;
  for (size_t i = 0; i < keys.size(); ++i) {
    HeldPush* to = held_ != nullptr && held_(keys[i]) ? held : other;
    to->keys.push_back(keys[i]);
    to->grads.insert(to->grads.end(), grads.begin() + i * dim,
                     grads.begin() + (i + 1) * dim);
  }
}

void SparseTable::HoldPushes(std::function<bool(uint64_t)> held) {
  absl::MutexLock lock(&hold_mu_);
  held_ = std::move(held);
  holding_.store(held_ != nullptr, std::memory_order_release);
  // What the hold no longer names is applied, in the order it came, before
  // a push can meet its rows (Push takes this lock while holding_).
  std::vector<HeldPush> still;
  for (const HeldPush& push : held_pushes_) {
    HeldPush keep(push.step_scale);
    HeldPush now(push.step_scale);
    SplitHeld(push.keys, push.grads, &keep, &now);
    if (!now.keys.empty()) ApplyPush(now.keys, now.grads, now.step_scale);
    if (!keep.keys.empty()) still.push_back(std::move(keep));
  }
  held_pushes_ = std::move(still);
}

SparseTable::PlanCounts SparseTable::plan_counts() const {
  absl::MutexLock lock(&plans_mu_);
  return plan_counts_;
}

uint64_t SparseTable::held_rows() const {
  absl::MutexLock lock(&hold_mu_);
  uint64_t rows = 0;
  for (const HeldPush& push : held_pushes_) rows += push.keys.size();
  return rows;
}

void SparseTable::ApplyPush(std::span<const uint64_t> keys,
                            std::span<const float> grads, float step_scale) {
  const uint64_t dim = config_.dim;
  if (keys.size() > kMaxChunk) {
    ApplyPush(keys.first(kMaxChunk), grads.first(kMaxChunk * dim), step_scale);
    ApplyPush(keys.subspan(kMaxChunk), grads.subspan(kMaxChunk * dim),
              step_scale);
    return;
  }
  const float* const src = grads.data();
  const uint64_t count_at = dim + state_width_;
  const Optimizer& opt = *optimizer_;
  ForEachLocatedGroup(
      keys, SplitWorth(keys.size(), row_stride_),
      [&](Stripe& stripe, const uint32_t* order, const uint32_t* slots,
          uint32_t count) {
        stripe.mu.AssertHeld();
        const bool prefetch = WorthPrefetching(stripe);
        for (uint32_t j = 0; j < count; ++j) {
          if (prefetch && j + kPrefetchAhead < count) {
            __builtin_prefetch(Row(stripe, slots[j + kPrefetchAhead]), 1);
            __builtin_prefetch(src + order[j + kPrefetchAhead] * dim);
          }
          if (stripe.snapshot != nullptr) BeforeRowWrite(stripe, slots[j]);
          float* row = Row(stripe, slots[j]);
          const uint64_t updates = LoadCount(row + count_at);
          opt.Update(row, row + dim, src + order[j] * dim, dim, updates,
                     step_scale);
          StoreCount(row + count_at, updates + 1);
        }
      });
}

uint64_t SparseTable::size() const {
  uint64_t total = 0;
  for (const auto& stripe : stripes_) {
    absl::MutexLock lock(&stripe->mu);
    total += stripe->rows;
  }
  return total;
}

bool SparseTable::Lookup(uint64_t key, std::span<float> out) const {
  const Stripe& stripe = *stripes_[StripeOf(key)];
  absl::MutexLock lock(&stripe.mu);
  const auto it = stripe.index.find(key);
  if (it == stripe.index.end()) return false;
  std::memcpy(out.data(), Row(stripe, it->slot), config_.dim * sizeof(float));
  return true;
}

void SparseTable::ForEachRow(
    const std::function<void(uint64_t, std::span<const float>, uint64_t)>& fn)
    const {
  ForEachRowWithState([&](uint64_t key, std::span<const float> weights,
                          std::span<const float>,
                          uint64_t updates) { fn(key, weights, updates); });
}

void SparseTable::ForEachRowWithState(
    const std::function<void(uint64_t, std::span<const float>,
                             std::span<const float>, uint64_t)>& fn,
    const KeySelector& take) const {
  const uint64_t dim = config_.dim;
  // Last stripe first: requests lock theirs first to last, so one that
  // waits for a stripe visited here meets this walk once, not at every
  // stripe after it.
  for (auto it = stripes_.rbegin(); it != stripes_.rend(); ++it) {
    const Stripe& stripe = **it;
    absl::MutexLock lock(&stripe.mu);
    std::vector<uint32_t> chosen;
    if (take) chosen = ChosenSlots(stripe, take);
    const uint32_t count =
        take ? static_cast<uint32_t>(chosen.size()) : stripe.rows;
    for (uint32_t i = 0; i < count; ++i) {
      const uint32_t slot = take ? chosen[i] : i;
      const float* row = Row(stripe, slot);
      fn(KeyOf(stripe, slot), std::span<const float>(row, dim),
         std::span<const float>(row + dim, state_width_),
         LoadCount(row + dim + state_width_));
    }
  }
}

std::vector<uint32_t> SparseTable::ChosenSlots(const Stripe& stripe,
                                               const KeySelector& take) const {
  std::vector<uint32_t> chosen;
  const uint32_t per_chunk = uint32_t{1} << chunk_shift_;
  const auto choices =
      std::make_unique_for_overwrite<bool[]>(std::min(per_chunk, stripe.rows));
  for (uint32_t first = 0; first < stripe.rows; first += per_chunk) {
    const uint32_t n = std::min(per_chunk, stripe.rows - first);
    take(std::span<const uint64_t>(
             stripe.key_chunks[first >> chunk_shift_].get(), n),
         std::span<bool>(choices.get(), n));
    for (uint32_t i = 0; i < n; ++i) {
      if (choices[i]) chosen.push_back(first + i);
    }
  }
  return chosen;
}

void SparseTable::CopyChunk(Stripe& stripe, StripeSnapshot& snap,
                            uint32_t chunk) const {
  const uint64_t per_chunk = uint64_t{1} << chunk_shift_;
  const uint64_t first = uint64_t{chunk} << chunk_shift_;
  const uint64_t n = std::min<uint64_t>(per_chunk, snap.rows - first);
  snap.copies[chunk] = std::make_unique_for_overwrite<float[]>(n * row_stride_);
  std::memcpy(snap.copies[chunk].get(), stripe.chunks[chunk].get(),
              n * row_stride_ * sizeof(float));
  snap.state[chunk] = StripeSnapshot::Chunk::kCopied;
}

void SparseTable::BeforeRowWrite(Stripe& stripe, uint32_t slot) const {
  StripeSnapshot& snap = *stripe.snapshot;
  if (slot >= snap.rows) return;  // created after the snapshot
  const uint32_t chunk = slot >> chunk_shift_;
  if (snap.state[chunk] == StripeSnapshot::Chunk::kInTable) {
    CopyChunk(stripe, snap, chunk);
  }
}

void SparseTable::KeySnapshot(Stripe& stripe, StripeSnapshot& snap) const {
  if (snap.keyed) return;
  snap.keys.resize(snap.rows);
  for (uint32_t slot = 0; slot < snap.rows; ++slot) {
    snap.keys[slot] = KeyOf(stripe, slot);
  }
  snap.keyed = true;
}

std::unique_ptr<SparseTable::Snapshot> SparseTable::TakeSnapshot() {
  std::unique_ptr<Snapshot> snapshot(new Snapshot(this));
  const uint64_t per_chunk = uint64_t{1} << chunk_shift_;
  for (size_t s = 0; s < stripes_.size(); ++s) {
    Stripe& stripe = *stripes_[s];
    StripeSnapshot& snap = snapshot->stripes_[s];
    absl::MutexLock lock(&stripe.mu);
    snap.rows = stripe.rows;
    const size_t chunks = (snap.rows + per_chunk - 1) / per_chunk;
    snap.state.assign(chunks, StripeSnapshot::Chunk::kInTable);
    snap.copies.resize(chunks);
    stripe.snapshot = &snap;
  }
  return snapshot;
}

SparseTable::Snapshot::Snapshot(SparseTable* table)
    : table_(table), stripes_(table->stripes_.size()) {}

SparseTable::Snapshot::~Snapshot() {
  for (size_t s = 0; s < stripes_.size(); ++s) {
    Stripe& stripe = *table_->stripes_[s];
    absl::MutexLock lock(&stripe.mu);
    if (stripe.snapshot == &stripes_[s]) stripe.snapshot = nullptr;
  }
}

void SparseTable::Snapshot::ForEachRow(
    const std::function<void(uint64_t, std::span<const float>,
                             std::span<const float>, uint64_t)>& fn) {
  const uint64_t dim = table_->config_.dim;
  const uint64_t width = table_->state_width_;
  const uint64_t stride = table_->row_stride_;
  const uint32_t shift = table_->chunk_shift_;
  for (size_t s = 0; s < stripes_.size(); ++s) {
    Stripe& stripe = *table_->stripes_[s];
    StripeSnapshot& snap = stripes_[s];
    {
      absl::MutexLock lock(&stripe.mu);
      table_->KeySnapshot(stripe, snap);
    }
    for (uint32_t c = 0; c < snap.state.size(); ++c) {
      std::unique_ptr<float[]> copy;
      {
        // Copied here unless a write did first; after that, writes leave
        // the chunk alone.
        absl::MutexLock lock(&stripe.mu);
        if (snap.state[c] == StripeSnapshot::Chunk::kInTable) {
          table_->CopyChunk(stripe, snap, c);
        }
        copy = std::move(snap.copies[c]);
        snap.state[c] = StripeSnapshot::Chunk::kRead;
      }
      const uint64_t first = uint64_t{c} << shift;
      const uint64_t n =
          std::min<uint64_t>(uint64_t{1} << shift, snap.rows - first);
      for (uint64_t i = 0; i < n; ++i) {
        const float* row = copy.get() + i * stride;
        fn(snap.keys[first + i], std::span<const float>(row, dim),
           std::span<const float>(row + dim, width),
           LoadCount(row + dim + width));
      }
    }
    absl::MutexLock lock(&stripe.mu);
    if (stripe.snapshot == &snap) stripe.snapshot = nullptr;
    snap = StripeSnapshot{};
  }
}

uint64_t SparseTable::ExtractRows(
    const KeySelector& take,
    const std::function<void(uint64_t, std::span<const float>,
                             std::span<const float>, uint64_t)>& fn) {
  const uint64_t dim = config_.dim;
  uint64_t removed = 0;
  // Last stripe first, as ForEachRowWithState.
  for (auto it = stripes_.rbegin(); it != stripes_.rend(); ++it) {
    const auto& stripe = *it;
    absl::MutexLock lock(&stripe->mu);
    // The slots to free, lowest first.
    const std::vector<uint32_t> freed = ChosenSlots(*stripe, take);
    if (freed.empty()) continue;
    if (StripeSnapshot* snap = stripe->snapshot) {
      // Rows are about to move between slots: the snapshot takes all it
      // still reads from the table now.
      KeySnapshot(*stripe, *snap);
      for (uint32_t c = 0; c < snap->state.size(); ++c) {
        if (snap->state[c] == StripeSnapshot::Chunk::kInTable) {
          CopyChunk(*stripe, *snap, c);
        }
      }
      stripe->snapshot = nullptr;
    }
    for (uint32_t slot : freed) {
      const uint64_t key = KeyOf(*stripe, slot);
      const float* row = Row(*stripe, slot);
      fn(key, std::span<const float>(row, dim),
         std::span<const float>(row + dim, state_width_),
         LoadCount(row + dim + state_width_));
      stripe->index.erase(key);
    }
    // Fill the freed slots from the end, highest first, so a row moved in
    // is never one still to be freed.
    for (auto slot = freed.rbegin(); slot != freed.rend(); ++slot) {
      const uint32_t last = --stripe->rows;
      if (*slot != last) {
        std::copy_n(Row(*stripe, last), row_stride_, Row(*stripe, *slot));
        const uint64_t moved = KeyOf(*stripe, last);
        KeyOf(*stripe, *slot) = moved;
        stripe->index.find(moved)->slot = *slot;
      }
    }
    // Chunks past the last row are returned.
    const uint64_t chunks =
        (uint64_t{stripe->rows} + (uint64_t{1} << chunk_shift_) - 1) >>
        chunk_shift_;
    stripe->chunks.resize(chunks);
    stripe->key_chunks.resize(chunks);
    ++stripe->moves;
    removed += freed.size();
  }
  return removed;
}

void SparseTable::RestoreRow(uint64_t key, std::span<const float> weights,
                             std::span<const float> state,
                             uint64_t update_count) {
  Stripe& stripe = *stripes_[StripeOf(key)];
  absl::MutexLock lock(&stripe.mu);
  const uint64_t dim = config_.dim;
  const auto it = stripe.index.find(key);
  uint32_t slot;
  if (it != stripe.index.end()) {
    slot = it->slot;
  } else if (weights.size() >= dim && state.size() >= state_width_) {
    // Written whole below: no initial values to compute (a move installs
    // thousands of rows while their requests wait).
    slot = AddSlot(stripe, key);
    const uint64_t padding_at = dim + state_width_ + 2;
    if (padding_at < row_stride_) Row(stripe, slot)[padding_at] = 0.0f;
  } else {
    slot = CreateRow(stripe, key);
  }
  if (stripe.snapshot != nullptr) BeforeRowWrite(stripe, slot);
  float* row = Row(stripe, slot);
  std::copy_n(weights.begin(), std::min<uint64_t>(dim, weights.size()), row);
  std::copy_n(state.begin(), std::min<uint64_t>(state_width_, state.size()),
              row + dim);
  StoreCount(row + dim + state_width_, update_count);
}

}  // namespace hetps
