// semi_async (aggregator.h): the GradientQueue, its triggers, reads ahead of
// it and the SSP bound.
#include <algorithm>
#include <map>
#include <set>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "common/logging.h"
#include "server/aggregator_modes.h"

namespace hetps::aggregator_internal {
namespace {

// semi_async: the GradientQueue, its three triggers and the SSP bound (see
// aggregator.h). Everything happens under one mutex: a push merges into the
// queue and, when a trigger fires, applies it before returning, so a pull
// that follows a push always sees the queue either merged or applied.
class SemiAsyncAggregator final : public Aggregator {
 public:
  SemiAsyncAggregator(uint32_t num_workers, AggregatorOptions options,
                      Clock& clock)
      : options_(std::move(options)),
        clock_(clock),
        window_(std::max<uint32_t>(1, options_.window)),
        live_(num_workers),
        full_round_(num_workers, options_.job_batch),
        warmup_(options_.warmup_rounds),
        ticker_(clock, kPollEvery, [this] { Tick(); }) {}

  absl::Status Push(const PushView& push,
                    const std::function<void()>&) override {
    WaitingPulls::Outcomes outcomes;
    return Accept(push, outcomes);
  }

  std::optional<absl::Status> AdmitPull(PullWait wait,
                                        PullAdmitted admitted) override {
    WaitingPulls::Outcomes outcomes;
    std::optional<absl::Status> now;
    {
      absl::MutexLock lock(&mu_);
      stats_.set_pulls(stats_.pulls() + 1);
      FlushIfOld();
      // A pull's clock may make its worker the slowest no more.
      if (live_.NoteClock(wait.worker_id, wait.clock)) DecideWaiting(outcomes);
      now = Decide(wait, nullptr);
      // A pull ahead waiting for its worker's own push is not (yet) held
      // by the bound: its wait there starts once the push is in (Decide).
      const bool at_bound = !now ? OwnPushIn(wait) : !now->ok();
      if (at_bound) stats_.set_ssp_waits(stats_.ssp_waits() + 1);
      if (!now) {
        if (at_bound) BeginHold(wait.worker_id);
        waiting_.Add(std::move(wait),
                     at_bound ? clock_.Now() : absl::InfiniteFuture(),
                     std::move(admitted));
      }
    }
    return now;
  }

  void PullSparse(uint32_t worker_id, SparseTable* table,
                  std::span<const uint64_t> keys,
                  std::span<float> out) override {
    {
      absl::MutexLock lock(&mu_);
      if (ReadAhead(worker_id)) {
        // Under the lock: an apply between reading the queue and the rows
        // would count the queue twice.
        queue_.PullAhead(table, keys, full_round_.samples(), WarmupFactor(),
                         out);
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
        queue_.PullAhead(table, full_round_.samples(), WarmupFactor(), out);
        return;
      }
    }
    table->Pull(out);
  }

  void UpdateMembership(uint64_t epoch,
                        const std::vector<uint32_t>& live) override {
    WaitingPulls::Outcomes outcomes;
    {
      absl::MutexLock lock(&mu_);
      if (!live_.Update(epoch, live)) return;
      // With nobody live, what is queued is all there will be.
      if (queued_ > 0 && AllLiveContributed() &&
          (live_.workers().empty() || HoldsEnough())) {
        stats_.set_applies_by_all(stats_.applies_by_all() + 1);
        ApplyQueue();
      }
      DecideWaiting(outcomes);
    }
  }

  void TablesRestored() override {
    absl::MutexLock lock(&mu_);
    warmup_.Skip();
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

  void ApplyQueued() override {
    absl::MutexLock lock(&mu_);
    if (queued_ > 0) ApplyQueue();
  }

  uint32_t window() const override {
    absl::MutexLock lock(&mu_);
    return window_;
  }

  void SetWindow(uint32_t window) override {
    WaitingPulls::Outcomes outcomes;
    {
      absl::MutexLock lock(&mu_);
      window_ = std::max<uint32_t>(1, window);
      if (queued_ >= window_) {
        stats_.set_applies_by_window(stats_.applies_by_window() + 1);
        ApplyQueue();
      }
      DecideWaiting(outcomes);
    }
  }

  AggregatorStats Stats() const override {
    absl::MutexLock lock(&mu_);
    AggregatorStats stats = stats_;
    stats.set_applies(applied_);
    stats.set_queue_length(queued_);
    stats.set_window(window_);
    live_.FillClocks(&stats);
    // Holds still going count up to now: a period's difference is the time
    // held within it, not a long hold all at once when it ends.
    const absl::Time now = clock_.Now();
    for (const auto& [w, record] : records_) {
      stats.set_ssp_wait_seconds(stats.ssp_wait_seconds() +
                                 record.HeldSoFar(now));
    }
    for (rpc::WorkerClock& c : *stats.mutable_clocks()) {
      auto it = records_.find(c.worker());
      if (it == records_.end()) continue;
      const WorkerRecord& record = it->second;
      c.set_last_staleness(record.last_staleness);
      c.set_ssp_wait_seconds(record.ssp_wait_s + record.HeldSoFar(now));
    }
    return stats;
  }

 private:
  absl::Status Accept(const PushView& push, WaitingPulls::Outcomes& outcomes)
      ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    // A worker's pushes are serialized by its client: a clock below the
    // one already seen is a retry whose first reply was lost.
    if (push.clock < live_.ClockOf(push.worker_id)) return absl::OkStatus();
    if (auto s = live_.RefuseUnlessLive(push.worker_id); !s.ok()) return s;
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
        1.0 / (1.0 + options_.semi_async.staleness_decay * staleness);
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
    DecideWaiting(outcomes);
    return absl::OkStatus();
  }

