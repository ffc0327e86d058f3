#include "server/aggregator.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <limits>
#include <map>
#include <set>
#include <string>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/mutex.h"
#include "common/logging.h"

namespace hetps {
namespace {

// How often a waiting pull looks at its cancellation (and semi_async's time
// bound) when nothing wakes it.
constexpr absl::Duration kPollEvery = absl::Milliseconds(20);

// Live-set bookkeeping shared by the modes.
class LiveSet {
 public:
  explicit LiveSet(uint32_t num_workers) {
    for (uint32_t w = 0; w < num_workers; ++w) live_.insert(w);
  }
  // Returns true when the update was newer and applied.
  bool Update(uint64_t epoch, const std::vector<uint32_t>& live) {
    if (epoch <= epoch_) return false;
    epoch_ = epoch;
    live_ = std::set<uint32_t>(live.begin(), live.end());
    return true;
  }
  bool Contains(uint32_t w) const { return live_.contains(w); }
  const std::set<uint32_t>& workers() const { return live_; }
  uint64_t epoch() const { return epoch_; }

  // Clocks: pushes received per worker (live or not).
  // Returns true when the clock of `w` grew.
  bool NoteClock(uint32_t w, uint64_t clock) {
    uint64_t& c = clocks_[w];
    if (clock <= c) return false;
    c = clock;
    return true;
  }
  uint64_t ClockOf(uint32_t w) const {
    auto it = clocks_.find(w);
    return it == clocks_.end() ? 0 : it->second;
  }
  // The smallest clock among live workers other than `except` (0 when
  // there is none).
  uint64_t SlowestLiveClock(
      uint32_t except = std::numeric_limits<uint32_t>::max()) const {
    uint64_t slowest = std::numeric_limits<uint64_t>::max();
    for (uint32_t w : live_) {
      if (w != except) slowest = std::min(slowest, ClockOf(w));
    }
    return slowest == std::numeric_limits<uint64_t>::max() ? 0 : slowest;
  }
  void FillClocks(AggregatorStats* stats) const {
    for (const auto& [w, c] : clocks_) {
      rpc::WorkerClock* out = stats->add_clocks();
      out->set_worker(w);
      out->set_clock(c);
    }
  }

 private:
  uint64_t epoch_ = 0;
  std::set<uint32_t> live_;
  std::map<uint32_t, uint64_t> clocks_;
};

// Gradients of several pushes merged: per key (and per dense table) the sum
// of weight · batch · gradient, with Σ weight · batch and Σ batch behind it.
// Apply() hands the tables the weighted mean gradient and takes
// Σ weight · batch / Σ batch of a full optimizer step with it, so that a
// weight below 1 shortens the step under every optimizer (see
// Optimizer::Update: adagrad and adam would undo a weight put on the
// gradient alone).
class GradientSum {
 public:
  // `weight` in (0, 1]: 1 for a fresh gradient, less for a stale one.
  void Add(const PushView& push, float weight) {
    total_batch_ += push.batch_size;
    weighted_batch_ += static_cast<double>(weight) * push.batch_size;
    const float w = weight * static_cast<float>(push.batch_size);
    for (const auto& s : push.sparse) {
      Sparse& sum = sparse_[s.table];
      const uint64_t dim = s.table->dim();
      sum.index.reserve(sum.index.size() + s.keys.size());
      for (size_t i = 0; i < s.keys.size(); ++i) {
        auto [it, inserted] = sum.index.try_emplace(
            s.keys[i], static_cast<uint32_t>(sum.keys.size()));
        if (inserted) {
          sum.keys.push_back(s.keys[i]);
          sum.values.resize(sum.values.size() + dim, 0.0f);
        }
        float* dst = &sum.values[static_cast<size_t>(it->second) * dim];
        const float* src = &s.grads[i * dim];
        for (uint64_t j = 0; j < dim; ++j) dst[j] += w * src[j];
      }
    }
    for (const auto& d : push.dense) {
      std::vector<float>& sum = dense_[d.table];
      sum.resize(d.grads.size(), 0.0f);
      for (size_t j = 0; j < d.grads.size(); ++j) sum[j] += w * d.grads[j];
    }
  }

