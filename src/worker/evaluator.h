// PeriodicEvaluator: rank 0's evaluation of the current model on the
// held-out split every train.eval_every_s, on its own thread and its own
// PsClient (as kReaderId: no mode waits for it), so that measuring the AUC
// over time costs the training loop nothing but CPU.
#pragma once

#include <memory>
#include <optional>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "common/clock.h"
#include "data/reader.h"
#include "hetps/config.h"
#include "hetps/ps_client.h"
#include "model/model.h"
#include "worker/step.h"

namespace hetps {

class PeriodicEvaluator {
 public:
  // Times are seconds since `start` on `clock`. `config` and `model` must
  // outlive it.
  PeriodicEvaluator(const JobConfig& config, const Model& model, Clock& clock,
                    absl::Time start);
  ~PeriodicEvaluator();

  // Opens the test split, connects, starts the thread.
  absl::Status Start();
  // Stops the thread; returns the evaluations made.
  std::vector<EvalPoint> Stop();
  // The latest evaluation so far, if any (any thread).
  std::optional<EvalPoint> Latest();

 private:
  void Run();

  const JobConfig& config_;
  const Model& model_;
  Clock& clock_;
  const absl::Time start_;
  std::unique_ptr<Reader> reader_;
  std::unique_ptr<PsClient> client_;
  absl::Mutex mu_;
  absl::CondVar stop_cv_;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<EvalPoint> points_ ABSL_GUARDED_BY(mu_);
  std::thread thread_;
};

}  // namespace hetps
