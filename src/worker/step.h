// The parts of a built-in model's training step (private to src/worker/):
// the buffers of a batch, the pull of its rows and dense weights, forward
// and backward, gradient accumulation over push_freq batches, and
// evaluation on a reader's whole share. The push is the session's.
#pragma once

#include <cstdint>
#include <future>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "client/unique_keys.h"
#include "common/clock.h"
#include "common/task_pool.h"
#include "data/batch.h"
#include "data/reader.h"
#include "hetps/ps_client.h"
#include "model/model.h"
#include "worker/device_profile.h"
#include "worker/session.h"

namespace hetps {

// Everything one training loop reuses from batch to batch. The batch's
// distinct keys: the pull fetches each row once and the push carries each
// row's summed gradient, so the client skips its own dedup.
struct Step {
  Batch batch;
  UniqueKeys unique;
  std::vector<float> rows, dense, row_grads, dense_grad, p;
};

// Gradients of push_freq batches summed, each weighted by its batch size.
class Accumulator {
 public:
  // `unique`: the batch's keys (its distinct keys and each use's position
  // among them), `row_grads` per distinct key.
  void Add(const UniqueKeys& unique, std::span<const float> row_grads,
           uint64_t row_dim, std::span<const float> dense_grad, uint32_t n);
  // Turns the sums into the mean gradient of all samples added.
  void Finish();
  void Clear();

  uint32_t batches() const { return batches_; }
  uint32_t samples() const { return samples_; }
  std::span<const uint64_t> keys() const { return keys_; }
  // How many of the samples' feature slots used each key.
  std::span<const uint32_t> uses() const { return uses_; }
  std::span<const float> rows() const { return rows_; }
  std::span<const float> dense() const { return dense_; }

 private:
  absl::flat_hash_map<uint64_t, uint32_t> index_;
  std::vector<uint64_t> keys_;
  std::vector<uint32_t> uses_;
  std::vector<uint32_t> batch_slots_;  // Add's distinct keys' places in keys_
  std::vector<float> rows_, dense_;
  uint32_t samples_ = 0;
  uint32_t batches_ = 0;
};

// One model's steps through one PsClient, on an (emulated) device. The
// references must outlive it.
class StepRunner {
 public:
  StepRunner(const Model& model, PsClient& client, const DeviceProfile& device,
             Clock& clock);

  // Pulls what `step.batch` needs into step.rows / step.dense (sparse rows
  // from the hot-row cache where `source` allows).
  absl::Status Pull(Step& step, RowSource source = RowSource::kCacheAllowed);
  // The prefetch (train.prefetch): starts pulling what `batch` needs into
  // `step`'s unique keys, rows and dense weights, for the push at clock
  // `for_push` (PsClient::PullSparse), on a thread of its own; `step` is
  // not to be touched until AwaitPullAhead has returned its outcome. One at
  // a time.
  void PullAhead(const Batch& batch, Step& step, uint64_t for_push);
  absl::Status AwaitPullAhead();
  // Forward and backward on the pulled parameters; returns the summed loss.
  double Compute(Step& step) const;
  // AUC and logloss of the current model on `reader`'s whole share (the
  // servers' rows, never a cached copy).
  absl::StatusOr<EvalPoint> Evaluate(Reader& reader);

 private:
  const std::string& sparse_table() const { return tables_[0].name; }
  const std::string& dense_table() const { return tables_[1].name; }
  // Pulls the rows of step.unique's keys and the dense weights.
  absl::Status PullRows(Step& step, RowSource source,
                        std::optional<uint64_t> for_push);

  const Model& model_;
  PsClient& client_;
  const DeviceProfile& device_;
  Clock& clock_;
  const std::vector<TableConfig> tables_;
  std::future<absl::Status> ahead_;  // valid while PullAhead's pull runs
  TaskPool ahead_pool_{"pull-ahead", 1};  // last: joined first
};

}  // namespace hetps