  uint64_t total_batch() const { return total_batch_; }

  // Applies the merged gradient to the tables.
  void Apply() {
    if (total_batch_ == 0) return;
    const float mean = MeanScale();
    const float step = StepScale();
    for (auto& [table, sum] : sparse_) {
      for (float& v : sum.values) v *= mean;
      table->Push(sum.keys, sum.values, step);
    }
    for (auto& [table, sum] : dense_) {
      for (float& v : sum) v *= mean;
      table->Push(sum, step);
    }
  }

  // The rows of `keys` as Apply() would leave them if it took `share` (in
  // (0, 1]) of its step; the tables unchanged. Rows without a gradient here
  // are read as they are.
  void PullAhead(SparseTable* table, std::span<const uint64_t> keys,
                 float share, std::span<float> out) const {
    auto it = sparse_.find(table);
    if (total_batch_ == 0 || it == sparse_.end()) {
      table->Pull(keys, out);
      return;
    }
    const Sparse& sum = it->second;
    const uint64_t dim = table->dim();
    const float mean = MeanScale();
    std::vector<float> grads;
    std::vector<uint32_t> found(keys.size(), kNone);
    for (size_t i = 0; i < keys.size(); ++i) {
      auto at = sum.index.find(keys[i]);
      if (at == sum.index.end()) continue;
      found[i] = static_cast<uint32_t>(grads.size() / dim);
      const float* src = &sum.values[static_cast<size_t>(at->second) * dim];
      for (uint64_t j = 0; j < dim; ++j) grads.push_back(mean * src[j]);
    }
    std::vector<const float*> ahead(keys.size(), nullptr);
    for (size_t i = 0; i < keys.size(); ++i) {
      if (found[i] != kNone) ahead[i] = &grads[size_t{found[i]} * dim];
    }
    table->PullAhead(keys, ahead, share * StepScale(), out);
  }

  void PullAhead(DenseTable* table, float share, std::span<float> out) const {
    auto it = dense_.find(table);
    if (total_batch_ == 0 || it == dense_.end()) {
      table->Pull(out);
      return;
    }
    std::vector<float> grad(it->second);
    for (float& v : grad) v *= MeanScale();
    table->PullAhead(grad, share * StepScale(), out);
  }

 private:
  static constexpr uint32_t kNone = std::numeric_limits<uint32_t>::max();

  float MeanScale() const { return static_cast<float>(1.0 / weighted_batch_); }
  float StepScale() const {
    return static_cast<float>(weighted_batch_ /
                              static_cast<double>(total_batch_));
  }

  struct Sparse {
    absl::flat_hash_map<uint64_t, uint32_t> index;  // key → row in values
    std::vector<uint64_t> keys;
    std::vector<float> values;  // row-major
  };
  uint64_t total_batch_ = 0;
  double weighted_batch_ = 0;
  std::map<SparseTable*, Sparse> sparse_;
  std::map<DenseTable*, std::vector<float>> dense_;
};

class AsyncAggregator final : public Aggregator {
 public:
  explicit AsyncAggregator(uint32_t num_workers) : live_(num_workers) {}

  absl::Status Push(const PushView& push) override {
    absl::ReaderMutexLock applying(&apply_mu_);
    {
      absl::MutexLock lock(&mu_);
      auto [it, inserted] = next_clock_.try_emplace(push.worker_id, 0);
      // Pushes of one worker are serialized by its client, so a clock below
      // the next expected one is a retry of a push that already arrived.
      if (!inserted && push.clock < it->second) return absl::OkStatus();
      it->second = push.clock + 1;
      live_.NoteClock(push.worker_id, push.clock + 1);
    }
    for (const auto& s : push.sparse) s.table->Push(s.keys, s.grads);
    for (const auto& d : push.dense) d.table->Push(d.grads);
    applied_.fetch_add(1, std::memory_order_relaxed);
    return absl::OkStatus();
  }

