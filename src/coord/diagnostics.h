// Diagnostics: the warnings of SPEC §6, raised by the coordinator from what
// its control loop sees every period (semi_async.adapt_every_s, in every
// mode) and shown in status, the dashboard, /metrics and the launch summary,
// each with the numbers behind it.
//
//   server_saturated  a server used ≥ 90% of the CPUs it may use (its
//                     affinity, lowered to its cgroup's quota), or its
//                     quota ran out in at least half of the scheduler's
//                     periods (its requests, and the workers behind them,
//                     wait out the rest of each throttled period, so it
//                     seldom uses the whole quota) → add servers, or give
//                     them CPUs.
//   window_too_small  semi_async: the WindowController's rule says grow
//   window_too_large  (queue usually empty / workers held at the bound) or
//                     shrink (the time bound applies the queue), but the
//                     window cannot move: semi_async.adapt_window is off or
//                     it sits at window_min / window_max.
//   slow_worker       a training worker's compute rate (samples per busy
//                     second) below half of what is expected of it: its
//                     device profile's throughput, else its median rate
//                     over the earlier periods (up to 64).
//   skewed_shard      what a worker trained differs from what the median
//                     worker trained: label rate by more than 0.1
//                     (absolute), or feature keys per sample by more than
//                     10%; among workers that trained ≥ 1000 samples, at
//                     least two of them. (The median, not the whole: one
//                     skewed shard moves the whole and would flag the rest
//                     with it.)
//   over_compression  a worker's own warning (PushCodec::CheckConvergence),
//                     shown from the heartbeat that carries it.
//
// Rate rules (saturation, window, slow worker) must hold in two periods in
// a row, so a burst (start-up, a checkpoint) raises nothing; the shard and
// compression rules judge cumulative numbers and hold at once. A warning
// once raised stays in the list (first and last time it held, `active`
// while it still does): the summary shows what happened during the run.
//
// Not thread-safe: the coordinator calls it under its mutex.
#pragma once

#include <cstdint>
#include <deque>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "coord/window_controller.h"
#include "hetps.pb.h"

namespace hetps {

// What one control period shows.
struct DiagnosticsPeriod {
  double now_s = 0;  // seconds since the job started
  // semi_async: the WindowController's judgement of the period, and
  // whether the window can follow it (adapting and not at the clamp).
  std::optional<WindowVerdict> window_verdict;
  bool window_can_move = true;
  uint32_t window = 0;
  struct Server {
    double cpu_s = 0;                // cumulative
    double cpus = 0;                 // it may use (affinity, cgroup quota)
    uint64_t quota_periods = 0;      // cumulative (common/cpu_limit.h)
    uint64_t throttled_periods = 0;  // cumulative
  };
  std::vector<std::optional<Server>> servers;  // by rank; nullopt: no answer
  struct Worker {
    uint32_t rank = 0;
    bool live = false;
    double expected_samples_per_s = 0;  // its profile's; 0: none
    rpc::WorkerProgress progress;
  };
  std::vector<Worker> workers;
};

class Diagnostics {
 public:
  // One control period.
  void Observe(const DiagnosticsPeriod& period);
  // A worker's heartbeat: its own warnings show at once.
  void Reported(uint32_t rank, const rpc::WorkerProgress& progress,
                double now_s);
  // Every warning raised so far, in the order raised, and their count.
  std::vector<rpc::Diagnostic> List() const;
  size_t raised() const { return raised_; }

 private:
  // Ends an Observe: rules that did not hold lose their streak.
  void EndPeriod();
  // (kind, subject) held in the period at `now_s`; `periods_needed` in a
  // row raise it.
  void Held(const std::string& kind, const std::string& subject,
            std::string message, double now_s, int periods_needed);

  struct Entry {
    rpc::Diagnostic diagnostic;
    int streak = 0;       // periods in a row it held
    bool held = false;    // in the period being observed
    bool raised = false;  // shown (streak reached the rule's need once)
    uint64_t order = 0;   // when first raised
  };
  std::map<std::pair<std::string, std::string>, Entry> entries_;
  uint64_t raised_ = 0;
  double last_now_s_ = -1;
  std::vector<std::optional<DiagnosticsPeriod::Server>> last_server_;
  std::map<uint32_t, std::deque<double>> rates_;  // by worker, per period
  std::map<uint32_t, uint64_t> last_step_;        // by worker
};

}  // namespace hetps
