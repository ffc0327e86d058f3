#include "worker/trainer.h"

#include <algorithm>
#include <cmath>
#include <deque>
#include <memory>
#include <numeric>

#include "absl/strings/str_cat.h"
#include "common/logging.h"
#include "coord/coordinator.h"
#include "coord/coordinator_client.h"
#include "data/reader.h"
#include "nlohmann/json.hpp"
#include "worker/device_profile.h"
#include "worker/evaluator.h"
#include "worker/push_codec.h"
#include "worker/step.h"

namespace hetps {
namespace {

// Steps between two points of the loss curve (report, over-compression).
constexpr uint64_t kLossCurveEvery = 20;
// Batches the smoothed loss averages over.
constexpr size_t kRecentLosses = 50;
// Time constant of the throughput the planner re-plans from: samples per
// busy second over the last few seconds, so a slow-down shows within
// seconds, not diluted by the whole run.
constexpr double kThroughputTau = 2.0;

// One worker's training, in the steps RunWorker takes: Start (model,
// readers, registration, servers, first plan, the start barrier), then
// TrainChunk for every chunk the coordinator hands out, then Finish (the
// last push, leaving, the final evaluation on rank 0). The job's shape
// comes resolved; nothing here looks at the data config again.
class Trainer {
 public:
  Trainer(const JobConfig& config, const JobShape& shape, uint32_t rank,
          Clock& clock)
      : config_(config),
        shape_(shape),
        rank_(rank),
        clock_(clock),
        chunks_(TrainChunks(config)),
        coordinator_(config, rank, clock),
        batch_size_(static_cast<uint32_t>(config.train.batch_size)) {}

  absl::Status Start();
  // Trains the chunk; returns the samples trained from it.
  absl::StatusOr<uint64_t> TrainChunk(const rpc::ChunkResponse& chunk);
  absl::StatusOr<TrainReport> Finish();

  CoordinatorClient& coordinator() { return coordinator_; }

 private:
  absl::Status OpenReaders();
  absl::Status Connect();
  // Rank 0 evaluates when the chunks move on to a new epoch.
  absl::Status EvaluateEpochBefore(uint32_t epoch);
  // Takes a new plan from the coordinator when there is one.
  void FollowPlan();
  // One batch of up to batch_size_ samples; 0 when the chunk is done.
  absl::StatusOr<uint64_t> TrainBatch();
  absl::Status PushAccumulated();
  void Record(uint64_t samples, double loss, double step_s, double pulled_s);
  rpc::WorkerProgress Progress() const;
  double MeanRecentLoss() const;
  double SecondsSinceStart() const {
    return std::max(absl::ToDoubleSeconds(clock_.Now() - start_), 1e-9);
  }

  const JobConfig& config_;
  const JobShape& shape_;
  const uint32_t rank_;
  Clock& clock_;
  const uint32_t chunks_;
  CoordinatorClient coordinator_;
  std::unique_ptr<Model> model_;
  std::unique_ptr<Reader> train_, test_;
  std::unique_ptr<PsClient> client_;
  std::unique_ptr<PushCodec> codec_;
  absl::Time start_;
  std::unique_ptr<DeviceProfile> device_;
  std::unique_ptr<StepRunner> steps_;
  std::unique_ptr<PeriodicEvaluator> periodic_;

