// BatchPlanner: each worker's batch size and push_freq from its measured
// capability (SPEC §3). Lives in the coordinator; workers receive their plan
// with every heartbeat reply.
//
// Rules, per live worker i:
//   - a fixed batch_size / push_freq in the worker's device profile wins;
//   - proportional plans (planner.batch_plan, JobConfig::ProportionalBatches)
//     with every live worker's throughput T known: the job's batch per step,
//     train.batch_size × live workers, is split as desired_i = total · T_i /
//     ΣT (at least 1); otherwise desired_i = train.batch_size;
//   - the memory cap: batch_i = min(desired_i, memory_mb / bytes per sample);
//     a worker capped below its share accumulates push_freq_i =
//     ceil(desired_i / batch_i) batches per push, so its pushes still carry
//     its share of the work.
// Update() re-plans when the live set changes or a throughput moved by more
// than planner.replan_threshold (relative) since the last plan; each plan
// gets a new version and every worker's entry says why it is what it is.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "hetps/config.h"

namespace hetps {

// The largest batch `memory_mb` holds (0 memory = no cap).
uint32_t MemoryCapBatch(double memory_mb, uint64_t bytes_per_sample);

struct WorkerCapability {
  bool live = true;
  double throughput = 0;  // samples per busy second; 0 = not measured yet
  double memory_mb = 0;   // 0 = unlimited
};

struct WorkerPlan {
  uint32_t batch_size = 1;
  uint32_t push_freq = 1;
  std::string reason;
};

class BatchPlanner {
 public:
  // `bytes_per_sample`: JobShape::bytes_per_sample (0: no memory caps).
  BatchPlanner(const JobConfig& config, uint64_t bytes_per_sample);

  // Re-plans when needed (see above); returns true when the plan changed.
  bool Update(const std::vector<WorkerCapability>& workers);

  const std::vector<WorkerPlan>& plan() const { return plan_; }
  uint64_t version() const { return version_; }

 private:
  bool NeedsReplan(const std::vector<WorkerCapability>& workers) const;

  const JobConfig& config_;
  const uint64_t bytes_per_sample_;
  std::vector<WorkerPlan> plan_;
  std::vector<WorkerCapability> planned_for_;  // inputs of the last plan
  uint64_t version_ = 0;
};

}  // namespace hetps
