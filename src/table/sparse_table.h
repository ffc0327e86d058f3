// SparseTable: 64-bit key → row of `dim` floats plus optimizer state and an
// update count. Rows are created on first touch (pull or push) with the
// table's deterministic initialiser.
//
// Thread-safety: all methods may be called concurrently. The key space is
// split into lock stripes; each stripe is an open-addressing hash map from key
// to a slot in contiguous row storage. A call takes each stripe's lock at
// most once (keys are grouped by stripe first), so a 100k-key request costs
// `stripes` lock round trips, not 100k. A request of the same keys in the
// same order as a recent one (a training step's push after its pull) finds
// them grouped and their rows located (plan_counts).
#pragma once

#include <array>
#include <atomic>
#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <span>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_set.h"
#include "absl/hash/hash.h"
#include "absl/synchronization/mutex.h"
#include "hetps/config.h"
#include "table/optimizer.h"

namespace hetps {

class SparseTable {
 public:
  // `config.kind` must be kSparse and `config.dim` >= 1 (validated by the
  // caller). `stripes` >= 1.
  SparseTable(const TableConfig& config, std::unique_ptr<Optimizer> optimizer,
              int stripes);
  ~SparseTable();
  SparseTable(const SparseTable&) = delete;
  SparseTable& operator=(const SparseTable&) = delete;

  const TableConfig& config() const { return config_; }
  uint64_t dim() const { return config_.dim; }

  // Copies the rows of `keys` into `out` (keys.size() * dim floats, row-major),
  // creating missing rows. Duplicate keys are allowed. Both spans are only
  // read/written during the call.
  void Pull(std::span<const uint64_t> keys, std::span<float> out);

  // As Pull, but where ahead[j] is not null, row j is written as one
  // optimizer step with gradient ahead[j] (dim floats) and `step_scale`
  // would leave it: what the next Push of that gradient will make of the
  // row. The table itself does not change. ahead.size() == keys.size().
  void PullAhead(std::span<const uint64_t> keys,
                 std::span<const float* const> ahead, float step_scale,
                 std::span<float> out);

  // Applies one optimizer step per key with gradient rows `grads`
  // (keys.size() * dim floats). Values must be finite (the server validates
  // them before calling). A key given twice gets two steps, one after the
  // other under its stripe's lock; the aggregators merge duplicates first
  // except in async mode, where a raw push that repeats a key (PsClient
  // never sends one) is applied as sent. `step_scale`: Optimizer::Update.
  void Push(std::span<const uint64_t> keys, std::span<const float> grads,
            float step_scale = 1.0f);

  // Rows on their way here (a bucket moving in; server/ps_server_moves.cc):
  // while `held` names a key, Push sets its gradient aside, with its
  // step_scale, instead of applying it. Called again with a `held` that no
  // longer names a key (null: none), it first applies what was set aside
  // for that key, in the order it came, so a push that follows meets the
  // row with those steps taken. Pushes of other keys go on meanwhile.
  void HoldPushes(std::function<bool(uint64_t)> held);
  // Gradient rows set aside by HoldPushes and not yet applied.
  uint64_t held_rows() const;

  // Requests of 512 to 131,072 keys (not split over two threads) may keep
  // how their keys group by stripe and where their rows are (a KeyPlan,
  // sparse_table.cc) for a request of the same keys in the same order, as
  // a training step's pull and push are, which then skips the grouping and
  // the index; a table keeps plans while they are found, and that of a
  // request asked for a second time. `kept`: plans made; `found`: requests
  // that found one.
  struct PlanCounts {
    uint64_t kept = 0;
    uint64_t found = 0;
  };
  PlanCounts plan_counts() const;

  // Number of rows held.
  uint64_t size() const;

  // Copies the row of `key` into `out` (dim floats) without creating it.
  // Returns false when the row does not exist.
  bool Lookup(uint64_t key, std::span<float> out) const;

  // Calls `fn(key, weights, update_count)` for every row, stripe by stripe
  // (each stripe locked while it is visited). Order is unspecified.
  void ForEachRow(const std::function<void(uint64_t, std::span<const float>,
                                           uint64_t)>& fn) const;

