#include "worker/trainer.h"

#include <memory>
#include <utility>

#include "common/logging.h"
#include "worker/evaluator.h"

namespace hetps {

Trainer::~Trainer() {
  if (pulling_ahead_) (void)steps_->AwaitPullAhead();
}

absl::Status Trainer::Start() {
  auto model = Model::Create(config_.train, shape_.data.num_slots,
                             shape_.data.num_dense);
  if (!model.ok()) return model.status();
  model_ = std::move(*model);
  if (rank_ == 0) {
    auto test = OpenReader(config_.train.data, Split::kTest, 0, 1);
    if (!test.ok()) return test.status();
    test_ = std::move(*test);
  }
  auto session = WorkerSession::Start(config_, shape_, rank_, clock_);
  if (!session.ok()) return session.status();
  session_ = std::move(*session);
  steps_ = std::make_unique<StepRunner>(*model_, session_->client(),
                                        session_->device(), clock_);
  // The hot-row cache counts a row's lag per push: no pulls ahead there.
  prefetch_ = config_.train.prefetch;
  spdlog::info("training {} ({}) on {} ({} slots, {} dense); {}",
               config_.train.model, IsaName(model_->isa()),
               config_.train.data.format, shape_.data.num_slots,
               shape_.data.num_dense, session_->device().Describe());
  if (rank_ == 0 && config_.train.eval_every_s > 0) {
    periodic_ = std::make_unique<PeriodicEvaluator>(config_, *model_, clock_,
                                                    session_->start());
    if (auto s = periodic_->Start(); !s.ok()) return s;
    session_->SetEvalSource([p = periodic_.get()] { return p->Latest(); });
  }
  return absl::OkStatus();
}

absl::Status Trainer::EvaluateEpochBefore(int epoch) {
  // Rank 0 has moved on to the next epoch: evaluate the one before. (Other
  // workers may still be finishing their last chunks of it.)
  if (!test_ || epoch % config_.train.eval_every_epochs != 0) {
    return absl::OkStatus();
  }
  return session_->Waiting([&]() -> absl::Status {
    auto point = steps_->Evaluate(*test_);
    if (!point.ok()) return point.status();
    point->epoch = epoch;
    point->at_s = session_->SecondsSinceStart();
    session_->AddEval(*point);
    spdlog::info("epoch {}: test AUC {:.4f} logloss {:.4f}", epoch, point->auc,
                 point->logloss);
    return absl::OkStatus();
  });
}

absl::StatusOr<bool> Trainer::TrainBatch() {
  auto n = session_->NextBatch(&step_.batch);
  if (!n.ok()) return n.status();
  if (*n == 0) return false;
  if (session_->epoch() > epoch_) {
    if (auto s = EvaluateEpochBefore(session_->epoch()); !s.ok()) return s;
    epoch_ = session_->epoch();
  }
  if (auto s = PullParameters(); !s.ok()) return s;
  session_->SetLoss(steps_->Compute(step_));
  accumulated_.Add(step_.unique, step_.row_grads, model_->row_dim(),
                   step_.dense_grad, static_cast<uint32_t>(*n));
  if (accumulated_.batches() >= session_->push_freq()) {
    if (auto s = PushAccumulated(); !s.ok()) return s;
  }
  return true;
}

absl::Status Trainer::PullParameters() {
  if (std::exchange(pulling_ahead_, false)) {
    const absl::Status ahead =
        session_->Waiting([&] { return steps_->AwaitPullAhead(); });
    if (session_->read_ahead_taken()) {
      if (!ahead.ok()) return ahead;
      std::swap(step_.unique, ahead_.unique);
      std::swap(step_.rows, ahead_.rows);
      std::swap(step_.dense, ahead_.dense);
    }
    // Else the worker was dropped and rejoined: that batch went with its
    // chunk, and what was pulled for it (as the old incarnation) with it.
    // (That pull did not wait long: the servers answer a worker that left
    // the live set.)
  }
  if (!session_->read_ahead_taken()) {
    if (auto s = session_->Waiting([&] { return steps_->Pull(step_); });
        !s.ok()) {
      return s;
    }
  }
  if (!prefetch_) return absl::OkStatus();
  auto next = session_->ReadAhead();
  if (!next.ok()) return next.status();
  if (*next == nullptr) return absl::OkStatus();
  // The clock this batch's rows serve: the next push's, one past the
  // current clock when this batch ends with a push.
  const bool pushes = accumulated_.batches() + 1 >= session_->push_freq();
  steps_->PullAhead(**next, ahead_,
                    session_->client().clock() + (pushes ? 1 : 0));
  pulling_ahead_ = true;
  return absl::OkStatus();
}

absl::Status Trainer::PushAccumulated() {
  if (accumulated_.batches() == 0) return absl::OkStatus();
  accumulated_.Finish();
  const std::vector<TableConfig> tables = model_->Tables();
  const TableGrad grads[] = {{tables[0].name, accumulated_.keys(),
                              accumulated_.rows(), accumulated_.uses()},
                             {tables[1].name, {}, accumulated_.dense()}};
  const absl::Status s =
      session_->Push(grads, accumulated_.samples(), KeySet::kUnique);
  accumulated_.Clear();
  return s;
}

absl::StatusOr<TrainReport> Trainer::Finish() {
  // No chunk is left, so nothing was read ahead: the last batch ended its
  // chunk.
  if (auto s = PushAccumulated(); !s.ok()) return s;
  if (auto s = session_->Finish(); !s.ok()) return s;
  if (periodic_) {
    for (const EvalPoint& point : periodic_->Stop()) session_->AddEval(point);
  }
  if (test_) {
    auto point = steps_->Evaluate(*test_);
    if (!point.ok()) return point.status();
    point->epoch = config_.train.epochs;
    point->at_s = session_->SecondsSinceStart();
    session_->AddEval(*point);
    session_->SetFinalEval(point->auc, point->logloss);
    session_->AddMalformed(test_->stats().malformed);
    spdlog::info(
        "final model: test AUC {:.4f} logloss {:.4f} on {} held-out samples",
        point->auc, point->logloss, test_->stats().samples);
  }
  return session_->Report();
}

absl::StatusOr<TrainReport> RunWorker(const JobConfig& config,
                                      const JobShape& shape, uint32_t rank,
                                      Clock& clock) {
  if (config.train.model == "none") {
    return absl::UnimplementedError(
        "train.model: 'none' has no built-in trainer (run the job's own "
        "worker.command, e.g. a Python script using the hetps module)");
  }
  Trainer trainer(config, shape, rank, clock);
  if (auto s = trainer.Start(); !s.ok()) return s;
  while (true) {
    auto more = trainer.TrainBatch();
    if (!more.ok()) return more.status();
    if (!*more) break;
  }
  return trainer.Finish();
}

}  // namespace hetps
