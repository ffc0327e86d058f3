#include "worker/session.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/logging.h"
#include "compress/codec.h"
#include "coord/coordinator.h"
#include "nlohmann/json.hpp"

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

double Seconds(absl::Duration d) { return absl::ToDoubleSeconds(d); }

}  // namespace

WorkerSession::WorkerSession(const JobConfig& config, const JobShape& shape,
                             uint32_t rank, Clock& clock)
    : config_(config),
      shape_(shape),
      rank_(rank),
      clock_(clock),
      chunks_(TrainChunks(config)),
      coordinator_(config, rank, clock),
      batch_size_(static_cast<uint32_t>(config.train.batch_size)) {}

WorkerSession::~WorkerSession() = default;

absl::StatusOr<std::unique_ptr<WorkerSession>> WorkerSession::Start(
    const JobConfig& config, const JobShape& shape, uint32_t rank,
    Clock& clock) {
  if (rank >= static_cast<uint32_t>(config.num_workers())) {
    return absl::InvalidArgumentError(
        absl::StrCat("rank ", rank, " is not a worker of this job (",
                     config.num_workers(), " workers)"));
  }
  std::unique_ptr<WorkerSession> session(
      new WorkerSession(config, shape, rank, clock));
  if (auto s = session->Open(); !s.ok()) return s;
  return session;
}

absl::Status WorkerSession::Open() {
  auto train = OpenReader(config_.train.data, Split::kTrain, 0, chunks_);
  if (!train.ok()) return train.status();
  train_ = std::move(*train);
  auto codec = PushCodec::Create(config_, config_.ProfileOf(rank_));
  if (!codec.ok()) return codec.status();
  codec_ = std::move(*codec);

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
  if (auto s = coordinator_.Barrier("start"); !s.ok()) return s;

  start_ = last_log_ = batch_began_ = clock_.Now();
  {
    absl::MutexLock lock(&wait_mu_);
    segment_began_ = start_;
  }
  device_ = std::make_unique<DeviceProfile>(
      config_.ProfileOf(rank_), shape_.bytes_per_sample, clock_, start_);
  report_.rank = rank_;
  report_.emulated = device_->emulated();
  report_.device = device_->Describe();
  return absl::OkStatus();
}

double WorkerSession::SecondsSinceStart() const {
  return std::max(Seconds(clock_.Now() - start_), 1e-9);
}

void WorkerSession::FollowPlan() {
  const rpc::BatchPlan plan = coordinator_.plan();
  if (plan.version() == plan_version_ || plan.batch_size() == 0) return;
  plan_version_ = plan.version();
  batch_size_ = fixed_batch_size_ > 0 ? fixed_batch_size_ : plan.batch_size();
  push_freq_ = fixed_push_freq_ > 0 ? fixed_push_freq_
                                    : std::max<uint32_t>(1, plan.push_freq());
  spdlog::info("plan {}: batch {} push_freq {} ({})", plan_version_,
               batch_size_, push_freq_, plan.reason());
}

void WorkerSession::FixPlan(uint32_t batch_size, uint32_t push_freq) {
  fixed_batch_size_ = batch_size;
  fixed_push_freq_ = push_freq;
  if (batch_size > 0) batch_size_ = batch_size;
  if (push_freq > 0) push_freq_ = push_freq;
}

absl::Status WorkerSession::Seek(const rpc::ChunkResponse& chunk) {
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
  epoch_ = std::max(epoch_, static_cast<int>(chunk.epoch()));
  ++report_.chunks;
  chunk_samples_ = 0;
  have_chunk_ = true;
  return absl::OkStatus();
}

absl::Status WorkerSession::Rejoin() {
  spdlog::warn(
      "worker {} was dropped from the live set (silent for longer than "
      "server.heartbeat_timeout_s = {} s); registering again",
      rank_, config_.server.heartbeat_timeout_s);
  auto registration = coordinator_.Register();
  if (!registration.ok()) return registration.status();
  client_->Rejoined(registration->incarnation());
  // The coordinator gave the chunk in hand to another worker when it
  // dropped this one.
  have_chunk_ = false;
  chunk_samples_ = 0;
  ahead_samples_ = 0;
  ++report_.rejoins;
  spdlog::info("worker {} rejoined as incarnation {}", rank_,
               registration->incarnation());
  return absl::OkStatus();
}