  // Floats of optimizer state per row.
  uint64_t state_width() const { return state_width_; }

  // Chooses the rows a walk takes by their keys: sets take[i] to whether
  // the row of keys[i] is taken. A walk hands it the keys of thousands of
  // rows at a time, so a selector's loop costs no call per row.
  using KeySelector =
      std::function<void(std::span<const uint64_t> keys, std::span<bool> take)>;

  // As ForEachRow, with the row's optimizer state (state_width() floats),
  // for the rows `take` chooses (every row without it): what a bucket handed
  // over copies. A row not chosen is not read, so a few rows of a large
  // table cost a pass over its keys (8 bytes a row), not over its rows.
  void ForEachRowWithState(
      const std::function<void(uint64_t, std::span<const float>,
                               std::span<const float>, uint64_t)>& fn,
      const KeySelector& take = nullptr) const;

  // A copy of the table as it was at one instant, read while the table goes
  // on changing (what a checkpoint writes; TakeSnapshot).
  class Snapshot;
  // The rows as they are now. Call it where no write runs (between two
  // applies); it takes each stripe's lock once, copying nothing. Writes go
  // on meanwhile: each chunk of rows (about 1 MiB) is copied before the
  // first write into it after this call, or when the snapshot's ForEachRow
  // reaches it, whichever comes first. One snapshot of a table at a time;
  // the table must outlive it.
  std::unique_ptr<Snapshot> TakeSnapshot();

  // Removes every row `take` chooses, handing each to `fn(key,
  // weights, state, update_count)` first: what a bucket that moves to
  // another server gives up (RestoreRow installs it there). Stripe by
  // stripe, each locked while it is visited; the last rows of a stripe move
  // into the freed slots, so its rows stay contiguous. Returns the rows
  // removed.
  uint64_t ExtractRows(
      const KeySelector& take,
      const std::function<void(uint64_t, std::span<const float>,
                               std::span<const float>, uint64_t)>& fn);

  // Sets the row of `key` (created when missing) to `weights` (dim floats),
  // `state` (state_width() floats) and `update_count`: what a checkpoint
  // restores.
  void RestoreRow(uint64_t key, std::span<const float> weights,
                  std::span<const float> state, uint64_t update_count);

