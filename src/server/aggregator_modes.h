// The pieces the consistency modes share — the live set with every worker's
// clock, the merged gradient of several pushes — and each mode's factory,
// for Aggregator::Create. Private to src/server/.
#pragma once

#include <algorithm>
#include <cstdint>
#include <functional>
#include <limits>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <span>
#include <thread>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/clock.h"
#include "server/aggregator.h"

namespace hetps::aggregator_internal {

// How often the timer thread looks at the waiting pulls' cancellations and
// deadlines (and semi_async's time bound).
inline constexpr absl::Duration kPollEvery = absl::Milliseconds(20);

// The pulls that wait for their turn, each with its callback. A plain value
// guarded by its aggregator's mutex; the outcomes it decides are reported
// once that mutex is released (Outcomes).
class WaitingPulls {
 public:
  struct Pull {
    PullWait wait;
    // When it began to wait; a mode may move it (semi_async: a pull ahead
    // begins to wait at the bound only once its own push is in).
    absl::Time since;
    PullAdmitted admitted;
  };
  // The outcomes decided under the aggregator's mutex, reported (their
  // callbacks called) when this goes out of scope: declare it before the
  // lock, so that the lock is released first.
  class Outcomes {
   public:
    Outcomes() = default;
    Outcomes(const Outcomes&) = delete;
    Outcomes& operator=(const Outcomes&) = delete;
    ~Outcomes() {
      for (auto& [admitted, status] : decided_) admitted(std::move(status));
    }
    void Add(PullAdmitted admitted, absl::Status status) {
      decided_.emplace_back(std::move(admitted), std::move(status));
    }

   private:
    std::vector<std::pair<PullAdmitted, absl::Status>> decided_;
  };
  // A pull's outcome now, or nullopt while it waits on.
  using Decide = std::function<std::optional<absl::Status>(Pull&)>;

  void Add(PullWait wait, absl::Time since, PullAdmitted admitted) {
    pulls_.push_back({std::move(wait), since, std::move(admitted)});
  }
  bool empty() const { return pulls_.empty(); }

  // Moves every pull that `decide` gives an outcome into `out`.
  void DecideAll(const Decide& decide, Outcomes& out) {
    size_t kept = 0;
    for (Pull& pull : pulls_) {
      if (std::optional<absl::Status> status = decide(pull)) {
        out.Add(std::move(pull.admitted), *std::move(status));
      } else {
        if (&pulls_[kept] != &pull) pulls_[kept] = std::move(pull);
        ++kept;
      }
    }
    pulls_.resize(kept);
  }

 private:
  std::vector<Pull> pulls_;
};

// A thread that calls `tick` every `every` on `clock` (a FakeClock's ticks
// follow its Advance) until destroyed. Declare it last in its owner, so that
// it stops before the members `tick` uses are destroyed.
class Ticker {
 public:
  Ticker(Clock& clock, absl::Duration every, std::function<void()> tick)
      : clock_(clock), every_(every), tick_(std::move(tick)) {
    // The first tick's time is taken here, not by the thread: a FakeClock
    // moved on before the thread runs must still reach it.
    thread_ =
        std::thread([this, first = clock_.Now() + every_] { Loop(first); });
  }
  ~Ticker() {
    {
      absl::MutexLock lock(&mu_);
      stop_ = true;
      wake_.SignalAll();
    }
    thread_.join();
  }

 private:
  void Loop(absl::Time next) {
    absl::MutexLock lock(&mu_);
    while (true) {
      while (!stop_ && clock_.Now() < next) clock_.WaitUntil(wake_, mu_, next);
      if (stop_) break;
      mu_.Unlock();
      tick_();
      mu_.Lock();
      next = clock_.Now() + every_;
    }
  }

  Clock& clock_;
  const absl::Duration every_;
  const std::function<void()> tick_;
  absl::Mutex mu_;
  absl::CondVar wake_;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;
};

// Live-set bookkeeping shared by the modes. The live workers' clocks are
// also kept ordered, so that the slowest is read in constant time: every
// push and every waiting pull asks for it, hundreds of times a round with
// hundreds of workers.
class LiveSet {
 public:
  explicit LiveSet(uint32_t num_workers) {
    for (uint32_t w = 0; w < num_workers; ++w) {
      live_.insert(w);
      live_clocks_.insert(0);
    }
  }
  // Returns true when the update was newer and applied.
  bool Update(uint64_t epoch, const std::vector<uint32_t>& live) {
    if (epoch <= epoch_) return false;
    epoch_ = epoch;
    live_ = std::set<uint32_t>(live.begin(), live.end());
    live_clocks_.clear();
    for (uint32_t w : live_) live_clocks_.insert(ClockOf(w));
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
    if (live_.contains(w)) {
      live_clocks_.erase(live_clocks_.find(c));
      live_clocks_.insert(clock);
    }
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
    if (live_clocks_.empty()) return 0;
    auto slowest = live_clocks_.begin();
    // Without `except`'s own clock: the next one when it is the first (a
    // tie with another worker's leaves that one's, the same value).
    if (live_.contains(except) && *slowest == ClockOf(except)) ++slowest;
    return slowest == live_clocks_.end() ? 0 : *slowest;
  }
  // The refusal of a push from `w` when it is not live: the coordinator
  // dropped it (and handed its chunk to another worker), so what it
  // computed since is not the job's; it registers again to train on.
  absl::Status RefuseUnlessLive(uint32_t w) const {
    if (Contains(w)) return absl::OkStatus();
    return absl::FailedPreconditionError(
        absl::StrCat("worker ", w, " is not in the live set (membership epoch ",
                     epoch_, "): it was dropped and has to register again"));
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
  std::multiset<uint64_t> live_clocks_;  // ClockOf(w) for w in live_
};

// The samples of one step of the whole job: those of the last merge of one
// push from every worker of the job (a sync round, a semi_async apply);
// before the first, train.batch_size × cluster.workers. A merge of fewer
// samples because workers are missing from it — the last rounds of an
// epoch, when the workers that finished their data have left — takes that
// share of a step. (A full round with a short batch in it, where a chunk
// ended, is a full step, as a short last batch is in local training.)
class FullRound {
 public:
  FullRound(uint32_t num_workers, uint64_t job_batch)
      : num_workers_(num_workers), samples_(job_batch) {}