absl::StatusOr<size_t> WorkerSession::NextBatch(Batch* batch) {
  CloseBatch();
  read_ahead_taken_ = false;
  if (finished_) return 0;
  if (coordinator_.dropped()) {
    if (auto s = Rejoin(); !s.ok()) return s;
  }
  batch_began_ = clock_.Now();
  FollowPlan();
  // A batch in hand from now on: counted, its compute timed.
  const auto hand_out = [&](size_t n) -> absl::StatusOr<size_t> {
    if (auto s = device_->CheckMemory(n); !s.ok()) return s;
    batch_samples_ = n;
    report_.positives += static_cast<uint64_t>(
        std::count_if(batch->labels.begin(), batch->labels.end(),
                      [](float label) { return label >= 0.5f; }));
    report_.feature_keys += batch->keys.size();
    unpaced_samples_ += n;
    absl::MutexLock lock(&wait_mu_);
    segment_began_ = clock_.Now();
    return n;
  };
  if (ahead_samples_ > 0) {
    std::swap(*batch, ahead_);
    read_ahead_taken_ = true;
    return hand_out(std::exchange(ahead_samples_, 0));
  }
  while (true) {
    if (have_chunk_) {
      auto n = train_->Next(batch_size_, batch);
      if (!n.ok()) return n.status();
      if (*n > 0) {
        chunk_samples_ += *n;
        return hand_out(*n);
      }
      have_chunk_ = false;
    }
    auto chunk = coordinator_.NextChunk(chunk_samples_);
    if (!chunk.ok()) return chunk.status();
    chunk_samples_ = 0;
    if (chunk->done()) {
      batch->Clear();
      return 0;
    }
    if (auto s = Seek(*chunk); !s.ok()) return s;
  }
}

absl::StatusOr<const Batch*> WorkerSession::ReadAhead() {
  if (ahead_samples_ > 0) return &ahead_;
  if (finished_ || !have_chunk_) return nullptr;
  auto n = train_->Next(batch_size_, &ahead_);
  if (!n.ok()) return n.status();
  if (*n == 0) {
    have_chunk_ = false;
    return nullptr;
  }
  chunk_samples_ += *n;
  ahead_samples_ = *n;
  return &ahead_;
}

void WorkerSession::SetLoss(double loss_sum) { batch_loss_ = loss_sum; }

absl::Status WorkerSession::Waiting(absl::FunctionRef<absl::Status()> f) {
  {
    absl::MutexLock lock(&wait_mu_);
    if (waiting_++ == 0) {
      wait_began_ = clock_.Now();
      computed_s_ += Seconds(wait_began_ - segment_began_);
    }
  }
  const absl::Status s = f();
  absl::MutexLock lock(&wait_mu_);
  if (--waiting_ == 0) {
    segment_began_ = clock_.Now();
    batch_wait_s_ += Seconds(segment_began_ - wait_began_);
  }
  return s;
}

absl::Status WorkerSession::PullSparse(const std::string& table,
                                       std::span<const uint64_t> keys,
                                       std::span<float> out, KeySet key_set) {
  return Waiting([&] {
    const absl::Time began = clock_.Now();
    if (auto s = client_->PullSparse(table, keys, out, key_set); !s.ok()) {
      return s;
    }
    device_->Throttle(keys.size() * 8 + out.size() * 4, began);
    return absl::OkStatus();
  });
}

absl::Status WorkerSession::PullDense(const std::string& table,
                                      std::span<float> out) {
  return Waiting([&] {
    const absl::Time began = clock_.Now();
    if (auto s = client_->PullDense(table, out); !s.ok()) return s;
    device_->Throttle(out.size() * 4, began);
    return absl::OkStatus();
  });
}

void WorkerSession::PaceCompute() {
  absl::Time began;
  {
    absl::MutexLock lock(&wait_mu_);
    const absl::Time now = clock_.Now();
    if (waiting_ == 0) computed_s_ += Seconds(now - segment_began_);
    began = now - absl::Seconds(computed_s_);
  }
  device_->Pace(unpaced_samples_, began);
  absl::MutexLock lock(&wait_mu_);
  const absl::Time now = clock_.Now();
  compute_since_push_s_ += Seconds(now - began);
  computed_s_ = 0;
  segment_began_ = now;
  unpaced_samples_ = 0;
}