  // Whether the worker's push before the pull's rows is in: always for a
  // pull at the worker's clock; a pull ahead also waits for it, so that its
  // rows hold that gradient (reading ahead costs no staleness).
  bool OwnPushIn(const PullWait& wait) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return live_.ClockOf(wait.worker_id) >= wait.clock + wait.ahead;
  }

  // A pull's outcome now: OK within the SSP bound. `since`: when a waiting
  // pull began to wait at the bound (InfiniteFuture: not yet, a pull ahead
  // whose own push is not in; set here once it is); nullptr for a pull
  // just arrived.
  std::optional<absl::Status> Decide(const PullWait& wait, absl::Time* since)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    const uint64_t slowest = live_.SlowestLiveClock();
    // A worker outside the live set (it left, or is rejoining) is not held:
    // nobody would count it as the slowest either.
    const bool live = live_.Contains(wait.worker_id);
    const uint64_t at = wait.clock + wait.ahead;
    const bool own_pushed = OwnPushIn(wait);
    const auto end_wait = [&]() ABSL_NO_THREAD_SAFETY_ANALYSIS {
      if (since && *since != absl::InfiniteFuture()) EndHold(wait.worker_id);
    };
    if (!live || (own_pushed && at <= slowest + window_)) {
      end_wait();
      if (live) {
        const uint64_t lead = at > slowest ? at - slowest : 0;
        stats_.set_max_pull_lead(std::max(stats_.max_pull_lead(), lead));
        if (lead > window_) {
          stats_.set_bound_violations(stats_.bound_violations() + 1);
        }
      }
      return absl::OkStatus();
    }
    if (wait.cancelled && wait.cancelled()) {
      end_wait();
      return absl::CancelledError("pull cancelled by the caller");
    }
    if (clock_.Now() >= wait.deadline) {
      end_wait();
      return absl::DeadlineExceededError(
          absl::StrCat("pull of worker ", wait.worker_id, " at clock ",
                       at, " waits for the slowest live worker (clock ",
                       slowest, ", window ", window_, ")"));
    }
    if (since && own_pushed && *since == absl::InfiniteFuture()) {
      // A pull ahead whose own push is in: the bound holds it from now on.
      *since = clock_.Now();
      stats_.set_ssp_waits(stats_.ssp_waits() + 1);
      BeginHold(wait.worker_id);
    }
    return std::nullopt;
  }

