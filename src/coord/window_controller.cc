#include "coord/window_controller.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace hetps {
namespace {

constexpr uint64_t kMinPushesPerPeriod = 4;
constexpr double kSspWaitTimeShare = 0.05;
constexpr double kEmptyShare = 0.4;
constexpr double kTimeBoundShare = 0.5;

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
    total.ssp_wait_s += st.ssp_wait_seconds();
    total.applies += st.applies();
    total.applies_by_time += st.applies_by_time();
  }
  return total;
}

WindowSignals SignalsSince(const WindowSignals& total,
                           const WindowSignals& last) {
  if (total.pushes < last.pushes) return total;
  return {.pushes = total.pushes - last.pushes,
          .pushes_into_empty = total.pushes_into_empty - last.pushes_into_empty,
          .pulls = total.pulls - last.pulls,
          .ssp_waits = total.ssp_waits - last.ssp_waits,
          .ssp_wait_s = total.ssp_wait_s - last.ssp_wait_s,
          .worker_s = total.worker_s - last.worker_s,
          .applies = total.applies - last.applies,
          .applies_by_time = total.applies_by_time - last.applies_by_time};
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

std::optional<WindowVerdict> JudgeWindow(const WindowSignals& period) {
  if (period.pushes < kMinPushesPerPeriod) return std::nullopt;
  const double waits =
      period.worker_s > 0 ? period.ssp_wait_s / period.worker_s : 0.0;
  const double empty = Share(period.pushes_into_empty, period.pushes);
  const double by_time = Share(period.applies_by_time, period.applies);
  if (waits > kSspWaitTimeShare) {
    return WindowVerdict{
        .grow = true,
        .reason = absl::StrFormat(
            "too small: workers spent %.0f%% of their time held at the "
            "staleness bound (%d of %d pulls waited)",
            100 * waits, period.ssp_waits, period.pulls)};
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
  return std::nullopt;
}

std::optional<WindowChange> WindowController::Adjust(
    const WindowSignals& period) {
  std::optional<WindowVerdict> verdict = JudgeWindow(period);
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