 private:
  // What a snapshot holds of one stripe: its first `rows` slots as they
  // were, a chunk of them copied before the first write into it (or when
  // the snapshot reads it), and the key of each slot.
  struct StripeSnapshot {
    uint32_t rows = 0;
    enum class Chunk : uint8_t { kInTable, kCopied, kRead };
    std::vector<Chunk> state;  // by chunk
    std::vector<std::unique_ptr<float[]>> copies;  // by chunk, when kCopied
    std::vector<uint64_t> keys;  // by slot, once `keyed`
    bool keyed = false;
  };
  // An entry of a stripe's index: a key and its row's slot in 12 bytes (a
  // map's pair of the two would be padded to 16), found by the key alone.
  struct IndexEntry {
    std::array<uint32_t, 2> key_halves;
    mutable uint32_t slot;  // not part of what is looked up
    uint64_t key() const {
      uint64_t key;
      std::memcpy(&key, key_halves.data(), sizeof(key));
      return key;
    }
    static IndexEntry Of(uint64_t key, uint32_t slot) {
      IndexEntry entry;
      std::memcpy(entry.key_halves.data(), &key, sizeof(key));
      entry.slot = slot;
      return entry;
    }
  };
  struct IndexHash {
    using is_transparent = void;
    size_t operator()(uint64_t key) const {
      return absl::Hash<uint64_t>()(key);
    }
    size_t operator()(const IndexEntry& e) const { return (*this)(e.key()); }
  };
  static_assert(sizeof(IndexEntry) == 12);
  struct IndexEq {
    using is_transparent = void;
    static uint64_t Key(uint64_t key) { return key; }
    static uint64_t Key(const IndexEntry& e) { return e.key(); }
    template <typename A, typename B>
    bool operator()(const A& a, const B& b) const {
      return Key(a) == Key(b);
    }
  };
  // One lock stripe: the index from key to slot, the rows in chunks, and
  // the key of each slot in chunks of as many slots (what a walk over the
  // rows reads: a move's copy and drop, a snapshot, without the index).
  struct Stripe {
    mutable absl::Mutex mu;
    absl::flat_hash_set<IndexEntry, IndexHash, IndexEq> index
        ABSL_GUARDED_BY(mu);
    std::vector<std::unique_ptr<float[]>> chunks ABSL_GUARDED_BY(mu);
    std::vector<std::unique_ptr<uint64_t[]>> key_chunks ABSL_GUARDED_BY(mu);
    uint32_t rows ABSL_GUARDED_BY(mu) = 0;
    // The snapshot that still reads this stripe (null: none).
    StripeSnapshot* snapshot ABSL_GUARDED_BY(mu) = nullptr;
    // Counts the times rows left their slots (ExtractRows): a KeyPlan's
    // slots of this stripe hold while it is unchanged.
    uint64_t moves ABSL_GUARDED_BY(mu) = 0;
  };
  // Before slot `slot` of `stripe` is written: a snapshot that holds it in
  // the table gets a copy of its chunk.
  void BeforeRowWrite(Stripe& stripe, uint32_t slot) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(stripe.mu);
  // Copies chunk `chunk` of `stripe` (its rows the snapshot holds) into
  // the snapshot.
  void CopyChunk(Stripe& stripe, StripeSnapshot& snap, uint32_t chunk) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(stripe.mu);
  // Fills the snapshot's keys from the stripe's (its slots are still those
  // of the snapshot's instant: only ExtractRows moves rows, and it takes
  // the snapshot's copy first).
  void KeySnapshot(Stripe& stripe, StripeSnapshot& snap) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(stripe.mu);
  int StripeOf(uint64_t key) const;
  // The row block of `slot` (in use): dim weights, the optimizer state, then
  // the 64-bit update count in the next two floats' bytes.
  float* Row(const Stripe& stripe, uint32_t slot) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(stripe.mu);
  // The key of `slot` (in use).
  uint64_t& KeyOf(const Stripe& stripe, uint32_t slot) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(stripe.mu);
  // The slots of `stripe` whose rows `take` chooses, lowest first (asked
  // one chunk of keys at a time).
  std::vector<uint32_t> ChosenSlots(const Stripe& stripe,
                                    const KeySelector& take) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(stripe.mu);
  // Adds a slot for `key`, which `stripe` does not hold, its row not yet
  // written, and returns it.
  uint32_t AddSlot(Stripe& stripe, uint64_t key)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(stripe.mu);
  // Adds the initialised row of `key`, which `stripe` does not hold, and
  // returns its slot.
  uint32_t CreateRow(Stripe& stripe, uint64_t key)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(stripe.mu);
  // Whether the table is large enough for prefetching to pay (judged from
  // `stripe`).
  bool WorthPrefetching(const Stripe& stripe) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(stripe.mu);
  // Sets slots[j] to the slot of keys[j] for j < count, creating missing
  // rows, with the index prefetched ahead.
  void LocateRows(Stripe& stripe, const uint64_t* keys, uint32_t count,
                  uint32_t* slots) ABSL_EXCLUSIVE_LOCKS_REQUIRED(stripe.mu);
  // A request's keys grouped by stripe, with their rows' slots, kept for
  // the next request of the same keys (sparse_table.cc).
  struct KeyPlan;
  // Calls fn(stripe, order, slots, count) under the lock of each stripe
  // that `keys` touch, for its `count` keys: order[j] is the index in
  // `keys` of its j-th key, slots[j] that key's slot (missing rows
  // created). A request of the keys of a recent one (in the same order)
  // reuses its plan; `in_two`: grouped by two threads (ForEachStripeGroup).
  template <typename Fn>
  void ForEachLocatedGroup(std::span<const uint64_t> keys, bool in_two, Fn fn);
  // The plan kept for `keys` (null: none); `sample`: SampleOf(keys).
  std::shared_ptr<const KeyPlan> FindPlan(std::span<const uint64_t> keys,
                                          uint64_t sample);
  // Whether to keep the plan of a request found in none, by its sample
  // (sparse_table.cc: kPlanMaxCredit).
  bool PlanWanted(uint64_t sample);
  // Keeps `plan`, dropping the least recently used plans past the budget.
  void KeepPlan(std::shared_ptr<const KeyPlan> plan, uint64_t sample);
  // Push without HoldPushes' check: the steps themselves.
  void ApplyPush(std::span<const uint64_t> keys, std::span<const float> grads,
                 float step_scale);
  struct HeldPush;
  // Appends the rows of `keys` (and their gradients) that held_ names to
  // `held`, the others to `other`.
  void SplitHeld(std::span<const uint64_t> keys, std::span<const float> grads,
                 HeldPush* held, HeldPush* other) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(hold_mu_);

