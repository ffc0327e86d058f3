// Trainer: the worker loop. Registers with the coordinator, connects to the
// servers, then takes chunks of the train split from the coordinator until
// none is left (data/reader.h shards; coord/coordinator.h hands them out),
// so fast workers train on more of the data. Per batch: one sparse pull of
// the batch's unique keys, one dense pull, forward/backward
// (model/model.h); every push_freq batches one push of the accumulated
// gradients. Batch size and push_freq follow the coordinator's BatchPlan; a
// DeviceProfile may emulate a slower machine. Rank 0 evaluates on the
// held-out split when it starts a new epoch's chunks (every
// train.eval_every_epochs) and, from a separate thread, every
// train.eval_every_s seconds. When no chunk is left a worker leaves the live
// set; once every worker has left, the model is final and rank 0 evaluates
// it.
//
// Busy time is the time outside pulls (a pull is where sync and the SSP bound
// make a worker wait); busy_fraction = busy / training time.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "common/clock.h"
#include "hetps/config.h"
#include "model/job_shape.h"
#include "worker/step.h"

namespace hetps {

struct TrainReport {
  uint32_t rank = 0;
  uint64_t steps = 0;
  uint64_t samples = 0;
  double train_s = 0;        // training loop only
  double samples_per_s = 0;  // samples / train_s
  double last_loss = 0;      // mean logloss of the last 50 batches
  uint64_t malformed_records = 0;
  uint64_t pushes = 0;
  uint64_t chunks = 0;           // chunks of the train split it trained on
  double busy_fraction = 0;      // time outside pulls / train_s
  bool emulated = false;         // ran under a DeviceProfile
  std::string device;            // DeviceProfile::Describe()
  uint64_t raw_bytes = 0;        // gradient payloads as fp32
  uint64_t sent_bytes = 0;       // as sent (compress.codec)
  uint64_t raw_value_bytes = 0;  // the same without keys and headers
  uint64_t sent_value_bytes = 0;
  std::vector<std::pair<std::string, uint64_t>> sent_by_codec;
  // (step, mean loss of the last 50 batches) every 20 steps.
  std::vector<std::pair<uint64_t, double>> loss_curve;
  std::vector<std::string> warnings;  // e.g. over-compression
  // Rank 0 only: the held-out evaluations, the last one of the final model.
  std::vector<EvalPoint> evals;
  std::optional<double> test_auc;
  std::optional<double> test_logloss;
};

// `config` validated and resolved into `shape` (ResolveJob), with
// cluster.ps_endpoints filled in.
absl::StatusOr<TrainReport> RunWorker(const JobConfig& config,
                                      const JobShape& shape, uint32_t rank,
                                      Clock& clock = Clock::Real());

// One-line JSON of a report (the launcher gathers these).
std::string ReportToJson(const TrainReport& report);

// The line prefix that marks a report in a worker's stdout.
inline constexpr const char* kReportPrefix = "HETPS_REPORT ";

}  // namespace hetps
