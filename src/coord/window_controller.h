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
//   - a worker held at the staleness bound for more than 3% of the period
//     (the most-held one: the fast workers wait while the slow ones never
//     do, so an average over all would hide them), or the queue usually
//     empty — more than 40% of the pushes found it empty — means the window
//     is too small: grow by half (at least 1). (A pull that waits a moment
//     costs nothing worth a larger window: a larger window means staler
//     gradients and fewer, larger updates. 3%: a worker held longer cannot
//     be 97% busy, SPEC §2's mark for the fast workers.)
//   - the queue keeps growing: more than half of the applies came from the
//     time bound (the queue never reached the window), so the window is too
//     large: shrink by a quarter (at least 1);
//   - the live workers' clocks drift apart: the most advanced one's lead
//     over the slowest grew this period and, at that pace, reaches the
//     window within two periods — grow before the bound holds anyone.
//     (Batches sized by throughput leave clock rates a little apart —
//     whole samples, short batches where a chunk ends —, so over a long
//     job the fast workers creep ahead. After the time-bound rule: a queue
//     the time bound applies says the window is larger than the pushes
//     need, whatever the lead.)
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
  // Time each worker was held by the bound: the most any server held it
  // (its pulls wait on every server at once).
  std::map<uint32_t, double> worker_wait_s;
  double period_s = 0;
  double worker_s = 0;    // period_s × live workers
  uint64_t applies = 0;
  uint64_t applies_by_time = 0;
  // Current values, not differences: the live worker furthest ahead, its
  // lead in clocks over the slowest live one (FillLead), and how much that
  // lead grew since the last period (< 0: shrank).
  uint32_t leader = 0;
  uint64_t lead = 0;
  int64_t lead_change = 0;
};

// What the rules say about one period: the window should grow (or
// shrink), and why ("too small: ...", "too large: ...").
struct WindowVerdict {
  bool grow = false;
  std::string reason;
};

// The rules above on `period` with the window at `window`; nullopt: keep
// it (or too few pushes to say). The diagnostics (diagnostics.h) use the
// same judgement.
std::optional<WindowVerdict> JudgeWindow(const WindowSignals& period,
                                         uint32_t window);

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
// (`servers[s]` empty: unreachable). period_s and worker_s are left 0.
WindowSignals SumSignals(
    const std::vector<std::optional<rpc::TableInfoResponse>>& servers);

// The live workers' clocks as the servers saw them (each worker's largest):
// fills `signals.leader` and `signals.lead`.
void FillLead(const std::vector<std::optional<rpc::TableInfoResponse>>& servers,
              const std::vector<uint32_t>& live, WindowSignals& signals);

// The period between two sums: `total` − `last`, field by field, but the
// lead as it is now (lead_change: its growth since `last`); a server that
// restarted counts from zero again, so when the pushes went down the
// counters are `total`'s own.
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