  const TableConfig config_;
  const std::unique_ptr<Optimizer> optimizer_;
  const uint64_t state_width_;
  // Floats per row block, even so that the update count stays aligned.
  const uint64_t row_stride_;
  // Rows are stored in chunks of 2^chunk_shift_ (about 1 MiB each).
  const uint32_t chunk_shift_;
  std::vector<std::unique_ptr<Stripe>> stripes_;

  // HoldPushes: the keys held, and per push that met them, their gradient
  // rows set aside, in the order they came. `holding_` is set while
  // `held_` is, so Push takes hold_mu_ only during a move.
  struct HeldPush {
    explicit HeldPush(float scale) : step_scale(scale) {}
    std::vector<uint64_t> keys;
    std::vector<float> grads;
    float step_scale;
  };
  // The plans kept, each with when it was last used (plan_uses_), and
  // what it is looked up by beside it: a lookup reads the list in order,
  // not each plan (a table may keep a thousand).
  struct KeptPlan {
    uint64_t sample = 0;  // the plan's
    size_t keys = 0;      // its number of keys
    std::shared_ptr<const KeyPlan> plan;
    uint64_t used = 0;
  };
  mutable absl::Mutex plans_mu_;
  std::vector<KeptPlan> plans_ ABSL_GUARDED_BY(plans_mu_);
  uint64_t planned_keys_ ABSL_GUARDED_BY(plans_mu_) = 0;
  uint64_t plan_uses_ ABSL_GUARDED_BY(plans_mu_) = 0;
  uint32_t plan_credit_ ABSL_GUARDED_BY(plans_mu_) = 0;
  PlanCounts plan_counts_ ABSL_GUARDED_BY(plans_mu_);
  // xorshift64 state: PlanWanted's one-in-16 draws.
  uint64_t plan_draw_ ABSL_GUARDED_BY(plans_mu_) = 0x9e3779b97f4a7c15;
  // The samples of the last requests that found no plan while the table
  // had no credit, oldest overwritten first: one seen again keeps its plan.
  std::array<uint64_t, 16> unplanned_ ABSL_GUARDED_BY(plans_mu_) = {};
  uint32_t next_unplanned_ ABSL_GUARDED_BY(plans_mu_) = 0;

  mutable absl::Mutex hold_mu_;
  std::function<bool(uint64_t)> held_ ABSL_GUARDED_BY(hold_mu_);
  std::vector<HeldPush> held_pushes_ ABSL_GUARDED_BY(hold_mu_);
  std::atomic<bool> holding_{false};

 public:
  class Snapshot {
   public:
    ~Snapshot();
    Snapshot(const Snapshot&) = delete;
    Snapshot& operator=(const Snapshot&) = delete;
    // Calls `fn(key, weights, state, update_count)` for every row as it was
    // at the snapshot, chunk by chunk: each chunk is copied under its
    // stripe's lock (unless a write copied it first) and visited without
    // it, then its copy freed. Call it once.
    void ForEachRow(
        const std::function<void(uint64_t, std::span<const float>,
                                 std::span<const float>, uint64_t)>& fn);

   private:
    friend class SparseTable;
    explicit Snapshot(SparseTable* table);
    SparseTable* const table_;
    std::vector<StripeSnapshot> stripes_;
  };
};

}  // namespace hetps