  absl::Status AwaitPull(uint32_t, uint64_t, absl::Time,
                         const std::function<bool()>&) override {
    pulls_.fetch_add(1, std::memory_order_relaxed);
    return absl::OkStatus();
  }

  void UpdateMembership(uint64_t epoch,
                        const std::vector<uint32_t>& live) override {
    absl::MutexLock lock(&mu_);
    live_.Update(epoch, live);
  }

  uint64_t applied_rounds() const override {
    return applied_.load(std::memory_order_relaxed);
  }

  uint64_t RejoinClock(uint32_t worker) const override {
    absl::MutexLock lock(&mu_);
    auto it = next_clock_.find(worker);
    return it == next_clock_.end() ? 0 : it->second;
  }

  void RunBetweenApplies(const std::function<void(uint64_t)>& fn) override {
    absl::WriterMutexLock exclusive(&apply_mu_);
    fn(applied_rounds());
  }

  AggregatorStats Stats() const override {
    AggregatorStats stats;
    stats.set_pushes(applied_.load(std::memory_order_relaxed));
    stats.set_applies(stats.pushes());
    stats.set_pulls(pulls_.load(std::memory_order_relaxed));
    absl::MutexLock lock(&mu_);
    live_.FillClocks(&stats);
    return stats;
  }

 private:
  // Pushes apply concurrently (shared); RunBetweenApplies is exclusive.
  absl::Mutex apply_mu_;
  mutable absl::Mutex mu_;
  absl::flat_hash_map<uint32_t, uint64_t> next_clock_ ABSL_GUARDED_BY(mu_);
  LiveSet live_ ABSL_GUARDED_BY(mu_);
  std::atomic<uint64_t> applied_{0};
  std::atomic<uint64_t> pulls_{0};
};

class SyncAggregator final : public Aggregator {
 public:
  SyncAggregator(uint32_t num_workers, Clock& clock)
      : clock_(clock), live_(num_workers) {}

  absl::Status Push(const PushView& push) override {
    absl::MutexLock lock(&mu_);
    if (push.clock < applied_) {
      if (rounds_seen_.contains({push.clock, push.worker_id})) {
        return absl::OkStatus();  // retry of a push already applied
      }
      return absl::FailedPreconditionError(
          absl::StrCat("push of worker ", push.worker_id, " for round ",
                       push.clock, " arrived after that round was applied (",
                       applied_, " rounds applied)"));
    }
    if (!live_.Contains(push.worker_id)) {
      return absl::FailedPreconditionError(absl::StrCat(
          "worker ", push.worker_id,
          " is not in the live set (membership epoch ", live_.epoch(), ")"));
    }
    Round& round = rounds_[push.clock];
    if (!round.contributors.insert(push.worker_id).second) {
      return absl::OkStatus();  // retry of a push already queued
    }
    round.sum.Add(push, 1.0f);
    ++pushes_;
    live_.NoteClock(push.worker_id, push.clock + 1);
    rounds_seen_.insert({push.clock, push.worker_id});
    CloseReadyRounds();
    return absl::OkStatus();
  }

  absl::Status AwaitPull(uint32_t worker_id, uint64_t clock,
                         absl::Time deadline,
                         const std::function<bool()>& cancelled) override {
    absl::MutexLock lock(&mu_);
    ++pulls_;
    if (live_.NoteClock(worker_id, clock)) CloseReadyRounds();
    while (applied_ < clock) {
      if (cancelled && cancelled()) {
        return absl::CancelledError("pull cancelled by the caller");
      }
      if (clock_.Now() >= deadline) {
        return absl::DeadlineExceededError(
            absl::StrCat("pull of worker ", worker_id, " at clock ", clock,
                         ": round ", applied_, " still waits for workers [",
                         absl::StrJoin(MissingWorkers(), ","), "]"));
      }
      // Wake up now and then to notice cancellation.
      clock_.WaitUntil(round_closed_, mu_,
                       std::min(deadline, clock_.Now() + kPollEvery));
    }
    return absl::OkStatus();
  }

