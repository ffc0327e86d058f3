#include "server/aggregator.h"

#include <algorithm>
#include <atomic>
#include <map>
#include <set>
#include <string>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/mutex.h"
#include "common/logging.h"
#include "server/aggregator_modes.h"

namespace hetps::aggregator_internal {
namespace {

class AsyncAggregator final : public Aggregator {
 public:
  explicit AsyncAggregator(uint32_t num_workers) : live_(num_workers) {}

  absl::Status Push(const PushView& push,
                    const std::function<void()>& accepted) override {
    std::vector<PullAdmitted> ready;  // let go once the apply has ended
    {
      absl::ReaderMutexLock applying(&apply_mu_);
      {
        absl::MutexLock lock(&mu_);
        auto [it, inserted] = next_clock_.try_emplace(push.worker_id, 0);
        // Pushes of one worker are serialized by its client, so a clock
        // below the next expected one is a retry of a push that already
        // arrived.
        if (!inserted && push.clock < it->second) return absl::OkStatus();
        if (auto s = live_.RefuseUnlessLive(push.worker_id); !s.ok()) {
          return s;
        }
        it->second = push.clock + 1;
        live_.NoteClock(push.worker_id, push.clock + 1);
        if (accepted) ++unapplied_[push.worker_id].pushes;
      }
      if (accepted) accepted();
      for (const auto& s : push.sparse) s.table->Push(s.keys, s.grads);
      for (const auto& d : push.dense) d.table->Push(d.grads);
      applied_.fetch_add(1, std::memory_order_relaxed);
      if (accepted) {
        absl::MutexLock lock(&mu_);
        auto it = unapplied_.find(push.worker_id);
        if (--it->second.pushes == 0) {
          ready = std::move(it->second.pulls);
          unapplied_.erase(it);
        }
      }
    }
    for (PullAdmitted& pull : ready) pull(absl::OkStatus());
    return absl::OkStatus();
  }

  // A pull waits only while its worker has pushes answered and not yet
  // applied: an apply's time, so it is not held to its deadline.
  std::optional<absl::Status> AdmitPull(PullWait wait,
                                        PullAdmitted admitted) override {
    pulls_.fetch_add(1, std::memory_order_relaxed);
    absl::MutexLock lock(&mu_);
    auto it = unapplied_.find(wait.worker_id);
    if (it == unapplied_.end()) return absl::OkStatus();
    it->second.pulls.push_back(std::move(admitted));
    return std::nullopt;
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
  // Per worker, while some of its pushes were answered before their apply
  // ended: how many, and the pulls waiting for them.
  struct Unapplied {
    uint32_t pushes = 0;
    std::vector<PullAdmitted> pulls;
  };
  absl::flat_hash_map<uint32_t, Unapplied> unapplied_ ABSL_GUARDED_BY(mu_);
  LiveSet live_ ABSL_GUARDED_BY(mu_);
  std::atomic<uint64_t> applied_{0};
  std::atomic<uint64_t> pulls_{0};
};

class SyncAggregator final : public Aggregator {
 public:
  SyncAggregator(uint32_t num_workers, const AggregatorOptions& options,
                 Clock& clock)
      : clock_(clock),
        live_(num_workers),
        full_round_(num_workers, options.job_batch),
        warmup_(options.warmup_rounds),
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
      ++pulls_;
      if (live_.NoteClock(wait.worker_id, wait.clock)) {
        CloseReadyRounds(outcomes);
      }
      now = Decide(wait);
      if (!now)
        waiting_.Add(std::move(wait), clock_.Now(), std::move(admitted));
    }
    return now;
  }

