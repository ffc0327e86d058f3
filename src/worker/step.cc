#include "worker/step.h"

#include <algorithm>
#include <memory>

#include "model/metrics.h"

namespace hetps {

void Accumulator::Add(const UniqueKeys& unique,
                      std::span<const float> row_grads, uint64_t row_dim,
                      std::span<const float> dense_grad, uint32_t n) {
  const float w = static_cast<float>(n);
  const std::vector<uint64_t>& keys = unique.keys();
  batch_slots_.resize(keys.size());
  for (size_t i = 0; i < keys.size(); ++i) {
    auto [it, inserted] =
        index_.try_emplace(keys[i], static_cast<uint32_t>(keys_.size()));
    if (inserted) {
      keys_.push_back(keys[i]);
      uses_.push_back(0);
      rows_.resize(rows_.size() + row_dim, 0.0f);
    }
    batch_slots_[i] = it->second;
    float* dst = &rows_[static_cast<size_t>(it->second) * row_dim];
    for (uint64_t j = 0; j < row_dim; ++j) {
      dst[j] += w * row_grads[i * row_dim + j];
    }
  }
  for (uint32_t p : unique.position()) ++uses_[batch_slots_[p]];
  dense_.resize(dense_grad.size(), 0.0f);
  for (size_t j = 0; j < dense_grad.size(); ++j) dense_[j] += w * dense_grad[j];
  samples_ += n;
  ++batches_;
}

void Accumulator::Finish() {
  const float scale =
      1.0f / static_cast<float>(std::max<uint32_t>(1, samples_));
  for (float& v : rows_) v *= scale;
  for (float& v : dense_) v *= scale;
}

void Accumulator::Clear() {
  index_.clear();
  keys_.clear();
  uses_.clear();
  rows_.clear();
  dense_.clear();
  samples_ = 0;
  batches_ = 0;
}

StepRunner::StepRunner(const Model& model, PsClient& client,
                       const DeviceProfile& device, Clock& clock)
    : model_(model),
      client_(client),
      device_(device),
      clock_(clock),
      tables_(model_.Tables()) {}

absl::Status StepRunner::Pull(Step& step, RowSource source) {
  step.unique.Build(step.batch.keys);
  return PullRows(step, source, std::nullopt);
}

void StepRunner::PullAhead(const Batch& batch, Step& step, uint64_t for_push) {
  // The keys now: `batch` may change once this returns.
  step.unique.Build(batch.keys);
  // (std::function needs a copyable task: the promise is shared.)
  auto done = std::make_shared<std::promise<absl::Status>>();
  ahead_ = done->get_future();
  ahead_pool_.Run([this, &step, for_push, done] {
    done->set_value(PullRows(step, RowSource::kCacheAllowed, for_push));
  });
}

absl::Status StepRunner::AwaitPullAhead() {
  if (!ahead_.valid()) {
    return absl::FailedPreconditionError("no pull ahead was started");
  }
  return ahead_.get();
}

absl::Status StepRunner::PullRows(Step& step, RowSource source,
                                  std::optional<uint64_t> for_push) {
  absl::Time began = clock_.Now();
  step.rows.resize(step.unique.keys().size() * model_.row_dim());
  step.dense.resize(model_.dense_size());
  // The dense weights come with the rows: one call per server.
  const PsClient::DenseAlong dense{dense_table(), step.dense};
  if (auto s = client_.PullSparse(sparse_table(), step.unique.keys(), step.rows,
                                  KeySet::kUnique, source, &dense, for_push);
      !s.ok()) {
    return s;
  }
  // The reply to a pull ahead leaves a sync or semi_async server only once
  // the step's push is in: its time on the emulated link starts when it
  // arrives, not when the request left (conservative for async, which
  // answers at once).
  if (for_push) began = clock_.Now();
  device_.Throttle(step.unique.keys().size() * 8 +
                       (step.rows.size() + step.dense.size()) * 4,
                   began);
  return absl::OkStatus();
}

double StepRunner::Compute(Step& step) const {
  const size_t n = step.batch.size();
  step.p.resize(n);
  step.row_grads.resize(step.rows.size());
  step.dense_grad.resize(step.dense.size());
  return model_.Train(step.batch,
                      {step.unique.position(), step.rows, step.dense}, step.p,
                      step.row_grads, step.dense_grad);
}

absl::StatusOr<EvalPoint> StepRunner::Evaluate(Reader& reader) {
  if (auto s = reader.Rewind(); !s.ok()) return s;
  Step step;
  std::vector<float> scores, labels;
  while (true) {
    auto n = reader.Next(4096, &step.batch);
    if (!n.ok()) return n.status();
    if (*n == 0) break;
    if (auto s = Pull(step, RowSource::kServers); !s.ok()) return s;
    step.p.resize(*n);
    model_.Predict(step.batch, {step.unique.position(), step.rows, step.dense},
                   step.p);
    scores.insert(scores.end(), step.p.begin(), step.p.end());
    labels.insert(labels.end(), step.batch.labels.begin(),
                  step.batch.labels.end());
  }
  if (scores.empty()) {
    return absl::FailedPreconditionError(
        "the test split is empty (train.data.test_fraction?)");
  }
  EvalPoint point;
  point.auc = Auc(scores, labels);
  point.logloss = LogLoss(scores, labels);
  return point;
}

}  // namespace hetps