absl::Status WorkerSession::Push(std::span<const TableGrad> grads,
                                 uint32_t samples, KeySet key_set) {
  PaceCompute();
  std::vector<GradientShape> parts;
  parts.reserve(grads.size());
  for (const TableGrad& g : grads) {
    if (g.keys.empty() && !g.values.empty()) {
      parts.push_back(ShapeOfDense(g.values));
      continue;
    }
    auto dim = client_->TableDim(g.table);
    if (!dim.ok()) return dim.status();
    if (g.values.size() != g.keys.size() * *dim) {
      return absl::InvalidArgumentError(
          absl::StrCat("push to table '", g.table, "': ", g.values.size(),
                       " values for ", g.keys.size(), " keys of dim ", *dim));
    }
    parts.push_back(ShapeOfRows(static_cast<uint32_t>(*dim), g.values));
  }
  // Pushes of a dropped worker are refused; it asks the coordinator
  // whether that is why.
  const auto discard_if_dropped = [&](absl::Status refused) -> absl::Status {
    if (!coordinator_.dropped()) return refused;
    ++report_.discarded_pushes;
    spdlog::warn(
        "worker {}: push of {} samples discarded ({})", rank_, samples,
        refused.ok() ? "dropped before it was sent" : refused.message());
    return Rejoin();
  };
  if (coordinator_.dropped()) return discard_if_dropped(absl::OkStatus());
  const absl::Time began = clock_.Now();
  PushEncoding* encoding = codec_->Prepare(parts, compute_since_push_s_);
  compute_since_push_s_ = 0;
  if (auto s = client_->Push(grads, samples, key_set, encoding); !s.ok()) {
    if (s.code() != absl::StatusCode::kFailedPrecondition) return s;
    if (auto beat = coordinator_.HeartbeatNow(/*until_answered=*/true);
        !beat.ok()) {
      return s;
    }
    return discard_if_dropped(s);
  }
  ++report_.pushes;
  device_->Throttle(encoding->sent_bytes, began);
  codec_->Finished(Seconds(clock_.Now() - began));
  return absl::OkStatus();
}

