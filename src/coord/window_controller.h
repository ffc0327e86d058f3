// WindowController: the semi_async window (SPEC §2, DESIGN.md). Lives in the
// coordinator; the servers' Aggregators apply what it decides.
//
// Initial window: sum(throughput) / min(throughput), rounded, when every
// worker's throughput is known (3 × 1000 + 7 × 300 samples/s → 17), else
// 2 × workers; a configured `window` > 0 wins; clamped to
// [semi_async.window_min, window_max].
//
// Adaptation: every semi_async.adapt_every_s the coordinator sums the
// servers' queue statistics over the period (WindowSignals) and calls
// Adjust. The rules, in order:
//   - workers held at the staleness bound for more than 5% of their time
//     (ssp_wait_s over the period's worker-seconds), or the queue usually
//     empty — more than 40% of the pushes found it empty — means the window
//     is too small: grow by half (at least 1). (A pull that waits a moment
//     costs nothing worth a larger window: a larger window means staler
//     gradients and fewer, larger updates.)
//   - the queue keeps growing: more than half of the applies came from the
//     time bound (the queue never reached the window), so the window is too
//     large: shrink by a quarter (at least 1);
//   - otherwise keep it.
// A period with fewer than 4 pushes says nothing and changes nothing. Every
// change returns its reason, which the coordinator logs and shows in
// status.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "hetps.pb.h"
#include "hetps/config.h"

namespace hetps {

// The servers' queue statistics over one period (differences of their
// counters, summed over servers).
struct WindowSignals {
  uint64_t pushes = 0;
  uint64_t pushes_into_empty = 0;
  uint64_t pulls = 0;
  uint64_t ssp_waits = 0;
  double ssp_wait_s = 0;  // time pulls spent held by the bound
  double worker_s = 0;    // period length × live workers
  uint64_t applies = 0;
  uint64_t applies_by_time = 0;
};

// What the rules say about one period: the window should grow (or
// shrink), and why ("too small: ...", "too large: ...").
struct WindowVerdict {
  bool grow = false;
  std::string reason;
};

// The rules above on `period`; nullopt: keep the window (or too few pushes
// to say). The diagnostics (diagnostics.h) use the same judgement.
std::optional<WindowVerdict> JudgeWindow(const WindowSignals& period);

struct WindowChange {
  uint32_t from = 0;
  uint32_t to = 0;
  std::string reason;
};

// The initial window for `config` given each worker's throughput (samples/s;
// 0 = unknown).
uint32_t InitialWindow(const JobConfig& config,
                       const std::vector<double>& throughputs);

// The throughputs known before training: the emulated profiles' (0 for a
// worker without one).
std::vector<double> ProfiledThroughputs(const JobConfig& config);

// The servers' queue counters, summed over the servers that answered
// (`servers[s]` empty: unreachable). worker_s is left 0.
WindowSignals SumSignals(
    const std::vector<std::optional<rpc::TableInfoResponse>>& servers);

// The period between two sums: `total` − `last`, field by field; a server
// that restarted counts from zero again, so when the pushes went down the
// period is `total` itself.
WindowSignals SignalsSince(const WindowSignals& total,
                           const WindowSignals& last);

// Per worker, the staleness of its latest push: the largest any server
// reports.
std::map<uint32_t, uint64_t> LatestStaleness(
    const std::vector<std::optional<rpc::TableInfoResponse>>& servers);

class WindowController {
 public:
  WindowController(const SemiAsyncConfig& config, uint32_t initial);

  uint32_t window() const { return window_; }

  // Applies the rules above; returns the change, if any.
  std::optional<WindowChange> Adjust(const WindowSignals& period);

 private:
  const SemiAsyncConfig config_;
  uint32_t window_;
};

}  // namespace hetps