  void DecideWaiting(WaitingPulls::Outcomes& outcomes)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    waiting_.DecideAll(
        [this](WaitingPulls::Pull& pull) ABSL_NO_THREAD_SAFETY_ANALYSIS {
          return Decide(pull.wait, &pull.since);
        },
        outcomes);
  }

  // The timer thread: the time bound while pulls wait (as a waiting pull's
  // own polling did), their deadlines and cancellations.
  void Tick() ABSL_LOCKS_EXCLUDED(mu_) {
    WaitingPulls::Outcomes outcomes;
    {
      absl::MutexLock lock(&mu_);
      if (waiting_.empty()) return;
      FlushIfOld();
      DecideWaiting(outcomes);
    }
  }

  // A worker is held while any of its pulls is (it pulls its tables at
  // once: they wait together, and count once).
  void BeginHold(uint32_t worker_id) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    WorkerRecord& record = records_[worker_id];
    if (record.held_pulls++ == 0) record.held_since = clock_.Now();
  }

  void EndHold(uint32_t worker_id) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    WorkerRecord& record = records_[worker_id];
    if (record.held_pulls == 0 || --record.held_pulls > 0) return;
    const double s = absl::ToDoubleSeconds(clock_.Now() - record.held_since);
    stats_.set_ssp_wait_seconds(stats_.ssp_wait_seconds() + s);
    record.ssp_wait_s += s;
  }

  // The time bound. Checked at every push and pull, and by the timer thread
  // while pulls wait, so a queue left behind by the last active worker is
  // applied by the next request; when no worker is live the queue applies
  // at once anyway. (Applying the queue lets no waiting pull go: the SSP
  // bound counts clocks.)
  void FlushIfOld() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (queued_ > 0 && clock_.Now() - oldest_ >=
                           absl::Seconds(options_.semi_async.flush_after_s)) {
      stats_.set_applies_by_time(stats_.applies_by_time() + 1);
      ApplyQueue();
    }
  }

  struct WorkerRecord {
    // The version its last pull showed: applies done then, plus one when
    // the pull read ahead of a non-empty queue.
    uint64_t seen_version = 0;
    uint64_t last_staleness = 0;
    // Time held by the bound (some pull of it waiting there), ended holds;
    // held_pulls of its pulls are held now, since held_since.
    double ssp_wait_s = 0;
    uint32_t held_pulls = 0;
    absl::Time held_since;

    // The hold going on now, up to `now` (0 when none).
    double HeldSoFar(absl::Time now) const {
      return held_pulls > 0 ? absl::ToDoubleSeconds(now - held_since) : 0.0;
    }
  };

  // Whether `worker_id`'s pull is answered ahead of the queue, and notes the
  // version it sees. Pulls of workers outside the live set (rank 0's
  // evaluator) read the tables as they are.
  bool ReadAhead(uint32_t worker_id) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    const bool live = live_.Contains(worker_id);
    const bool ahead = live && options_.semi_async.lookahead && queued_ > 0;
    if (live) {
      records_[worker_id].seen_version = applied_ + (ahead ? 1 : 0);
      if (ahead) stats_.set_pulls_ahead(stats_.pulls_ahead() + 1);
    }
    return ahead;
  }

  // The queue holds enough samples for an apply by "every live worker
  // contributed": semi_async.min_apply_fraction of a full round.
  bool HoldsEnough() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return static_cast<double>(queue_.total_batch()) >=
           options_.semi_async.min_apply_fraction *
               static_cast<double>(full_round_.samples());
  }

  bool AllLiveContributed() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    for (uint32_t w : live_.workers()) {
      if (!contributors_.contains(w)) return false;
    }
    return true;
  }

  // The warm-up's factor for applying the queue as it is now.
  float WarmupFactor() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return warmup_.Factor(queue_.total_batch(), full_round_.samples());
  }

  void ApplyQueue() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    full_round_.Note(queued_, contributors_.size(), queue_.total_batch());
    queue_.Apply(full_round_.samples(), WarmupFactor());
    warmup_.Applied(queue_.total_batch());
    queue_ = GradientSum();
    queued_ = 0;
    contributors_.clear();
    ++applied_;
  }

  const AggregatorOptions options_;
  Clock& clock_;
  mutable absl::Mutex mu_;
  uint32_t window_ ABSL_GUARDED_BY(mu_);
  LiveSet live_ ABSL_GUARDED_BY(mu_);
  FullRound full_round_ ABSL_GUARDED_BY(mu_);
  Warmup warmup_ ABSL_GUARDED_BY(mu_);
  GradientSum queue_ ABSL_GUARDED_BY(mu_);    // the GradientQueue, merged
  uint64_t queued_ ABSL_GUARDED_BY(mu_) = 0;  // pushes in queue_
  std::set<uint32_t> contributors_ ABSL_GUARDED_BY(mu_);  // workers in queue_
  absl::Time oldest_ ABSL_GUARDED_BY(mu_);  // arrival of the oldest queued push
  uint64_t applied_ ABSL_GUARDED_BY(mu_) = 0;  // queue applies
  std::map<uint32_t, WorkerRecord> records_ ABSL_GUARDED_BY(mu_);
  AggregatorStats stats_ ABSL_GUARDED_BY(mu_);  // counters only
  WaitingPulls waiting_ ABSL_GUARDED_BY(mu_);
  Ticker ticker_;  // last: stops first
};

}  // namespace

std::unique_ptr<Aggregator> NewSemiAsyncAggregator(uint32_t num_workers,
                                                   AggregatorOptions options,
                                                   Clock& clock) {
  return std::make_unique<SemiAsyncAggregator>(num_workers, std::move(options),
                                               clock);
}

}  // namespace hetps::aggregator_internal
