#include "coord/window_controller.h"

#include <algorithm>
#include <cmath>
#include <tuple>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace hetps {
namespace {

constexpr uint64_t kMinPushesPerPeriod = 4;
constexpr double kSspWaitTimeShare = 0.03;
constexpr double kEmptyShare = 0.4;
constexpr double kTimeBoundShare = 0.5;
// A lead growing toward the window grows it this many periods ahead.
constexpr uint64_t kLeadPeriods = 2;

uint32_t Clamp(const SemiAsyncConfig& config, double window) {
  const double lo = config.window_min;
  const double hi = config.window_max;
  return static_cast<uint32_t>(std::clamp(std::round(window), lo, hi));
}

double Share(uint64_t part, uint64_t whole) {
  return whole == 0 ? 0.0 : static_cast<double>(part) / whole;
}

}  // namespace

std::vector<double> ProfiledThroughputs(const JobConfig& config) {
  std::vector<double> out(config.num_workers(), 0.0);
  for (uint32_t r = 0; r < out.size(); ++r) {
    if (const DeviceProfileConfig* p = config.ProfileOf(r)) {
      out[r] = p->throughput;
    }
  }
  return out;
}

uint32_t InitialWindow(const JobConfig& config,
                       const std::vector<double>& throughputs) {
  if (config.window > 0) return Clamp(config.semi_async, config.window);
  const bool known = !throughputs.empty() &&
                     std::all_of(throughputs.begin(), throughputs.end(),
                                 [](double t) { return t > 0; });
  if (!known) return Clamp(config.semi_async, 2.0 * config.num_workers());
  double sum = 0;
  double slowest = throughputs.front();
  for (double t : throughputs) {
    sum += t;
    slowest = std::min(slowest, t);
  }
  return Clamp(config.semi_async, sum / slowest);
}

WindowSignals SumSignals(
    const std::vector<std::optional<rpc::TableInfoResponse>>& servers) {
  WindowSignals total;
  for (const auto& info : servers) {
    if (!info) continue;
    const rpc::AggregatorStats& st = info->stats();
    total.pushes += st.pushes();
    total.pushes_into_empty += st.pushes_into_empty();
    total.pulls += st.pulls();
    total.ssp_waits += st.ssp_waits();
    total.applies += st.applies();
    total.applies_by_time += st.applies_by_time();
    for (const rpc::WorkerClock& c : st.clocks()) {
      double& held = total.worker_wait_s[c.worker()];
      held = std::max(held, c.ssp_wait_seconds());
    }
  }
  return total;
}

void FillLead(const std::vector<std::optional<rpc::TableInfoResponse>>& servers,
              const std::vector<uint32_t>& live, WindowSignals& signals) {
  std::map<uint32_t, uint64_t> clocks;
  for (uint32_t w : live) clocks[w] = 0;
  for (const auto& info : servers) {
    if (!info) continue;
    for (const rpc::WorkerClock& c : info->stats().clocks()) {
      auto it = clocks.find(c.worker());
      if (it != clocks.end()) it->second = std::max(it->second, c.clock());
    }
  }
  signals.leader = 0;
  signals.lead = 0;
  if (clocks.empty()) return;
  const auto [slowest, fastest] = std::minmax_element(
      clocks.begin(), clocks.end(),
      [](const auto& a, const auto& b) { return a.second < b.second; });
  signals.leader = fastest->first;
  signals.lead = fastest->second - slowest->second;
}

WindowSignals SignalsSince(const WindowSignals& total,
                           const WindowSignals& last) {
  const int64_t lead_change = static_cast<int64_t>(total.lead) -
                              static_cast<int64_t>(last.lead);
  if (total.pushes < last.pushes) {
    WindowSignals period = total;
    period.lead_change = lead_change;
    return period;
  }
  std::map<uint32_t, double> worker_wait_s = total.worker_wait_s;
  for (auto& [w, s] : worker_wait_s) {
    auto it = last.worker_wait_s.find(w);
    if (it != last.worker_wait_s.end()) s = std::max(0.0, s - it->second);
  }
  return {.pushes = total.pushes - last.pushes,
          .pushes_into_empty = total.pushes_into_empty - last.pushes_into_empty,
          .pulls = total.pulls - last.pulls,
          .ssp_waits = total.ssp_waits - last.ssp_waits,
          .worker_wait_s = std::move(worker_wait_s),
          .period_s = total.period_s - last.period_s,
          .worker_s = total.worker_s - last.worker_s,
          .applies = total.applies - last.applies,
          .applies_by_time = total.applies_by_time - last.applies_by_time,
          .leader = total.leader,
          .lead = total.lead,
          .lead_change = lead_change};
}

