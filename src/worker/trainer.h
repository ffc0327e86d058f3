// Trainer: the worker loop of the built-in models (model/model.h), on a
// WorkerSession (worker/session.h: registration, chunks of the train split
// from the coordinator, the plan's batch size and push_freq, pushes through
// the job's codec, the emulated device, progress and the report). Per
// batch: one pull of the batch's unique keys' rows and the dense weights,
// forward/backward; every push_freq batches one push of the accumulated
// gradients. With train.prefetch, the next batch of the chunk in hand is
// read and its pull started before the current batch computes, so its
// parameters are there (or on their way) when it begins. Rank 0 evaluates on the held-out split when it starts a new
// epoch's chunks (every train.eval_every_epochs) and, from a separate
// thread, every train.eval_every_s seconds. When no chunk is left a worker
// leaves the live set; once every worker has left, the model is final and
// rank 0 evaluates it.
#pragma once

#include <cstdint>
#include <memory>

#include "absl/status/statusor.h"
#include "common/clock.h"
#include "hetps/config.h"
#include "model/job_shape.h"
#include "model/model.h"
#include "worker/evaluator.h"
#include "worker/session.h"
#include "worker/step.h"

namespace hetps {

// One worker's training of a built-in model: Start (model, test split,
// session, the periodic evaluator), then TrainBatch until the session has
// no data left, then Finish (the last push, leaving, the final evaluation
// on rank 0).
class Trainer {
 public:
  Trainer(const JobConfig& config, const JobShape& shape, uint32_t rank,
          Clock& clock)
      : config_(config), shape_(shape), rank_(rank), clock_(clock) {}
  // Waits for a pull ahead still filling ahead_ (an error ended training).
  ~Trainer();

  absl::Status Start();
  // Trains one batch; false when no data is left.
  absl::StatusOr<bool> TrainBatch();
  absl::StatusOr<TrainReport> Finish();

  WorkerSession& session() { return *session_; }
  const Model& model() const { return *model_; }
  // The batch trained last.
  const Batch& batch() const { return step_.batch; }

 private:
  // Rank 0 evaluates when the chunks move on to a new epoch.
  absl::Status EvaluateEpochBefore(int epoch);
  // The parameters of the batch NextBatch handed out: the prefetch's, else
  // pulled now; then the prefetch of the batch after it.
  absl::Status PullParameters();
  absl::Status PushAccumulated();

  const JobConfig& config_;
  const JobShape& shape_;
  const uint32_t rank_;
  Clock& clock_;
  std::unique_ptr<Model> model_;
  std::unique_ptr<Reader> test_;
  std::unique_ptr<WorkerSession> session_;
  std::unique_ptr<StepRunner> steps_;
  std::unique_ptr<PeriodicEvaluator> periodic_;
  Step step_;
  // The prefetch: the next batch's keys, rows and dense weights, while
  // `pulling_ahead_` (until AwaitPullAhead).
  bool prefetch_ = false;
  Step ahead_;
  bool pulling_ahead_ = false;
  Accumulator accumulated_;
  int epoch_ = 0;  // of the batches trained so far
};

// `config` validated and resolved into `shape` (ResolveJob), with
// cluster.ps_endpoints filled in.
absl::StatusOr<TrainReport> RunWorker(const JobConfig& config,
                                      const JobShape& shape, uint32_t rank,
                                      Clock& clock = Clock::Real());

}  // namespace hetps