void WorkerSession::CloseBatch() {
  if (batch_samples_ == 0) return;
  PaceCompute();
  const uint64_t samples = batch_samples_;
  batch_samples_ = 0;
  const double step_s = Seconds(clock_.Now() - batch_began_);
  double waited;
  {
    absl::MutexLock lock(&wait_mu_);
    waited = std::min(batch_wait_s_, step_s);
    batch_wait_s_ = 0;
  }
  busy_s_ += step_s - waited;
  const double decay = std::exp(-step_s / kThroughputTau);
  recent_samples_ = recent_samples_ * decay + static_cast<double>(samples);
  recent_busy_s_ = recent_busy_s_ * decay + (step_s - waited);
  ++report_.steps;
  report_.samples += samples;
  if (batch_loss_) {
    recent_loss_.push_back(*batch_loss_ / static_cast<double>(samples));
    if (recent_loss_.size() > kRecentLosses) recent_loss_.pop_front();
    batch_loss_.reset();
  }
  if (report_.steps % kLossCurveEvery == 0 && !recent_loss_.empty()) {
    report_.loss_curve.emplace_back(report_.steps, MeanRecentLoss());
    if (auto warning = codec_->CheckConvergence(
            report_.steps, MeanRecentLoss(), RecentLossError())) {
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

rpc::WorkerProgress WorkerSession::Progress() const {
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
  const PullStats pulls = client_->pull_stats();
  p.set_pulled_rows(pulls.pulled_rows);
  p.set_cached_rows(pulls.cached_rows);
  p.set_codec(codec_->codec());
  p.set_codec_reason(codec_->reason());
  p.set_positives(report_.positives);
  p.set_feature_keys(report_.feature_keys);
  for (const std::string& w : report_.warnings) p.add_warnings(w);
  std::optional<EvalPoint> eval;
  if (!report_.evals.empty()) eval = report_.evals.back();
  if (eval_source_) {
    std::optional<EvalPoint> periodic = eval_source_();
    if (periodic && (!eval || periodic->at_s > eval->at_s)) eval = periodic;
  }
  if (eval) {
    p.set_test_auc(eval->auc);
    p.set_test_auc_at_s(eval->at_s);
  }
  return p;
}

double WorkerSession::MeanRecentLoss() const {
  if (recent_loss_.empty()) return 0.0;
  return std::accumulate(recent_loss_.begin(), recent_loss_.end(), 0.0) /
         static_cast<double>(recent_loss_.size());
}

double WorkerSession::RecentLossError() const {
  const size_t n = recent_loss_.size();
  if (n < 2) return 0.0;
  const double mean = MeanRecentLoss();
  double squares = 0;
  for (double l : recent_loss_) squares += (l - mean) * (l - mean);
  return std::sqrt(squares / static_cast<double>(n - 1) /
                   static_cast<double>(n));
}

absl::Status WorkerSession::Finish() {
  if (finished_) return absl::OkStatus();
  CloseBatch();
  finished_ = true;
  train_s_ = SecondsSinceStart();
  report_.malformed_records += train_->stats().malformed;
  if (auto s = coordinator_.Leave(kFinishedItsData); !s.ok()) return s;
  return coordinator_.Barrier("trained");
}

absl::Status WorkerSession::Abandon(const std::string& reason) {
  if (finished_) return absl::OkStatus();
  finished_ = true;
  train_s_ = SecondsSinceStart();
  return coordinator_.Leave(reason);
}

TrainReport WorkerSession::Report() const {
  TrainReport report = report_;
  report.train_s = finished_ ? train_s_ : SecondsSinceStart();
  report.samples_per_s = report.samples / report.train_s;
  report.busy_fraction = busy_s_ / report.train_s;
  report.raw_bytes = codec_->raw_bytes();
  report.sent_bytes = codec_->sent_bytes();
  report.raw_value_bytes = codec_->raw_value_bytes();
  report.sent_value_bytes = codec_->sent_value_bytes();
  report.sent_by_codec = codec_->sent_by_codec();
  report.pulls = client_->pull_stats();
  report.last_loss = MeanRecentLoss();
  // Epoch, periodic and final evaluations in the order they were made.
  std::stable_sort(
      report.evals.begin(), report.evals.end(),
      [](const EvalPoint& a, const EvalPoint& b) { return a.at_s < b.at_s; });
  return report;
}

void WorkerSession::AddEval(const EvalPoint& point) {
  report_.evals.push_back(point);
}

void WorkerSession::SetFinalEval(double auc, double logloss) {
  report_.test_auc = auc;
  report_.test_logloss = logloss;
}

void WorkerSession::AddMalformed(uint64_t records) {
  report_.malformed_records += records;
}

std::string ReportToJson(const TrainReport& report) {
  nlohmann::json j = {{"rank", report.rank},
                      {"steps", report.steps},
                      {"pushes", report.pushes},
                      {"chunks", report.chunks},
                      {"rejoins", report.rejoins},
                      {"discarded_pushes", report.discarded_pushes},
                      {"busy_fraction", report.busy_fraction},
                      {"emulated", report.emulated},
                      {"device", report.device},
                      {"raw_bytes", report.raw_bytes},
                      {"sent_bytes", report.sent_bytes},
                      {"raw_value_bytes", report.raw_value_bytes},
                      {"sent_value_bytes", report.sent_value_bytes},
                      {"pulled_rows", report.pulls.pulled_rows},
                      {"pulled_bytes", report.pulls.pulled_bytes},
                      {"cached_rows", report.pulls.cached_rows},
                      {"refetched_rows", report.pulls.refetched_rows},
                      {"loss_curve", report.loss_curve},
                      {"warnings", report.warnings},
                      {"samples", report.samples},
                      {"positives", report.positives},
                      {"feature_keys", report.feature_keys},
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
  if (!report.calibration.is_null()) j["calibration"] = report.calibration;
  return j.dump();
}

absl::StatusOr<std::unique_ptr<PsClient>> ConnectClient(const JobConfig& config,
                                                        uint32_t worker_id,
                                                        uint32_t incarnation) {
  PsClientOptions options;
  options.endpoints = config.cluster.ps_endpoints;
  options.worker_id = worker_id;
  options.incarnation = incarnation;
  options.rpc = config.client;
  options.max_message_bytes = config.server.max_message_bytes;
  options.credentials = config.credentials;
  // Sync rounds and the semi_async clocks need every server to see every
  // push, even one without keys of its own.
  options.push_to_all_servers = config.mode != ConsistencyMode::kAsync;
  options.error_feedback = config.compress.error_feedback;
  return PsClient::Connect(options);
}

}  // namespace hetps