std::map<uint32_t, uint64_t> LatestStaleness(
    const std::vector<std::optional<rpc::TableInfoResponse>>& servers) {
  std::map<uint32_t, uint64_t> staleness;
  for (const auto& info : servers) {
    if (!info) continue;
    for (const rpc::WorkerClock& c : info->stats().clocks()) {
      staleness[c.worker()] =
          std::max(staleness[c.worker()], c.last_staleness());
    }
  }
  return staleness;
}

WindowController::WindowController(const SemiAsyncConfig& config,
                                   uint32_t initial)
    : config_(config), window_(Clamp(config, initial)) {}

std::optional<WindowVerdict> JudgeWindow(const WindowSignals& period,
                                         uint32_t window) {
  if (period.pushes < kMinPushesPerPeriod) return std::nullopt;
  uint32_t held = 0;
  double held_s = 0;
  for (const auto& [w, s] : period.worker_wait_s) {
    if (s > held_s) std::tie(held, held_s) = std::tie(w, s);
  }
  const double held_share = period.period_s > 0 ? held_s / period.period_s : 0;
  const double empty = Share(period.pushes_into_empty, period.pushes);
  const double by_time = Share(period.applies_by_time, period.applies);
  if (held_share > kSspWaitTimeShare) {
    double all_s = 0;
    for (const auto& [w, s] : period.worker_wait_s) all_s += s;
    const double mean = period.worker_s > 0 ? all_s / period.worker_s : 0.0;
    return WindowVerdict{
        .grow = true,
        .reason = absl::StrFormat(
            "too small: worker %d spent %.1f%% of its time held at the "
            "staleness bound (all workers %.1f%%; %d of %d pulls waited)",
            held, 100 * held_share, 100 * mean, period.ssp_waits,
            period.pulls)};
  }
  if (empty > kEmptyShare) {
    return WindowVerdict{
        .grow = true,
        .reason = absl::StrFormat(
            "too small: the queue was empty at %.0f%% of pushes (%d of %d)",
            100 * empty, period.pushes_into_empty, period.pushes)};
  }
  if (by_time > kTimeBoundShare) {
    return WindowVerdict{
        .grow = false,
        .reason = absl::StrFormat(
            "too large: the queue kept growing until the time bound applied "
            "it in %.0f%% of applies (%d of %d)",
            100 * by_time, period.applies_by_time, period.applies)};
  }
  if (period.lead_change > 0 &&
      period.lead + kLeadPeriods * static_cast<uint64_t>(period.lead_change) >=
          window) {
    return WindowVerdict{
        .grow = true,
        .reason = absl::StrFormat(
            "too small: worker %d leads the slowest live worker by %d "
            "clocks, %d more than a period ago: at that pace it reaches the "
            "window within %d periods",
            period.leader, period.lead, period.lead_change, kLeadPeriods)};
  }
  return std::nullopt;
}

std::optional<WindowChange> WindowController::Adjust(
    const WindowSignals& period) {
  std::optional<WindowVerdict> verdict = JudgeWindow(period, window_);
  if (!verdict) return std::nullopt;
  const uint32_t next =
      verdict->grow ? Clamp(config_, std::max(window_ * 1.5, window_ + 1.0))
                    : Clamp(config_, std::min(window_ * 0.75, window_ - 1.0));
  if (next == window_) return std::nullopt;
  WindowChange change{
      .from = window_, .to = next, .reason = std::move(verdict->reason)};
  window_ = next;
  return change;
}

}  // namespace hetps