  void UpdateMembership(uint64_t epoch,
                        const std::vector<uint32_t>& live) override {
    absl::MutexLock lock(&mu_);
    if (live_.Update(epoch, live)) CloseReadyRounds();
  }

  uint64_t applied_rounds() const override {
    absl::MutexLock lock(&mu_);
    return applied_;
  }

  uint64_t RejoinClock(uint32_t) const override {
    absl::MutexLock lock(&mu_);
    return applied_;
  }

  void RunBetweenApplies(const std::function<void(uint64_t)>& fn) override {
    absl::MutexLock lock(&mu_);
    fn(applied_);
  }

  AggregatorStats Stats() const override {
    absl::MutexLock lock(&mu_);
    AggregatorStats stats;
    stats.set_pushes(pushes_);
    stats.set_applies(applied_);
    stats.set_applies_by_all(applied_);
    stats.set_pulls(pulls_);
    stats.set_queue_length(
        rounds_.empty() ? 0 : rounds_.begin()->second.contributors.size());
    live_.FillClocks(&stats);
    return stats;
  }

 private:
  struct Round {
    std::set<uint32_t> contributors;
    GradientSum sum;
  };

  std::vector<uint32_t> MissingWorkers() const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    std::vector<uint32_t> missing;
    auto it = rounds_.find(applied_);
    for (uint32_t w : live_.workers()) {
      if (it == rounds_.end() || !it->second.contributors.contains(w)) {
        missing.push_back(w);
      }
    }
    return missing;
  }

  // Applies, in order, every round that every live worker has moved past
  // (its clock, from pushes and pulls, is beyond the round). A round nobody
  // pushed here closes empty: this server restarted from a checkpoint and
  // its workers are further on (see aggregator.h). With nobody live, the
  // rounds already pushed are applied: their workers left after pushing.
  // Applying under the lock is deliberate: in sync mode nobody may proceed
  // before the round is in the tables anyway.
  void CloseReadyRounds() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    const uint64_t first = applied_;
    uint64_t empty = 0;
    while (true) {
      auto it = rounds_.find(applied_);
      const bool past = live_.workers().empty()
                            ? it != rounds_.end()
                            : live_.SlowestLiveClock() > applied_;
      if (!past) break;
      if (it != rounds_.end()) {
        it->second.sum.Apply();
        rounds_.erase(it);
      } else {
        ++empty;
      }
      ++applied_;
    }
    if (applied_ == first) return;
    if (empty > 0) {
      spdlog::warn(
          "sync: {} of rounds {}..{} had no pushes on this server (it "
          "restarted from a checkpoint while the workers went on): closed "
          "empty",
          empty, first, applied_ - 1);
    }
    // Forget dedup records older than the last applied round: a retry can
    // only repeat a push whose reply was lost, i.e. one of the latest round.
    rounds_seen_.erase(rounds_seen_.begin(),
                       rounds_seen_.lower_bound({applied_ - 1, 0}));
    round_closed_.SignalAll();
  }

  Clock& clock_;
  mutable absl::Mutex mu_;
  absl::CondVar round_closed_;
  LiveSet live_ ABSL_GUARDED_BY(mu_);
  uint64_t applied_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t pushes_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t pulls_ ABSL_GUARDED_BY(mu_) = 0;
  // clock → pending round
  std::map<uint64_t, Round> rounds_ ABSL_GUARDED_BY(mu_);
  // (round, worker) of pushes taken, kept one round back for retries
  std::set<std::pair<uint64_t, uint32_t>> rounds_seen_ ABSL_GUARDED_BY(mu_);
};