  TrainReport report_;
  Step step_;
  Accumulator accumulated_;
  std::deque<double> recent_loss_;
  int epoch_ = 0;  // of the chunk in hand
  absl::Time last_log_;
  double busy_s_ = 0;  // time outside pulls
  double recent_samples_ = 0, recent_busy_s_ = 0;
  double compute_since_push_s_ = 0;  // compute behind the next push
  uint64_t plan_version_ = 0;
  uint32_t batch_size_;
  uint32_t push_freq_ = 1;
};

absl::Status Trainer::OpenReaders() {
  auto model = Model::Create(config_.train, shape_.data.num_slots,
                             shape_.data.num_dense);
  if (!model.ok()) return model.status();
  model_ = std::move(*model);
  auto train = OpenReader(config_.train.data, Split::kTrain, 0, chunks_);
  if (!train.ok()) return train.status();
  train_ = std::move(*train);
  if (rank_ == 0) {
    auto test = OpenReader(config_.train.data, Split::kTest, 0, 1);
    if (!test.ok()) return test.status();
    test_ = std::move(*test);
  }
  return absl::OkStatus();
}

absl::Status Trainer::Connect() {
  auto registration = coordinator_.Register();
  if (!registration.ok()) return registration.status();
  auto client = ConnectClient(config_, rank_, registration->incarnation());
  if (!client.ok()) return client.status();
  client_ = std::move(*client);
  // The first plan before the first batch (a plain batch_size if the
  // coordinator cannot say yet).
  if (auto s = coordinator_.HeartbeatNow(); !s.ok()) {
    spdlog::warn("no batch plan yet ({}); starting with train.batch_size",
                 s.message());
  }
  coordinator_.StartHeartbeats();
  return coordinator_.Barrier("start");
}

absl::Status Trainer::Start() {
  if (auto s = OpenReaders(); !s.ok()) return s;
  if (auto s = Connect(); !s.ok()) return s;
  auto codec = PushCodec::Create(config_, config_.ProfileOf(rank_));
  if (!codec.ok()) return codec.status();
  codec_ = std::move(*codec);
  start_ = last_log_ = clock_.Now();
  device_ = std::make_unique<DeviceProfile>(
      config_.ProfileOf(rank_), shape_.bytes_per_sample, clock_, start_);
  steps_ = std::make_unique<StepRunner>(*model_, *client_, *device_, clock_);
  spdlog::info("training {} on {} ({} slots, {} dense); {}",
               config_.train.model, config_.train.data.format,
               shape_.data.num_slots, shape_.data.num_dense,
               device_->Describe());
  report_.rank = rank_;
  report_.emulated = device_->emulated();
  report_.device = device_->Describe();
  if (rank_ == 0 && config_.train.eval_every_s > 0) {
    periodic_ =
        std::make_unique<PeriodicEvaluator>(config_, *model_, clock_, start_);
    if (auto s = periodic_->Start(); !s.ok()) return s;
  }
  return absl::OkStatus();
}

absl::Status Trainer::EvaluateEpochBefore(uint32_t epoch) {
  // Rank 0 has moved on to the next epoch: evaluate the one before. (Other
  // workers may still be finishing their last chunks of it.)
  if (!test_ || epoch % config_.train.eval_every_epochs != 0) {
    return absl::OkStatus();
  }
  auto point = steps_->Evaluate(*test_);
  if (!point.ok()) return point.status();
  point->epoch = static_cast<int>(epoch);
  point->at_s = SecondsSinceStart();
  report_.evals.push_back(*point);
  spdlog::info("epoch {}: test AUC {:.4f} logloss {:.4f}", epoch, point->auc,
               point->logloss);
  return absl::OkStatus();
}

absl::StatusOr<uint64_t> Trainer::TrainChunk(const rpc::ChunkResponse& chunk) {
  if (static_cast<int>(chunk.epoch()) > epoch_) {
    if (auto s = EvaluateEpochBefore(chunk.epoch()); !s.ok()) return s;
    epoch_ = static_cast<int>(chunk.epoch());
  }
  // One reader for every chunk: its shards are the chunks (or quarters of
  // them at the end of the job).
  if (chunk.chunks() % chunks_ != 0) {
    return absl::FailedPreconditionError(absl::StrCat(
        "the coordinator cuts the data into ", chunk.chunks(),
        " chunks, this worker into ", chunks_,
        " (train.data.chunks differs between the nodes' configs)"));
  }
  // A pass's stats end with it: keep the count of each chunk.
  report_.malformed_records += train_->stats().malformed;
  if (auto s = train_->Seek(chunk.chunk(), chunk.chunks(), chunk.epoch());
      !s.ok()) {
    return s;
  }
  ++report_.chunks;
  uint64_t trained = 0;
  while (true) {
    auto n = TrainBatch();
    if (!n.ok()) return n.status();
    if (*n == 0) return trained;
    trained += *n;
  }
}

void Trainer::FollowPlan() {
  const rpc::BatchPlan plan = coordinator_.plan();
  if (plan.version() == plan_version_ || plan.batch_size() == 0) return;
  plan_version_ = plan.version();
  batch_size_ = plan.batch_size();
  push_freq_ = std::max<uint32_t>(1, plan.push_freq());
  spdlog::info("plan {}: batch {} push_freq {} ({})", plan_version_,
               batch_size_, push_freq_, plan.reason());
}

absl::StatusOr<uint64_t> Trainer::TrainBatch() {
  FollowPlan();
  const absl::Time began = clock_.Now();
  auto n = train_->Next(batch_size_, &step_.batch);
  if (!n.ok() || *n == 0) return n;
  if (auto s = device_->CheckMemory(*n); !s.ok()) return s;
  const absl::Time pull_began = clock_.Now();
  if (auto s = steps_->Pull(step_); !s.ok()) return s;
  const double pulled = absl::ToDoubleSeconds(clock_.Now() - pull_began);
  const absl::Time compute_began = clock_.Now();
  const double loss = steps_->Compute(step_);
  device_->Pace(*n, compute_began);
  compute_since_push_s_ += absl::ToDoubleSeconds(clock_.Now() - compute_began);
  accumulated_.Add(step_.unique.keys(), step_.row_grads, model_->row_dim(),
                   step_.dense_grad, static_cast<uint32_t>(*n));
  if (accumulated_.batches() >= push_freq_) {
    if (auto s = PushAccumulated(); !s.ok()) return s;
  }
  Record(*n, loss, absl::ToDoubleSeconds(clock_.Now() - began), pulled);
  return n;
}

absl::Status Trainer::PushAccumulated() {
  if (accumulated_.batches() == 0) return absl::OkStatus();
  accumulated_.Finish();
  const absl::Status s = steps_->Push(
      accumulated_.keys(), accumulated_.rows(), accumulated_.dense(),
      accumulated_.samples(), *codec_, compute_since_push_s_);
  compute_since_push_s_ = 0;
  accumulated_.Clear();
  ++report_.pushes;
  return s;
}

void Trainer::Record(uint64_t samples, double loss, double step_s,
                     double pulled_s) {
  busy_s_ += step_s - pulled_s;
  const double decay = std::exp(-step_s / kThroughputTau);
  recent_samples_ = recent_samples_ * decay + static_cast<double>(samples);
  recent_busy_s_ = recent_busy_s_ * decay + (step_s - pulled_s);
  ++report_.steps;
  report_.samples += samples;
  recent_loss_.push_back(loss / static_cast<double>(samples));
  if (recent_loss_.size() > kRecentLosses) recent_loss_.pop_front();
  if (report_.steps % kLossCurveEvery == 0) {
    report_.loss_curve.emplace_back(report_.steps, MeanRecentLoss());
    if (auto warning =
            codec_->CheckConvergence(report_.steps, MeanRecentLoss())) {
      spdlog::warn("{}", *warning);
      report_.warnings.push_back(*warning);
    }
  }
  coordinator_.ReportProgress(Progress());
  if (clock_.Now() - last_log_ > absl::Seconds(2)) {
    last_log_ = clock_.Now();
    const double seconds = SecondsSinceStart();
    spdlog::info("epoch {} step {} loss {:.4f} {:.0f} samples/s, busy {:.0f}%",
                 epoch_ + 1, report_.steps, MeanRecentLoss(),
                 report_.samples / seconds, 100 * busy_s_ / seconds);
  }
}

rpc::WorkerProgress Trainer::Progress() const {
  const double seconds = SecondsSinceStart();
  rpc::WorkerProgress p;
  p.set_step(report_.steps);
  p.set_samples(report_.samples);
  p.set_samples_per_s(report_.samples / seconds);
  p.set_clock(client_->clock());
  p.set_batch_size(batch_size_);
  p.set_push_freq(push_freq_);
  p.set_busy_fraction(busy_s_ / seconds);
  p.set_compute_samples_per_s(recent_samples_ / std::max(recent_busy_s_, 1e-9));
  p.set_emulated(device_->emulated());
  p.set_memory_mb(device_->memory_mb());
  p.set_raw_bytes(codec_->raw_bytes());
  p.set_sent_bytes(codec_->sent_bytes());
  p.set_codec(codec_->codec());
  p.set_codec_reason(codec_->reason());
  return p;
}

double Trainer::MeanRecentLoss() const {
  if (recent_loss_.empty()) return 0.0;
  return std::accumulate(recent_loss_.begin(), recent_loss_.end(), 0.0) /
         static_cast<double>(recent_loss_.size());
}

absl::StatusOr<TrainReport> Trainer::Finish() {
  if (auto s = PushAccumulated(); !s.ok()) return s;
  report_.train_s = SecondsSinceStart();
  report_.samples_per_s = report_.samples / report_.train_s;
  report_.busy_fraction = busy_s_ / report_.train_s;
  report_.raw_bytes = codec_->raw_bytes();
  report_.sent_bytes = codec_->sent_bytes();
  report_.raw_value_bytes = codec_->raw_value_bytes();
  report_.sent_value_bytes = codec_->sent_value_bytes();
  report_.sent_by_codec = codec_->sent_by_codec();
  report_.last_loss = MeanRecentLoss();
  report_.malformed_records += train_->stats().malformed;

  // Leave the live set (nobody waits for this worker any more), then wait
  // until every worker has left: the model is final.
  if (auto s = coordinator_.Leave("finished its data"); !s.ok()) return s;
  if (auto s = coordinator_.Barrier("trained"); !s.ok()) return s;
  if (periodic_) {
    std::vector<EvalPoint> over_time = periodic_->Stop();
    report_.evals.insert(report_.evals.begin(), over_time.begin(),
                         over_time.end());
  }
  if (test_) {
    auto point = steps_->Evaluate(*test_);
    if (!point.ok()) return point.status();
    point->epoch = config_.train.epochs;
    point->at_s = SecondsSinceStart();
    report_.evals.push_back(*point);
    report_.test_auc = point->auc;
    report_.test_logloss = point->logloss;
    report_.malformed_records += test_->stats().malformed;
    spdlog::info(
        "final model: test AUC {:.4f} logloss {:.4f} on {} held-out samples",
        point->auc, point->logloss, test_->stats().samples);
  }
  return report_;
}

}  // namespace

absl::StatusOr<TrainReport> RunWorker(const JobConfig& config,
                                      const JobShape& shape, uint32_t rank,
                                      Clock& clock) {
  if (config.train.model == "none") {
    return absl::UnimplementedError(
        "train.model: 'none' has no built-in trainer (drive the PsClient API "
        "instead)");
  }
  Trainer trainer(config, shape, rank, clock);
  if (auto s = trainer.Start(); !s.ok()) return s;
  uint64_t finished = 0;  // samples trained from the chunk in hand
  while (true) {
    auto chunk = trainer.coordinator().NextChunk(finished);
    if (!chunk.ok()) return chunk.status();
    if (chunk->done()) break;
    auto trained = trainer.TrainChunk(*chunk);
    if (!trained.ok()) return trained.status();
    finished = *trained;
  }
  return trainer.Finish();
}

std::string ReportToJson(const TrainReport& report) {
  nlohmann::json j = {{"rank", report.rank},
                      {"steps", report.steps},
                      {"pushes", report.pushes},
                      {"chunks", report.chunks},
                      {"busy_fraction", report.busy_fraction},
                      {"emulated", report.emulated},
                      {"device", report.device},
                      {"raw_bytes", report.raw_bytes},
                      {"sent_bytes", report.sent_bytes},
                      {"raw_value_bytes", report.raw_value_bytes},
                      {"sent_value_bytes", report.sent_value_bytes},
                      {"loss_curve", report.loss_curve},
                      {"warnings", report.warnings},
                      {"samples", report.samples},
                      {"train_s", report.train_s},
                      {"samples_per_s", report.samples_per_s},
                      {"last_loss", report.last_loss},
                      {"malformed_records", report.malformed_records}};
  if (report.test_auc) j["test_auc"] = *report.test_auc;
  if (report.test_logloss) j["test_logloss"] = *report.test_logloss;
  for (const EvalPoint& e : report.evals) {
    j["evals"].push_back({{"epoch", e.epoch},
                          {"at_s", e.at_s},
                          {"auc", e.auc},
                          {"logloss", e.logloss}});
  }
  j["sent_by_codec"] = nlohmann::json::object();
  for (const auto& [codec, bytes] : report.sent_by_codec) {
    j["sent_by_codec"][codec] = bytes;
  }
  return j.dump();
}

}  // namespace hetps
