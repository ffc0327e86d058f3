// Trainer: the worker loop. Registers with the coordinator, connects to the
// servers, trains on this worker's share of the data (sample i belongs to
// worker i mod W), pushes after every batch, leaves the live set when its
// share is done, and — on rank 0, once every worker has finished — evaluates
// the final model on the held-out set.
//
// Until the model/data work lands the model is logistic regression over
// synthetic categorical data (data/synthetic.h).
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "hetps/config.h"

namespace hetps {

struct TrainReport {
  uint32_t rank = 0;
  uint64_t steps = 0;
  uint64_t samples = 0;
  double train_s = 0;        // training loop only
  double samples_per_s = 0;  // samples / train_s
  double last_loss = 0;      // mean logloss of the last 50 batches
  // Rank 0 only: the final model on the held-out set.
  std::optional<double> test_auc;
  std::optional<double> test_logloss;
};

// `config` validated, cluster.ps_endpoints filled in.
absl::StatusOr<TrainReport> RunWorker(const JobConfig& config, uint32_t rank);

// One-line JSON of a report (the launcher gathers these).
std::string ReportToJson(const TrainReport& report);

// The line prefix that marks a report in a worker's stdout.
inline constexpr const char* kReportPrefix = "HETPS_REPORT ";

}  // namespace hetps