// semi_async: the GradientQueue, its three triggers and the SSP bound (see
// aggregator.h). Everything happens under one mutex: a push merges into the
// queue and, when a trigger fires, applies it before returning, so a pull
// that follows a push always sees the queue either merged or applied.
class SemiAsyncAggregator final : public Aggregator {
 public:
  SemiAsyncAggregator(uint32_t num_workers, SemiAsyncOptions options,
                      Clock& clock)
      : options_(std::move(options)),
        clock_(clock),
        min_apply_batch_(static_cast<uint64_t>(
            std::ceil(options_.config.min_apply_fraction *
                      static_cast<double>(options_.job_batch)))),
        window_(std::max<uint32_t>(1, options_.window)),
        live_(num_workers) {}

  absl::Status Push(const PushView& push) override {
    absl::MutexLock lock(&mu_);
    // A worker's pushes are serialized by its client: a clock below the
    // one already seen is a retry whose first reply was lost.
    if (push.clock < live_.ClockOf(push.worker_id)) return absl::OkStatus();
    FlushIfOld();
    live_.NoteClock(push.worker_id, push.clock + 1);
    WorkerRecord& record = records_[push.worker_id];
    // Applies the gradient's parameters lack: the push goes into apply
    // applied_ + 1, computed on parameters of version seen_version (a pull
    // read ahead of the queue saw the version it anticipated).
    const uint64_t staleness =
        applied_ - std::min(applied_, record.seen_version);
    record.last_staleness = staleness;
    stats_.set_staleness_sum(stats_.staleness_sum() + staleness);
    stats_.set_max_staleness(std::max(stats_.max_staleness(), staleness));
    stats_.set_pushes(stats_.pushes() + 1);
    if (queued_ == 0) {
      stats_.set_pushes_into_empty(stats_.pushes_into_empty() + 1);
      oldest_ = clock_.Now();
    }
    const double weight =
        1.0 / (1.0 + options_.config.staleness_decay * staleness);
    queue_.Add(push, static_cast<float>(weight));
    ++queued_;
    contributors_.insert(push.worker_id);
    if (queued_ >= window_) {
      stats_.set_applies_by_window(stats_.applies_by_window() + 1);
      ApplyQueue();
    } else if (AllLiveContributed() && HoldsEnough()) {
      stats_.set_applies_by_all(stats_.applies_by_all() + 1);
      ApplyQueue();
    }
    advanced_.SignalAll();
    return absl::OkStatus();
  }

  absl::Status AwaitPull(uint32_t worker_id, uint64_t clock,
                         absl::Time deadline,
                         const std::function<bool()>& cancelled) override {
    absl::MutexLock lock(&mu_);
    stats_.set_pulls(stats_.pulls() + 1);
    live_.NoteClock(worker_id, clock);
    const absl::Time start = clock_.Now();
    bool waited = false;
    while (true) {
      FlushIfOld();
      const uint64_t slowest = live_.SlowestLiveClock();
      // A worker outside the live set (it left, or is rejoining) is not held:
      // nobody would count it as the slowest either.
      if (!live_.Contains(worker_id) || clock <= slowest + window_) break;
      if (!waited) stats_.set_ssp_waits(stats_.ssp_waits() + 1);
      waited = true;
      if (cancelled && cancelled()) {
        return absl::CancelledError("pull cancelled by the caller");
      }
      if (clock_.Now() >= deadline) {
        AddWaitSince(start);
        return absl::DeadlineExceededError(
            absl::StrCat("pull of worker ", worker_id, " at clock ", clock,
                         " waits for the slowest live worker (clock ", slowest,
                         ", window ", window_, ")"));
      }
      // Wake up now and then to notice cancellation and the time bound.
      clock_.WaitUntil(advanced_, mu_,
                       std::min(deadline, clock_.Now() + kPollEvery));
    }
    if (waited) AddWaitSince(start);
    if (live_.Contains(worker_id)) {
      const uint64_t slowest = live_.SlowestLiveClock();
      const uint64_t lead = clock > slowest ? clock - slowest : 0;
      stats_.set_max_pull_lead(std::max(stats_.max_pull_lead(), lead));
      if (lead > window_)
        stats_.set_bound_violations(stats_.bound_violations() + 1);
    }
    return absl::OkStatus();
  }

