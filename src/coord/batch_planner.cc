#include "coord/batch_planner.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>

#include "absl/strings/str_format.h"

namespace hetps {

uint32_t MemoryCapBatch(double memory_mb, uint64_t bytes_per_sample) {
  if (memory_mb <= 0) return std::numeric_limits<uint32_t>::max();
  const double cap =
      memory_mb * 1024 * 1024 /
      static_cast<double>(std::max<uint64_t>(1, bytes_per_sample));
  return static_cast<uint32_t>(
      std::clamp(std::floor(cap), 0.0,
                 static_cast<double>(std::numeric_limits<uint32_t>::max())));
}

BatchPlanner::BatchPlanner(const JobConfig& config, uint64_t bytes_per_sample)
    : config_(config), bytes_per_sample_(bytes_per_sample) {}

bool BatchPlanner::NeedsReplan(
    const std::vector<WorkerCapability>& workers) const {
  if (version_ == 0 || workers.size() != planned_for_.size()) return true;
  for (size_t i = 0; i < workers.size(); ++i) {
    const WorkerCapability& now = workers[i];
    const WorkerCapability& then = planned_for_[i];
    if (now.live != then.live || now.memory_mb != then.memory_mb) return true;
    if ((now.throughput > 0) != (then.throughput > 0)) return true;
    if (then.throughput > 0 &&
        std::abs(now.throughput - then.throughput) >
            config_.planner.replan_threshold * then.throughput) {
      return true;
    }
  }
  return false;
}

bool BatchPlanner::Update(const std::vector<WorkerCapability>& workers) {
  if (!NeedsReplan(workers)) return false;
  const uint32_t base = static_cast<uint32_t>(config_.train.batch_size);
  double total_throughput = 0;
  uint32_t live = 0;
  bool all_known = true;
  for (const WorkerCapability& w : workers) {
    if (!w.live) continue;
    ++live;
    total_throughput += w.throughput;
    all_known &= w.throughput > 0;
  }
  const bool proportional =
      config_.ProportionalBatches() && live > 0 && all_known;
  std::vector<WorkerPlan> plan(workers.size());
  for (uint32_t i = 0; i < workers.size(); ++i) {
    const WorkerCapability& w = workers[i];
    WorkerPlan& p = plan[i];
    double desired = base;
    std::string why = "train.batch_size";
    if (proportional && w.live) {
      desired = std::max(1.0, std::round(static_cast<double>(base) * live *
                                         w.throughput / total_throughput));
      why = absl::StrFormat("%.0f%% of the job's throughput",
                            100 * w.throughput / total_throughput);
    } else if (config_.ProportionalBatches()) {
      why = "train.batch_size until every throughput is measured";
    }
    const uint32_t cap = MemoryCapBatch(w.memory_mb, bytes_per_sample_);
    p.batch_size = static_cast<uint32_t>(std::clamp(
        desired, 1.0, static_cast<double>(std::max<uint32_t>(cap, 1))));
    p.push_freq = static_cast<uint32_t>(std::ceil(desired / p.batch_size));
    if (p.batch_size < desired) {
      why += absl::StrFormat(
          ", capped by %.0f MB of memory at %d samples, %d batches per push",
          w.memory_mb, p.batch_size, p.push_freq);
    }
    const DeviceProfileConfig* profile = config_.ProfileOf(i);
    if (profile != nullptr && profile->batch_size > 0) {
      p.batch_size = static_cast<uint32_t>(profile->batch_size);
      why = "fixed by its device profile";
    }
    if (profile != nullptr && profile->push_freq > 0) {
      p.push_freq = static_cast<uint32_t>(profile->push_freq);
      why += ", push_freq fixed by its device profile";
    }
    p.reason = why;
  }
  plan_ = std::move(plan);
  planned_for_ = workers;
  ++version_;
  return true;
}

}  // namespace hetps
