#include "worker/trainer.h"

#include <chrono>
#include <cmath>
#include <condition_variable>
#include <deque>
#include <limits>
#include <mutex>
#include <numeric>
#include <thread>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "client/unique_keys.h"
#include "common/logging.h"
#include "coord/coordinator.h"
#include "data/reader.h"
#include "hetps/ps_client.h"
#include "model/metrics.h"
#include "model/model.h"
#include "nlohmann/json.hpp"
#include "worker/device_profile.h"
#include "worker/push_codec.h"

namespace hetps {
namespace {

using Clock = std::chrono::steady_clock;

// Steps between two points of the loss curve (report, over-compression).
constexpr uint64_t kLossCurveEvery = 20;

double SecondsSince(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

// Everything one training loop reuses from batch to batch.
// The batch's distinct keys: the pull fetches each row once and the push
// carries each row's summed gradient, so the client skips its own dedup.
struct Step {
  Batch batch;
  UniqueKeys unique;
  std::vector<float> rows, dense, row_grads, dense_grad, p;
};

// Gradients of push_freq batches summed, each weighted by its batch size.
class Accumulator {
 public:
  void Add(std::span<const uint64_t> keys, std::span<const float> row_grads,
           uint64_t row_dim, std::span<const float> dense_grad, uint32_t n) {
    const float w = static_cast<float>(n);
    for (size_t i = 0; i < keys.size(); ++i) {
      auto [it, inserted] =
          index_.try_emplace(keys[i], static_cast<uint32_t>(keys_.size()));
      if (inserted) {
        keys_.push_back(keys[i]);
        rows_.resize(rows_.size() + row_dim, 0.0f);
      }
      float* dst = &rows_[static_cast<size_t>(it->second) * row_dim];
      for (uint64_t j = 0; j < row_dim; ++j) {
        dst[j] += w * row_grads[i * row_dim + j];
      }
    }
    dense_.resize(dense_grad.size(), 0.0f);
    for (size_t j = 0; j < dense_grad.size(); ++j)
      dense_[j] += w * dense_grad[j];
    samples_ += n;
    ++batches_;
  }

  // Turns the sums into the mean gradient of all samples added.
  void Finish() {
    const float scale =
        1.0f / static_cast<float>(std::max<uint32_t>(1, samples_));
    for (float& v : rows_) v *= scale;
    for (float& v : dense_) v *= scale;
  }

  void Clear() {
    index_.clear();
    keys_.clear();
    rows_.clear();
    dense_.clear();
    samples_ = 0;
    batches_ = 0;
  }

  uint32_t batches() const { return batches_; }
  uint32_t samples() const { return samples_; }
  std::span<const uint64_t> keys() const { return keys_; }
  std::span<const float> rows() const { return rows_; }
  std::span<const float> dense() const { return dense_; }

 private:
  absl::flat_hash_map<uint64_t, uint32_t> index_;
  std::vector<uint64_t> keys_;
  std::vector<float> rows_, dense_;
  uint32_t samples_ = 0;
  uint32_t batches_ = 0;
};

class Worker {
 public:
  Worker(const Model& model, PsClient& client, const DeviceProfile& device)
      : model_(model),
        client_(client),
        device_(device),
        tables_(model_.Tables()) {}

  // Pulls what `step.batch` needs into step.rows / step.dense.
  absl::Status Pull(Step& step) {
    const auto began = Clock::now();
    step.unique.Build(step.batch.keys);
    step.rows.resize(step.unique.keys().size() * model_.row_dim());
    if (auto s = client_.PullSparse(sparse_table(), step.unique.keys(),
                                    step.rows, KeySet::kUnique);
        !s.ok()) {
      return s;
    }
    step.dense.resize(model_.dense_size());
    if (auto s = client_.PullDense(dense_table(), step.dense); !s.ok())
      return s;
    device_.Throttle(step.unique.keys().size() * 8 +
                         (step.rows.size() + step.dense.size()) * 4,
                     began);
    return absl::OkStatus();
  }

  // Forward and backward on the pulled parameters; returns the summed loss.
  double Compute(Step& step) {
    const size_t n = step.batch.size();
    step.p.resize(n);
    step.row_grads.resize(step.rows.size());
    step.dense_grad.resize(step.dense.size());
    return model_.Train(step.batch,
                        {step.unique.position(), step.rows, step.dense}, step.p,
                        step.row_grads, step.dense_grad);
  }

  // Pushes one gradient, encoded as `codec` chooses after `compute_s` of
  // compute; the emulated link is throttled by the bytes actually sent.
  absl::Status Push(std::span<const uint64_t> keys, std::span<const float> rows,
                    std::span<const float> dense, uint32_t samples,
                    PushCodec& codec, double compute_s) {
    const auto began = Clock::now();
    const TableGrad grads[] = {{sparse_table(), keys, rows},
                               {dense_table(), {}, dense}};
    const GradientShape parts[] = {
        ShapeOfRows(static_cast<uint32_t>(model_.row_dim()), rows),
        ShapeOfDense(dense)};
    PushEncoding* encoding = codec.Prepare(parts, compute_s);
    if (auto s = client_.Push(grads, samples, KeySet::kUnique, encoding);
        !s.ok()) {
      return s;
    }
    device_.Throttle(encoding->sent_bytes, began);
    codec.Finished(SecondsSince(began));
    return absl::OkStatus();
  }

  // AUC and logloss of the current model on `reader`'s whole share.
  absl::StatusOr<EvalPoint> Evaluate(Reader& reader) {
    if (auto s = reader.Rewind(); !s.ok()) return s;
    Step step;
    std::vector<float> scores, labels;
    while (true) {
      auto n = reader.Next(4096, &step.batch);
      if (!n.ok()) return n.status();
      if (*n == 0) break;
      if (auto s = Pull(step); !s.ok()) return s;
      step.p.resize(*n);
      model_.Predict(step.batch,
                     {step.unique.position(), step.rows, step.dense}, step.p);
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

  const std::string& sparse_table() const { return tables_[0].name; }
  const std::string& dense_table() const { return tables_[1].name; }

 private:
  const Model& model_;
  PsClient& client_;
  const DeviceProfile& device_;
  const std::vector<TableConfig> tables_;
};

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

// Rank 0's evaluation every train.eval_every_s, on its own thread and
// client, so that measuring the AUC over time costs the training loop
// nothing but CPU.
class PeriodicEvaluator {
 public:
  PeriodicEvaluator(const JobConfig& config, const Model& model,
                    Clock::time_point start)
      : config_(config), model_(model), start_(start) {}

  absl::Status Start() {
    auto reader = OpenReader(config_.train.data, Split::kTest, 0, 1);
    if (!reader.ok()) return reader.status();
    reader_ = std::move(*reader);
    auto client = ConnectClient(config_, kReaderId, 0);
    if (!client.ok()) return client.status();
    client_ = std::move(*client);
    thread_ = std::thread([this] { Run(); });
    return absl::OkStatus();
  }

  // Stops the thread; returns the evaluations made.
  std::vector<EvalPoint> Stop() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    if (thread_.joinable()) thread_.join();
    return points_;
  }

  ~PeriodicEvaluator() { Stop(); }

 private:
  void Run() {
    const DeviceProfile none(nullptr, 0, start_);
    Worker evaluator(model_, *client_, none);
    const auto every =
        std::chrono::duration<double>(config_.train.eval_every_s);
    std::unique_lock<std::mutex> lock(mu_);
    while (!cv_.wait_for(lock, every, [this] { return stop_; })) {
      lock.unlock();
      const double at = SecondsSince(start_);
      absl::StatusOr<EvalPoint> point = evaluator.Evaluate(*reader_);
      lock.lock();
      if (!point.ok()) {
        spdlog::warn("periodic evaluation failed: {}",
                     point.status().message());
        continue;
      }
      point->at_s = at;
      point->epoch = -1;
      points_.push_back(*point);
      spdlog::info("{:.1f} s: test AUC {:.4f} logloss {:.4f}", at, point->auc,
                   point->logloss);
    }
  }

  const JobConfig& config_;
  const Model& model_;
  const Clock::time_point start_;
  std::unique_ptr<Reader> reader_;
  std::unique_ptr<PsClient> client_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;              // guarded by mu_
  std::vector<EvalPoint> points_;  // guarded by mu_
  std::thread thread_;
};

}  // namespace

absl::StatusOr<TrainReport> RunWorker(const JobConfig& config,
                                      const JobShape& shape, uint32_t rank) {
  if (config.train.model == "none") {
    return absl::UnimplementedError(
        "train.model: 'none' has no built-in trainer (drive the PsClient API "
        "instead)");
  }
  auto model =
      Model::Create(config.train, shape.data.num_slots, shape.data.num_dense);
  if (!model.ok()) return model.status();
  const uint32_t chunks = TrainChunks(config);
  auto train = OpenReader(config.train.data, Split::kTrain, 0, chunks);
  if (!train.ok()) return train.status();
  std::unique_ptr<Reader> test;
  if (rank == 0) {
    auto opened = OpenReader(config.train.data, Split::kTest, 0, 1);
    if (!opened.ok()) return opened.status();
    test = std::move(*opened);
  }

  CoordinatorClient coordinator(config, rank);
  auto registration = coordinator.Register();
  if (!registration.ok()) return registration.status();
  auto client = ConnectClient(config, rank, registration->incarnation());
  if (!client.ok()) return client.status();

  // The first plan before the first batch (a plain batch_size if the
  // coordinator cannot say yet).
  if (auto s = coordinator.HeartbeatNow(); !s.ok()) {
    spdlog::warn("no batch plan yet ({}); starting with train.batch_size",
                 s.message());
  }
  coordinator.StartHeartbeats();
  if (auto s = coordinator.Barrier("start"); !s.ok()) return s;

  const auto start = Clock::now();
  const DeviceProfile device(config.ProfileOf(rank), shape.bytes_per_sample,
                             start);
  Worker worker(**model, **client, device);
  spdlog::info("training {} on {} ({} slots, {} dense); {}", config.train.model,
               config.train.data.format, shape.data.num_slots,
               shape.data.num_dense, device.Describe());
  PeriodicEvaluator periodic(config, **model, start);
  if (rank == 0 && config.train.eval_every_s > 0) {
    if (auto s = periodic.Start(); !s.ok()) return s;
  }

  TrainReport report;
  report.rank = rank;
  report.emulated = device.emulated();
  report.device = device.Describe();
  auto codec = PushCodec::Create(config, config.ProfileOf(rank));
  if (!codec.ok()) return codec.status();
  Step step;
  Accumulator accumulated;
  std::deque<double> recent_loss;
  const auto mean_recent = [&] {
    return recent_loss.empty()
               ? 0.0
               : std::accumulate(recent_loss.begin(), recent_loss.end(), 0.0) /
                     recent_loss.size();
  };
  auto last_log = start;
  double busy_s = 0;  // time outside pulls
  // Samples per busy second over the last few seconds (exponentially
  // decayed, time constant kThroughputTau): what the planner re-plans from,
  // so a slow-down shows within seconds, not diluted by the whole run.
  constexpr double kThroughputTau = 2.0;
  double recent_samples = 0;
  double recent_busy_s = 0;
  uint64_t plan_version = 0;
  double compute_since_push_s = 0;  // compute behind the next push
  uint32_t batch_size = static_cast<uint32_t>(config.train.batch_size);
  uint32_t push_freq = 1;

  const auto push_accumulated = [&]() -> absl::Status {
    if (accumulated.batches() == 0) return absl::OkStatus();
    accumulated.Finish();
    const absl::Status s =
        worker.Push(accumulated.keys(), accumulated.rows(), accumulated.dense(),
                    accumulated.samples(), **codec, compute_since_push_s);
    compute_since_push_s = 0;
    accumulated.Clear();
    ++report.pushes;
    return s;
  };

  int epoch = 0;               // epoch of the current chunk
  uint64_t chunk_samples = 0;  // trained from the chunk in hand
  while (true) {
    auto chunk = coordinator.NextChunk(chunk_samples);
    chunk_samples = 0;
    if (!chunk.ok()) return chunk.status();
    if (chunk->done()) break;
    if (static_cast<int>(chunk->epoch()) > epoch) {
      // Rank 0 has moved on to the next epoch: evaluate the one before.
      // (Other workers may still be finishing their last chunks of it.)
      if (test && chunk->epoch() % config.train.eval_every_epochs == 0) {
        auto point = worker.Evaluate(*test);
        if (!point.ok()) return point.status();
        point->epoch = static_cast<int>(chunk->epoch());
        point->at_s = SecondsSince(start);
        report.evals.push_back(*point);
        spdlog::info("epoch {}: test AUC {:.4f} logloss {:.4f}", chunk->epoch(),
                     point->auc, point->logloss);
      }
      epoch = static_cast<int>(chunk->epoch());
    }
    // One reader for every chunk: its shards are the chunks (or quarters of
    // them at the end of the job).
    if (chunk->chunks() % chunks != 0) {
      return absl::FailedPreconditionError(absl::StrCat(
          "the coordinator cuts the data into ", chunk->chunks(),
          " chunks, this worker into ", chunks,
          " (train.data.chunks differs between the nodes' configs)"));
    }
    // A pass's stats end with it: keep the count of each chunk.
    report.malformed_records += (*train)->stats().malformed;
    if (auto s =
            (*train)->Seek(chunk->chunk(), chunk->chunks(), chunk->epoch());
        !s.ok()) {
      return s;
    }
    ++report.chunks;
    while (true) {
      const rpc::BatchPlan plan = coordinator.plan();
      if (plan.version() != plan_version && plan.batch_size() > 0) {
        plan_version = plan.version();
        batch_size = plan.batch_size();
        push_freq = std::max<uint32_t>(1, plan.push_freq());
        spdlog::info("plan {}: batch {} push_freq {} ({})", plan_version,
                     batch_size, push_freq, plan.reason());
      }
      const auto began = Clock::now();
      auto n = (*train)->Next(batch_size, &step.batch);
      if (!n.ok()) return n.status();
      if (*n == 0) break;
      if (auto s = device.CheckMemory(*n); !s.ok()) return s;
      const auto pull_began = Clock::now();
      if (auto s = worker.Pull(step); !s.ok()) return s;
      const double pulled = SecondsSince(pull_began);
      const auto compute_began = Clock::now();
      const double loss = worker.Compute(step);
      device.Pace(*n, compute_began);
      compute_since_push_s += SecondsSince(compute_began);
      if (push_freq == 1) {
        if (auto s = worker.Push(step.unique.keys(), step.row_grads,
                                 step.dense_grad, static_cast<uint32_t>(*n),
                                 **codec, compute_since_push_s);
            !s.ok()) {
          return s;
        }
        compute_since_push_s = 0;
        ++report.pushes;
      } else {
        accumulated.Add(step.unique.keys(), step.row_grads, (*model)->row_dim(),
                        step.dense_grad, static_cast<uint32_t>(*n));
        if (accumulated.batches() >= push_freq) {
          if (auto s = push_accumulated(); !s.ok()) return s;
        }
      }
      const double step_s = SecondsSince(began);
      busy_s += step_s - pulled;
      const double decay = std::exp(-step_s / kThroughputTau);
      recent_samples = recent_samples * decay + static_cast<double>(*n);
      recent_busy_s = recent_busy_s * decay + (step_s - pulled);
      ++report.steps;
      report.samples += *n;
      chunk_samples += *n;
      recent_loss.push_back(loss / *n);
      if (recent_loss.size() > 50) recent_loss.pop_front();
      if (report.steps % kLossCurveEvery == 0) {
        report.loss_curve.emplace_back(report.steps, mean_recent());
        if (auto warning =
                (*codec)->CheckConvergence(report.steps, mean_recent())) {
          spdlog::warn("{}", *warning);
          report.warnings.push_back(*warning);
        }
      }
      const double seconds = std::max(SecondsSince(start), 1e-9);
      coordinator.ReportProgress(
          {.step = report.steps,
           .samples = report.samples,
           .samples_per_s = report.samples / seconds,
           .clock = (*client)->clock(),
           .batch_size = batch_size,
           .push_freq = push_freq,
           .busy_fraction = busy_s / seconds,
           .compute_samples_per_s =
               recent_samples / std::max(recent_busy_s, 1e-9),
           .emulated = device.emulated(),
           .memory_mb = device.memory_mb(),
           .raw_bytes = (*codec)->raw_bytes(),
           .sent_bytes = (*codec)->sent_bytes(),
           .codec = (*codec)->codec(),
           .codec_reason = (*codec)->reason()});
      if (Clock::now() - last_log > std::chrono::seconds(2)) {
        last_log = Clock::now();
        spdlog::info(
            "epoch {} step {} loss {:.4f} {:.0f} samples/s, busy {:.0f}%",
            epoch + 1, report.steps, mean_recent(), report.samples / seconds,
            100 * busy_s / seconds);
      }
    }
  }
  if (auto s = push_accumulated(); !s.ok()) return s;
  report.train_s = SecondsSince(start);
  report.samples_per_s = report.samples / std::max(report.train_s, 1e-9);
  report.busy_fraction = busy_s / std::max(report.train_s, 1e-9);
  report.raw_bytes = (*codec)->raw_bytes();
  report.sent_bytes = (*codec)->sent_bytes();
  report.raw_value_bytes = (*codec)->raw_value_bytes();
  report.sent_value_bytes = (*codec)->sent_value_bytes();
  report.sent_by_codec = (*codec)->sent_by_codec();
  report.last_loss = mean_recent();
  report.malformed_records += (*train)->stats().malformed;

  // Leave the live set (nobody waits for this worker any more), then wait
  // until every worker has left: the model is final.
  if (auto s = coordinator.Leave("finished its data"); !s.ok()) return s;
  if (auto s = coordinator.Barrier("trained"); !s.ok()) return s;
  std::vector<EvalPoint> over_time = periodic.Stop();
  report.evals.insert(report.evals.begin(), over_time.begin(), over_time.end());

  if (test) {
    auto point = worker.Evaluate(*test);
    if (!point.ok()) return point.status();
    point->epoch = config.train.epochs;
    point->at_s = SecondsSince(start);
    report.evals.push_back(*point);
    report.test_auc = point->auc;
    report.test_logloss = point->logloss;
    report.malformed_records += test->stats().malformed;
    spdlog::info(
        "final model: test AUC {:.4f} logloss {:.4f} on {} held-out "
        "samples",
        point->auc, point->logloss, test->stats().samples);
  }
  return report;
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