  void PullSparse(uint32_t worker_id, SparseTable* table,
                  std::span<const uint64_t> keys,
                  std::span<float> out) override {
    {
      absl::MutexLock lock(&mu_);
      if (ReadAhead(worker_id)) {
        // Under the lock: an apply between reading the queue and the rows
        // would count the queue twice.
        queue_.PullAhead(table, keys, AheadShare(), out);
        return;
      }
    }
    table->Pull(keys, out);
  }

  void PullDense(uint32_t worker_id, DenseTable* table,
                 std::span<float> out) override {
    {
      absl::MutexLock lock(&mu_);
      if (ReadAhead(worker_id)) {
        queue_.PullAhead(table, AheadShare(), out);
        return;
      }
    }
    table->Pull(out);
  }

  void UpdateMembership(uint64_t epoch,
                        const std::vector<uint32_t>& live) override {
    absl::MutexLock lock(&mu_);
    if (!live_.Update(epoch, live)) return;
    // With nobody live, what is queued is all there will be.
    if (queued_ > 0 && AllLiveContributed() &&
        (live_.workers().empty() || HoldsEnough())) {
      stats_.set_applies_by_all(stats_.applies_by_all() + 1);
      ApplyQueue();
    }
    advanced_.SignalAll();
  }

  uint64_t applied_rounds() const override {
    absl::MutexLock lock(&mu_);
    return applied_;
  }

  uint64_t RejoinClock(uint32_t worker) const override {
    absl::MutexLock lock(&mu_);
    return std::max(live_.ClockOf(worker), live_.SlowestLiveClock(worker));
  }

  void RunBetweenApplies(const std::function<void(uint64_t)>& fn) override {
    absl::MutexLock lock(&mu_);
    fn(applied_);
  }

  void SetWindow(uint32_t window) override {
    absl::MutexLock lock(&mu_);
    window_ = std::max<uint32_t>(1, window);
    if (queued_ >= window_) {
      stats_.set_applies_by_window(stats_.applies_by_window() + 1);
      ApplyQueue();
    }
    advanced_.SignalAll();
  }

  AggregatorStats Stats() const override {
    absl::MutexLock lock(&mu_);
    AggregatorStats stats = stats_;
    stats.set_applies(applied_);
    stats.set_queue_length(queued_);
    stats.set_window(window_);
    live_.FillClocks(&stats);
    for (rpc::WorkerClock& c : *stats.mutable_clocks()) {
      auto it = records_.find(c.worker());
      if (it != records_.end()) c.set_last_staleness(it->second.last_staleness);
    }
    return stats;
  }