  // A merge of `pushes` from `contributors` distinct workers, holding
  // `samples`, is about to apply.
  void Note(uint64_t pushes, size_t contributors, uint64_t samples) {
    if (contributors >= num_workers_ && pushes == contributors && samples > 0)
      samples_ = samples;
  }
  uint64_t samples() const { return samples_; }

 private:
  const uint32_t num_workers_;
  uint64_t samples_;
};

// The warm-up of TrainConfig::warmup_rounds: the share of a step an apply
// takes while the samples applied so far are below `rounds` full rounds.
class Warmup {
 public:
  explicit Warmup(uint32_t rounds) : rounds_(rounds) {}

  // The step factor of an apply of `samples` now, a full round being
  // `full_round` samples (0: unknown, no warm-up).
  float Factor(uint64_t samples, uint64_t full_round) const {
    if (done_ || rounds_ == 0 || full_round == 0) return 1.0f;
    const double share =
        static_cast<double>(applied_ + samples) /
        (static_cast<double>(rounds_) * static_cast<double>(full_round));
    return share >= 1.0 ? 1.0f : static_cast<float>(share);
  }
  void Applied(uint64_t samples) { applied_ += samples; }
  // The tables hold trained values (restored from a checkpoint).
  void Skip() { done_ = true; }

 private:
  const uint32_t rounds_;
  uint64_t applied_ = 0;
  bool done_ = false;
};

// Gradients of several pushes merged: per key (and per dense table) the sum
// of weight · batch · gradient, with Σ weight · batch and Σ batch behind it.
// Apply() hands the tables the weighted mean gradient and takes
// Σ weight · batch / max(Σ batch, full round) of a full optimizer step
// with it, so that a weight below 1 shortens the step under every
// optimizer (see Optimizer::Update: adagrad and adam would undo a weight
// put on the gradient alone), and so does a merge smaller than a full
// round (FullRound::samples(); 0: none is).
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

  // Applies the merged gradient to the tables, its step times `factor`
  // (the warm-up's).
  void Apply(uint64_t full_round, float factor) {
    if (total_batch_ == 0) return;
    const float mean = MeanScale();
    const float step = StepScale(full_round) * factor;
    for (auto& [table, sum] : sparse_) {
      for (float& v : sum.values) v *= mean;
      table->Push(sum.keys, sum.values, step);
    }
    for (auto& [table, sum] : dense_) {
      for (float& v : sum) v *= mean;
      table->Push(sum, step);
    }
  }

  // The rows of `keys` as Apply(full_round, factor) would leave them now;
  // the tables unchanged. Rows without a gradient here are read as they are.
  void PullAhead(SparseTable* table, std::span<const uint64_t> keys,
                 uint64_t full_round, float factor,
                 std::span<float> out) const {
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
    table->PullAhead(keys, ahead, StepScale(full_round) * factor, out);
  }

  void PullAhead(DenseTable* table, uint64_t full_round, float factor,
                 std::span<float> out) const {
    auto it = dense_.find(table);
    if (total_batch_ == 0 || it == dense_.end()) {
      table->Pull(out);
      return;
    }
    std::vector<float> grad(it->second);
    for (float& v : grad) v *= MeanScale();
    table->PullAhead(grad, StepScale(full_round) * factor, out);
  }

 private:
  static constexpr uint32_t kNone = std::numeric_limits<uint32_t>::max();

  float MeanScale() const { return static_cast<float>(1.0 / weighted_batch_); }
  float StepScale(uint64_t full_round) const {
    return static_cast<float>(weighted_batch_ / static_cast<double>(std::max(
                                                    total_batch_, full_round)));
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

std::unique_ptr<Aggregator> NewAsyncAggregator(uint32_t num_workers);
std::unique_ptr<Aggregator> NewSyncAggregator(uint32_t num_workers,
                                              const AggregatorOptions& options,
                                              Clock& clock);
std::unique_ptr<Aggregator> NewSemiAsyncAggregator(uint32_t num_workers,
                                                   AggregatorOptions options,
                                                   Clock& clock);

}  // namespace hetps::aggregator_internal
