#include "server/aggregator.h"

#include <algorithm>
#include <condition_variable>
#include <map>
#include <mutex>
#include <set>
#include <string>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/logging.h"

namespace hetps {
namespace {

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

 private:
  uint64_t epoch_ = 0;
  std::set<uint32_t> live_;
};

class AsyncAggregator final : public Aggregator {
 public:
  explicit AsyncAggregator(uint32_t num_workers) : live_(num_workers) {}

  absl::Status Push(const PushView& push) override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      auto [it, inserted] = next_clock_.try_emplace(push.worker_id, 0);
      // Pushes of one worker are serialized by its client, so a clock below
      // the next expected one is a retry of a push that already arrived.
      if (!inserted && push.clock < it->second) return absl::OkStatus();
      it->second = push.clock + 1;
    }
    for (const auto& s : push.sparse) s.table->Push(s.keys, s.grads);
    for (const auto& d : push.dense) d.table->Push(d.grads);
    applied_.fetch_add(1, std::memory_order_relaxed);
    return absl::OkStatus();
  }

  absl::Status AwaitPull(uint32_t, uint64_t, absl::Time,
                         const std::function<bool()>&) override {
    return absl::OkStatus();
  }

  void UpdateMembership(uint64_t epoch,
                        const std::vector<uint32_t>& live) override {
    std::lock_guard<std::mutex> lock(mu_);
    live_.Update(epoch, live);
  }

  uint64_t applied_rounds() const override {
    return applied_.load(std::memory_order_relaxed);
  }

 private:
  std::mutex mu_;
  absl::flat_hash_map<uint32_t, uint64_t> next_clock_;  // guarded by mu_
  LiveSet live_;                                        // guarded by mu_
  std::atomic<uint64_t> applied_{0};
};

class SyncAggregator final : public Aggregator {
 public:
  explicit SyncAggregator(uint32_t num_workers) : live_(num_workers) {}