 private:
  void AddWaitSince(absl::Time start) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    stats_.set_ssp_wait_seconds(stats_.ssp_wait_seconds() +
                                absl::ToDoubleSeconds(clock_.Now() - start));
  }

  // The time bound. Checked at every push and pull (waiting pulls poll), so
  // a queue left behind by the last active worker is applied by the next
  // request; when no worker is live the queue applies at once anyway.
  void FlushIfOld() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (queued_ > 0 && clock_.Now() - oldest_ >=
                           absl::Seconds(options_.config.flush_after_s)) {
      stats_.set_applies_by_time(stats_.applies_by_time() + 1);
      ApplyQueue();
      advanced_.SignalAll();
    }
  }

  struct WorkerRecord {
    // The version its last pull showed: applies done then, plus one when
    // the pull read ahead of a non-empty queue.
    uint64_t seen_version = 0;
    uint64_t last_staleness = 0;
  };

  // Whether `worker_id`'s pull is answered ahead of the queue, and notes the
  // version it sees. Pulls of workers outside the live set (rank 0's
  // evaluator) read the tables as they are.
  bool ReadAhead(uint32_t worker_id) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    const bool live = live_.Contains(worker_id);
    const bool ahead = live && options_.config.lookahead && queued_ > 0;
    if (live) {
      records_[worker_id].seen_version = applied_ + (ahead ? 1 : 0);
      if (ahead) stats_.set_pulls_ahead(stats_.pulls_ahead() + 1);
    }
    return ahead;
  }

  // The share of its step the queue's apply takes in a read ahead: the
  // samples queued over those of the last apply (the job's batch per step
  // before the first), at most 1. A read ahead thus shows the parameters
  // as if every push were applied on arrival, with its share of a step:
  // a worker computes on every gradient the server has, the tables take
  // one merged step per apply.
  float AheadShare() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    const uint64_t expected =
        last_apply_batch_ > 0 ? last_apply_batch_ : options_.job_batch;
    if (expected == 0) return 1.0f;
    return static_cast<float>(
        std::min(1.0, static_cast<double>(queue_.total_batch()) /
                          static_cast<double>(expected)));
  }

  // The queue holds enough samples for an apply by "every live worker
  // contributed": semi_async.min_apply_fraction of the job's batch per
  // step.
  bool HoldsEnough() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return queue_.total_batch() >= min_apply_batch_;
  }

  bool AllLiveContributed() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    for (uint32_t w : live_.workers()) {
      if (!contributors_.contains(w)) return false;
    }
    return true;
  }

  void ApplyQueue() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    last_apply_batch_ = queue_.total_batch();
    queue_.Apply();
    queue_ = GradientSum();
    queued_ = 0;
    contributors_.clear();
    ++applied_;
  }

  const SemiAsyncOptions options_;
  Clock& clock_;
  const uint64_t min_apply_batch_;
  mutable absl::Mutex mu_;
  absl::CondVar advanced_;  // a clock moved, or the queue applied
  uint32_t window_ ABSL_GUARDED_BY(mu_);
  LiveSet live_ ABSL_GUARDED_BY(mu_);
  GradientSum queue_ ABSL_GUARDED_BY(mu_);    // the GradientQueue, merged
  uint64_t queued_ ABSL_GUARDED_BY(mu_) = 0;  // pushes in queue_
  std::set<uint32_t> contributors_ ABSL_GUARDED_BY(mu_);  // workers in queue_
  absl::Time oldest_ ABSL_GUARDED_BY(mu_);  // arrival of the oldest queued push
  uint64_t applied_ ABSL_GUARDED_BY(mu_) = 0;           // queue applies
  uint64_t last_apply_batch_ ABSL_GUARDED_BY(mu_) = 0;  // its samples
  std::map<uint32_t, WorkerRecord> records_ ABSL_GUARDED_BY(mu_);
  AggregatorStats stats_ ABSL_GUARDED_BY(mu_);  // counters only
};

}  // namespace

absl::StatusOr<std::unique_ptr<Aggregator>> Aggregator::Create(
    ConsistencyMode mode, uint32_t num_workers, SemiAsyncOptions semi_async,
    Clock& clock) {
  switch (mode) {
    case ConsistencyMode::kSync:
      return std::unique_ptr<Aggregator>(
          new SyncAggregator(num_workers, clock));
    case ConsistencyMode::kAsync:
      return std::unique_ptr<Aggregator>(new AsyncAggregator(num_workers));
    case ConsistencyMode::kSemiAsync:
      return std::unique_ptr<Aggregator>(
          new SemiAsyncAggregator(num_workers, std::move(semi_async), clock));
  }
  return absl::InvalidArgumentError("mode: unknown consistency mode");
}

}  // namespace hetps
