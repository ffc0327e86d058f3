#include "coord/diagnostics.h"

#include <algorithm>
#include <cmath>
#include <deque>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/median.h"

namespace hetps {
namespace {

constexpr double kSaturatedCpuShare = 0.9;
constexpr double kThrottledShare = 0.5;
constexpr uint64_t kMinQuotaPeriods = 5;
constexpr double kSlowShare = 0.5;
constexpr double kLabelRateGap = 0.1;
constexpr double kFeatureGap = 0.1;
constexpr uint64_t kMinShardSamples = 1000;
constexpr int kRatePeriods = 2;      // periods in a row a rate rule must hold
constexpr size_t kRateHistory = 64;  // periods of a worker's rate kept

std::string Subject(const char* role, uint32_t rank) {
  return absl::StrCat(role, " ", rank);
}

}  // namespace

void Diagnostics::Held(const std::string& kind, const std::string& subject,
                       std::string message, double now_s, int periods_needed) {
  Entry& e = entries_[{kind, subject}];
  ++e.streak;
  e.held = true;
  rpc::Diagnostic& d = e.diagnostic;
  if (!e.raised && e.streak >= periods_needed) {
    e.raised = true;
    e.order = raised_++;
    d.set_kind(kind);
    d.set_subject(subject);
    d.set_first_s(now_s);
  }
  d.set_message(std::move(message));
  d.set_last_s(now_s);
  d.set_active(true);
}

void Diagnostics::Reported(uint32_t rank, const rpc::WorkerProgress& progress,
                           double now_s) {
  for (const std::string& warning : progress.warnings()) {
    Held("over_compression", Subject("worker", rank), warning, now_s, 1);
  }
}

void Diagnostics::Observe(const DiagnosticsPeriod& p) {
  for (auto& [key, e] : entries_) {
    e.diagnostic.set_active(false);
    e.held = false;
  }
  const double dt = last_now_s_ < 0 ? 0 : p.now_s - last_now_s_;
  last_now_s_ = p.now_s;

  // Servers: CPU over the period against the CPUs they may use, and how
  // often their quota ran out.
  last_server_.resize(std::max(last_server_.size(), p.servers.size()));
  for (uint32_t s = 0; s < p.servers.size(); ++s) {
    const std::optional<DiagnosticsPeriod::Server> last = last_server_[s];
    last_server_[s] = p.servers[s];
    const auto& now = p.servers[s];
    // A restarted server counts from zero again: no period to judge.
    if (!now || !last || dt <= 0 || now->cpus <= 0 ||
        now->cpu_s < last->cpu_s || now->quota_periods < last->quota_periods) {
      continue;
    }
    const double share = (now->cpu_s - last->cpu_s) / (dt * now->cpus);
    const uint64_t periods = now->quota_periods - last->quota_periods;
    const uint64_t throttled = now->throttled_periods - last->throttled_periods;
    std::string why;
    if (share >= kSaturatedCpuShare) {
      why = absl::StrFormat("used %.0f%% of the %.2g CPUs it may use",
                            100 * share, now->cpus);
    } else if (periods >= kMinQuotaPeriods &&
               throttled >= kThrottledShare * static_cast<double>(periods)) {
      why = absl::StrFormat(
          "ran out of its CPU quota (%.2g CPUs) in %d of %d scheduler "
          "periods, using %.0f%% of it",
          now->cpus, throttled, periods, 100 * share);
    }
    if (!why.empty()) {
      Held("server_saturated", Subject("server", s),
           absl::StrFormat("%s over the last %.1f s: add servers or give "
                           "them more CPUs",
                           why, dt),
           p.now_s, kRatePeriods);
    }
  }

  // The window: the controller wants it elsewhere and it cannot move.
  if (p.window_verdict && !p.window_can_move) {
    Held(p.window_verdict->grow ? "window_too_small" : "window_too_large",
         "window",
         absl::StrCat("window ", p.window, " is ", p.window_verdict->reason,
                      "; it cannot adapt (semi_async.adapt_window off or at "
                      "window_min/window_max)"),
         p.now_s, kRatePeriods);
  }

  // Workers: throughput against what is expected.
  for (const auto& w : p.workers) {
    const rpc::WorkerProgress& g = w.progress;
    const bool trained = w.live && g.step() > last_step_[w.rank];
    last_step_[w.rank] = g.step();
    const double rate = g.compute_samples_per_s();
    if (!trained || rate <= 0) continue;
    std::deque<double>& history = rates_[w.rank];
    const double expected = w.expected_samples_per_s > 0
                                ? w.expected_samples_per_s
                                : Median({history.begin(), history.end()});
    if (expected > 0 && rate < kSlowShare * expected) {
      Held("slow_worker", Subject("worker", w.rank),
           absl::StrFormat("computes %.0f samples/s, %.0f%% of the %.0f "
                           "expected (%s)",
                           rate, 100 * rate / expected, expected,
                           w.expected_samples_per_s > 0
                               ? "its device profile"
                               : "its median earlier in the run"),
           p.now_s, kRatePeriods);
    }
    history.push_back(rate);
    if (history.size() > kRateHistory) history.pop_front();
  }

  // What they trained, against the median worker's.
  struct Shard {
    uint32_t rank;
    uint64_t samples;
    double label_rate;
    double keys_per_sample;
  };
  std::vector<Shard> shards;
  for (const auto& w : p.workers) {
    const rpc::WorkerProgress& g = w.progress;
    if (g.samples() < kMinShardSamples) continue;
    const double n = static_cast<double>(g.samples());
    shards.push_back(
        {w.rank, g.samples(), g.positives() / n, g.feature_keys() / n});
  }
  if (shards.size() < 2) return EndPeriod();
  const auto median = [&](double Shard::*field) {
    std::vector<double> v;
    for (const Shard& s : shards) v.push_back(s.*field);
    return Median(std::move(v));
  };

  const double label_rate = median(&Shard::label_rate);
  const double keys_per_sample = median(&Shard::keys_per_sample);
  for (const Shard& s : shards) {
    std::string why;
    if (std::abs(s.label_rate - label_rate) > kLabelRateGap) {
      why = absl::StrFormat(
          "label rate %.3f against the median worker's %.3f (threshold "
          "±%.2f)",
          s.label_rate, label_rate, kLabelRateGap);
    }
    if (keys_per_sample > 0 &&
        std::abs(s.keys_per_sample / keys_per_sample - 1) > kFeatureGap) {
      absl::StrAppend(
          &why, why.empty() ? "" : "; ",
          absl::StrFormat("%.2f feature keys per sample against the median "
                          "worker's %.2f (threshold ±%.0f%%)",
                          s.keys_per_sample, keys_per_sample,
                          100 * kFeatureGap));
    }
    if (!why.empty()) {
      Held("skewed_shard", Subject("worker", s.rank),
           absl::StrFormat("its %d samples differ: %s", s.samples, why),
           p.now_s, 1);
    }
  }
  EndPeriod();
}

void Diagnostics::EndPeriod() {
  // A rule that did not hold this period starts its streak again.
  for (auto& [key, e] : entries_) {
    if (!e.held) e.streak = 0;
  }
}

std::vector<rpc::Diagnostic> Diagnostics::List() const {
  std::vector<const Entry*> raised;
  for (const auto& [key, e] : entries_) {
    if (e.raised) raised.push_back(&e);
  }
  std::sort(raised.begin(), raised.end(),
            [](const Entry* a, const Entry* b) { return a->order < b->order; });
  std::vector<rpc::Diagnostic> out;
  out.reserve(raised.size());
  for (const Entry* e : raised) out.push_back(e->diagnostic);
  return out;
}

}  // namespace hetps