  void UpdateMembership(uint64_t epoch,
                        const std::vector<uint32_t>& live) override {
    WaitingPulls::Outcomes outcomes;
    {
      absl::MutexLock lock(&mu_);
      if (live_.Update(epoch, live)) CloseReadyRounds(outcomes);
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

  absl::Status Accept(const PushView& push, WaitingPulls::Outcomes& outcomes)
      ABSL_LOCKS_EXCLUDED(mu_) {
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
    if (auto s = live_.RefuseUnlessLive(push.worker_id); !s.ok()) return s;
    Round& round = rounds_[push.clock];
    if (!round.contributors.insert(push.worker_id).second) {
      return absl::OkStatus();  // retry of a push already queued
    }
    round.sum.Add(push, 1.0f);
    ++pushes_;
    live_.NoteClock(push.worker_id, push.clock + 1);
    rounds_seen_.insert({push.clock, push.worker_id});
    CloseReadyRounds(outcomes);
    return absl::OkStatus();
  }

  // A pull's outcome now: OK once rounds 0..clock+ahead-1 are applied (a
  // pull read ahead waits for the round of the worker's own next push).
  std::optional<absl::Status> Decide(const PullWait& wait) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (applied_ >= wait.clock + wait.ahead) return absl::OkStatus();
    if (wait.cancelled && wait.cancelled()) {
      return absl::CancelledError("pull cancelled by the caller");
    }
    if (clock_.Now() >= wait.deadline) {
      return absl::DeadlineExceededError(absl::StrCat(
          "pull of worker ", wait.worker_id, " at clock ",
          wait.clock + wait.ahead, ": round ", applied_,
          " still waits for workers [", absl::StrJoin(MissingWorkers(), ","),
          "]"));
    }
    return std::nullopt;
  }

  void DecideWaiting(WaitingPulls::Outcomes& outcomes)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    waiting_.DecideAll(
        [this](const WaitingPulls::Pull& pull)
            ABSL_NO_THREAD_SAFETY_ANALYSIS { return Decide(pull.wait); },
        outcomes);
  }

  // The timer thread: deadlines and cancellations of the waiting pulls.
  void Tick() ABSL_LOCKS_EXCLUDED(mu_) {
    WaitingPulls::Outcomes outcomes;
    {
      absl::MutexLock lock(&mu_);
      DecideWaiting(outcomes);
    }
  }

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
  // Pulls that the closed rounds let go are decided into `outcomes`.
  void CloseReadyRounds(WaitingPulls::Outcomes& outcomes)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    const uint64_t first = applied_;
    uint64_t empty = 0;
    while (true) {
      auto it = rounds_.find(applied_);
      const bool past = live_.workers().empty()
                            ? it != rounds_.end()
                            : live_.SlowestLiveClock() > applied_;
      if (!past) break;
      if (it != rounds_.end()) {
        Round& round = it->second;
        full_round_.Note(round.contributors.size(), round.contributors.size(),
                         round.sum.total_batch());
        const uint64_t samples = round.sum.total_batch();
        round.sum.Apply(full_round_.samples(),
                        warmup_.Factor(samples, full_round_.samples()));
        warmup_.Applied(samples);
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
    DecideWaiting(outcomes);
  }

  Clock& clock_;
  mutable absl::Mutex mu_;
  LiveSet live_ ABSL_GUARDED_BY(mu_);
  FullRound full_round_ ABSL_GUARDED_BY(mu_);
  Warmup warmup_ ABSL_GUARDED_BY(mu_);
  uint64_t applied_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t pushes_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t pulls_ ABSL_GUARDED_BY(mu_) = 0;
  // clock → pending round
  std::map<uint64_t, Round> rounds_ ABSL_GUARDED_BY(mu_);
  // (round, worker) of pushes taken, kept one round back for retries
  std::set<std::pair<uint64_t, uint32_t>> rounds_seen_ ABSL_GUARDED_BY(mu_);
  WaitingPulls waiting_ ABSL_GUARDED_BY(mu_);
  Ticker ticker_;  // last: stops first
};

}  // namespace

std::unique_ptr<Aggregator> NewAsyncAggregator(uint32_t num_workers) {
  return std::make_unique<AsyncAggregator>(num_workers);
}

std::unique_ptr<Aggregator> NewSyncAggregator(uint32_t num_workers,
                                              const AggregatorOptions& options,
                                              Clock& clock) {
  return std::make_unique<SyncAggregator>(num_workers, options, clock);
}

}  // namespace hetps::aggregator_internal

namespace hetps {

absl::StatusOr<std::unique_ptr<Aggregator>> Aggregator::Create(
    ConsistencyMode mode, uint32_t num_workers, AggregatorOptions options,
    Clock& clock) {
  using namespace aggregator_internal;
  switch (mode) {
    case ConsistencyMode::kSync:
      return NewSyncAggregator(num_workers, options, clock);
    case ConsistencyMode::kAsync:
      return NewAsyncAggregator(num_workers);
    case ConsistencyMode::kSemiAsync:
      return NewSemiAsyncAggregator(num_workers, std::move(options), clock);
  }
  return absl::InvalidArgumentError("mode: unknown consistency mode");
}

}  // namespace hetps