  absl::Status Push(const PushView& push) override {
    std::unique_lock<std::mutex> lock(mu_);
    if (push.clock < applied_) {
      if (rounds_seen_.contains({push.clock, push.worker_id})) {
        return absl::OkStatus();  // retry of a push already applied
      }
      return absl::FailedPreconditionError(absl::StrCat(
          "push of worker ", push.worker_id, " for round ", push.clock,
          " arrived after that round was applied (", applied_,
          " rounds applied)"));
    }
    if (!live_.Contains(push.worker_id)) {
      return absl::FailedPreconditionError(
          absl::StrCat("worker ", push.worker_id,
                       " is not in the live set (membership epoch ",
                       live_.epoch(), ")"));
    }
    Round& round = rounds_[push.clock];
    if (!round.contributors.insert(push.worker_id).second) {
      return absl::OkStatus();  // retry of a push already queued
    }
    round.total_batch += push.batch_size;
    const float weight = static_cast<float>(push.batch_size);
    for (const auto& s : push.sparse) {
      SparseSum& sum = round.sparse[s.table];
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
        for (uint64_t j = 0; j < dim; ++j) dst[j] += weight * src[j];
      }
    }
    for (const auto& d : push.dense) {
      std::vector<float>& sum = round.dense[d.table];
      sum.resize(d.grads.size(), 0.0f);
      for (size_t j = 0; j < d.grads.size(); ++j) sum[j] += weight * d.grads[j];
    }
    rounds_seen_.insert({push.clock, push.worker_id});
    CloseReadyRounds();
    return absl::OkStatus();
  }

  absl::Status AwaitPull(uint32_t worker_id, uint64_t clock,
                         absl::Time deadline,
                         const std::function<bool()>& cancelled) override {
    std::unique_lock<std::mutex> lock(mu_);
    while (applied_ < clock) {
      if (cancelled && cancelled()) {
        return absl::CancelledError("pull cancelled by the caller");
      }
      if (absl::Now() >= deadline) {
        return absl::DeadlineExceededError(absl::StrCat(
            "pull of worker ", worker_id, " at clock ", clock,
            ": round ", applied_, " still waits for workers [",
            absl::StrJoin(MissingWorkers(), ","), "]"));
      }
      // Wake up periodically to notice cancellation and the deadline.
      round_closed_.wait_for(lock, std::chrono::milliseconds(50));
    }
    return absl::OkStatus();
  }

  void UpdateMembership(uint64_t epoch,
                        const std::vector<uint32_t>& live) override {
    std::lock_guard<std::mutex> lock(mu_);
    if (live_.Update(epoch, live)) CloseReadyRounds();
  }

  uint64_t applied_rounds() const override {
    std::lock_guard<std::mutex> lock(mu_);
    return applied_;
  }

 private:
  struct SparseSum {
    absl::flat_hash_map<uint64_t, uint32_t> index;  // key → row in values
    std::vector<uint64_t> keys;
    std::vector<float> values;  // Σ batch_size · gradient, row-major
  };
  struct Round {
    std::set<uint32_t> contributors;
    uint64_t total_batch = 0;
    std::map<SparseTable*, SparseSum> sparse;
    std::map<DenseTable*, std::vector<float>> dense;
  };

  // REQUIRES: mu_ held.
  std::vector<uint32_t> MissingWorkers() const {
    std::vector<uint32_t> missing;
    auto it = rounds_.find(applied_);
    for (uint32_t w : live_.workers()) {
      if (it == rounds_.end() || !it->second.contributors.contains(w)) {
        missing.push_back(w);
      }
    }
    return missing;
  }

  // Applies, in order, every round whose live workers have all contributed.
  // Applying under the lock is deliberate: in sync mode nobody may proceed
  // before the round is in the tables anyway.
  // REQUIRES: mu_ held.
  void CloseReadyRounds() {
    bool closed = false;
    for (auto it = rounds_.find(applied_); it != rounds_.end();
         it = rounds_.find(applied_)) {
      Round& round = it->second;
      const bool complete = std::all_of(
          live_.workers().begin(), live_.workers().end(),
          [&](uint32_t w) { return round.contributors.contains(w); });
      if (!complete) break;
      Apply(round);
      rounds_.erase(it);
      ++applied_;
      closed = true;
    }
    if (!closed) return;
    // Forget dedup records older than the last applied round: a retry can
    // only repeat a push whose reply was lost, i.e. one of the latest round.
    rounds_seen_.erase(rounds_seen_.begin(),
                       rounds_seen_.lower_bound({applied_ - 1, 0}));
    round_closed_.notify_all();
  }

  void Apply(Round& round) {
    if (round.total_batch == 0) return;
    const float scale = 1.0f / static_cast<float>(round.total_batch);
    for (auto& [table, sum] : round.sparse) {
      for (float& v : sum.values) v *= scale;
      table->Push(sum.keys, sum.values);
    }
    for (auto& [table, sum] : round.dense) {
      for (float& v : sum) v *= scale;
      table->Push(sum);
    }
  }

  mutable std::mutex mu_;
  std::condition_variable round_closed_;
  LiveSet live_;                          // guarded by mu_
  uint64_t applied_ = 0;                  // guarded by mu_
  std::map<uint64_t, Round> rounds_;      // clock → pending round; mu_
  // (round, worker) of pushes taken, kept one round back for retries; mu_
  std::set<std::pair<uint64_t, uint32_t>> rounds_seen_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<Aggregator>> Aggregator::Create(
    ConsistencyMode mode, uint32_t num_workers) {
  switch (mode) {
    case ConsistencyMode::kSync:
      return std::unique_ptr<Aggregator>(new SyncAggregator(num_workers));
    case ConsistencyMode::kAsync:
      return std::unique_ptr<Aggregator>(new AsyncAggregator(num_workers));
    case ConsistencyMode::kSemiAsync:
      break;
  }
  return absl::UnimplementedError(
      "mode: semi_async is not implemented yet (use sync or async)");
}

}  // namespace hetps
