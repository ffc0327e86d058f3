#include "worker/evaluator.h"

#include "common/logging.h"
#include "worker/device_profile.h"

namespace hetps {

PeriodicEvaluator::PeriodicEvaluator(const JobConfig& config,
                                     const Model& model, Clock& clock,
                                     absl::Time start)
    : config_(config), model_(model), clock_(clock), start_(start) {}

PeriodicEvaluator::~PeriodicEvaluator() { Stop(); }

absl::Status PeriodicEvaluator::Start() {
  auto reader = OpenReader(config_.train.data, Split::kTest, 0, 1);
  if (!reader.ok()) return reader.status();
  reader_ = std::move(*reader);
  auto client = ConnectClient(config_, kReaderId, 0);
  if (!client.ok()) return client.status();
  client_ = std::move(*client);
  thread_ = std::thread([this] { Run(); });
  return absl::OkStatus();
}

std::optional<EvalPoint> PeriodicEvaluator::Latest() {
  absl::MutexLock lock(&mu_);
  if (points_.empty()) return std::nullopt;
  return points_.back();
}

std::vector<EvalPoint> PeriodicEvaluator::Stop() {
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
    stop_cv_.SignalAll();
  }
  if (thread_.joinable()) thread_.join();
  absl::MutexLock lock(&mu_);
  return points_;
}

void PeriodicEvaluator::Run() {
  const DeviceProfile none(nullptr, 0, clock_, start_);
  StepRunner evaluator(model_, *client_, none, clock_);
  const absl::Duration every = absl::Seconds(config_.train.eval_every_s);
  absl::MutexLock lock(&mu_);
  while (true) {
    const absl::Time next = clock_.Now() + every;
    while (!stop_ && !clock_.WaitUntil(stop_cv_, mu_, next)) {
    }
    if (stop_) return;
    mu_.Unlock();
    const double at = absl::ToDoubleSeconds(clock_.Now() - start_);
    absl::StatusOr<EvalPoint> point = evaluator.Evaluate(*reader_);
    mu_.Lock();
    if (!point.ok()) {
      spdlog::warn("periodic evaluation failed: {}", point.status().message());
      continue;
    }
    point->at_s = at;
    point->epoch = -1;
    points_.push_back(*point);
    spdlog::info("{:.1f} s: test AUC {:.4f} logloss {:.4f}", at, point->auc,
                 point->logloss);
  }
}

}  // namespace hetps
