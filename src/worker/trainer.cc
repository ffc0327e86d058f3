#include "worker/trainer.h"

#include <chrono>
#include <cmath>
#include <deque>
#include <numeric>
#include <vector>

#include "absl/strings/str_cat.h"
#include "client/unique_keys.h"
#include "common/logging.h"
#include "coord/coordinator.h"
#include "data/reader.h"
#include "hetps/ps_client.h"
#include "model/metrics.h"
#include "model/model.h"
#include "nlohmann/json.hpp"

namespace hetps {
namespace {

using Clock = std::chrono::steady_clock;

// Everything one training loop reuses from batch to batch.
// The batch's distinct keys: the pull fetches each row once and the push
// carries each row's summed gradient, so the client skips its own dedup.
struct Step {
  Batch batch;
  UniqueKeys unique;
  std::vector<float> rows, dense, row_grads, dense_grad, p;
};

class Worker {
 public:
  Worker(const JobConfig& config, uint32_t rank, std::unique_ptr<Model> model,
         std::unique_ptr<PsClient> client)
      : config_(config),
        rank_(rank),
        model_(std::move(model)),
        client_(std::move(client)),
        tables_(model_->Tables()) {}

  // Pulls what `step.batch` needs into step.rows / step.dense.
  absl::Status Pull(Step& step) {
    step.unique.Build(step.batch.keys);
    step.rows.resize(step.unique.keys().size() * model_->row_dim());
    if (auto s = client_->PullSparse(sparse_table(), step.unique.keys(),
                                     step.rows, KeySet::kUnique);
        !s.ok()) {
      return s;
    }
    step.dense.resize(model_->dense_size());
    return client_->PullDense(dense_table(), step.dense);
  }

  // One training step; returns the batch's summed loss.
  absl::StatusOr<double> TrainStep(Step& step) {
    if (auto s = Pull(step); !s.ok()) return s;
    const size_t n = step.batch.size();
    step.p.resize(n);
    step.row_grads.resize(step.rows.size());
    step.dense_grad.resize(step.dense.size());
    const double loss = model_->Train(
        step.batch, {step.unique.position(), step.rows, step.dense}, step.p,
        step.row_grads, step.dense_grad);
    const TableGrad grads[] = {
        {sparse_table(), step.unique.keys(), step.row_grads},
        {dense_table(), {}, step.dense_grad}};
    if (auto s =
            client_->Push(grads, static_cast<uint32_t>(n), KeySet::kUnique);
        !s.ok()) {
      return s;
    }
    return loss;
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
      model_->Predict(step.batch,
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
  const JobConfig& config_;
  const uint32_t rank_;
  const std::unique_ptr<Model> model_;
  const std::unique_ptr<PsClient> client_;
  const std::vector<TableConfig> tables_;
};

void LogMalformed(const ReaderStats& stats) {
  if (stats.malformed == 0) return;
  spdlog::warn("{} of {} records malformed and skipped; first: {}",
               stats.malformed, stats.records,
               stats.examples.empty() ? "" : stats.examples.front());
  for (size_t i = 1; i < stats.examples.size(); ++i) {
    spdlog::warn("  {}", stats.examples[i]);
  }
}

}  // namespace

absl::StatusOr<TrainReport> RunWorker(const JobConfig& config, uint32_t rank) {
  if (config.train.model == "none") {
    return absl::UnimplementedError(
        "train.model: 'none' has no built-in trainer (drive the PsClient API "
        "instead)");
  }
  auto shape = ShapeOf(config.train.data);
  if (!shape.ok()) return shape.status();
  auto model = Model::Create(config.train, shape->num_slots, shape->num_dense);
  if (!model.ok()) return model.status();
  const uint32_t workers = static_cast<uint32_t>(config.num_workers());
  auto train = OpenReader(config.train.data, Split::kTrain, rank, workers);
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
  PsClientOptions options;
  options.endpoints = config.cluster.ps_endpoints;
  options.worker_id = rank;
  options.rpc = config.client;
  options.max_message_bytes = config.server.max_message_bytes;
  options.push_to_all_servers = config.mode == ConsistencyMode::kSync;
  auto client = PsClient::Connect(options);
  if (!client.ok()) return client.status();
  Worker worker(config, rank, *std::move(model), *std::move(client));

  coordinator.StartHeartbeats();
  if (auto s = coordinator.Barrier("start"); !s.ok()) return s;
  spdlog::info("training {} on {} ({} slots, {} dense), batch {}",
               config.train.model, config.train.data.format, shape->num_slots,
               shape->num_dense, config.train.batch_size);

  TrainReport report;
  report.rank = rank;
  Step step;
  std::deque<double> recent_loss;
  const auto mean_recent = [&] {
    return recent_loss.empty()
               ? 0.0
               : std::accumulate(recent_loss.begin(), recent_loss.end(), 0.0) /
                     recent_loss.size();
  };
  const auto start = Clock::now();
  auto last_log = start;
  const auto elapsed = [&] {
    return std::chrono::duration<double>(Clock::now() - start).count();
  };

  for (int epoch = 0; epoch < config.train.epochs; ++epoch) {
    if (epoch > 0) {
      if (auto s = (*train)->Rewind(); !s.ok()) return s;
    }
    while (true) {
      auto n = (*train)->Next(config.train.batch_size, &step.batch);
      if (!n.ok()) return n.status();
      if (*n == 0) break;
      auto loss = worker.TrainStep(step);
      if (!loss.ok()) return loss.status();
      ++report.steps;
      report.samples += *n;
      recent_loss.push_back(*loss / *n);
      if (recent_loss.size() > 50) recent_loss.pop_front();
      const double seconds = elapsed();
      coordinator.ReportProgress(report.steps, report.samples,
                                 report.samples / std::max(seconds, 1e-9));
      if (Clock::now() - last_log > std::chrono::seconds(2)) {
        last_log = Clock::now();
        spdlog::info("epoch {} step {} loss {:.4f} {:.0f} samples/s", epoch + 1,
                     report.steps, mean_recent(),
                     report.samples / std::max(seconds, 1e-9));
      }
    }
    const bool last = epoch + 1 == config.train.epochs;
    if (test && !last && (epoch + 1) % config.train.eval_every_epochs == 0) {
      auto point = worker.Evaluate(*test);
      if (!point.ok()) return point.status();
      point->epoch = epoch + 1;
      point->at_s = elapsed();
      report.evals.push_back(*point);
      spdlog::info("epoch {}: test AUC {:.4f} logloss {:.4f}", epoch + 1,
                   point->auc, point->logloss);
    }
  }
  report.train_s = elapsed();
  report.samples_per_s = report.samples / std::max(report.train_s, 1e-9);
  report.last_loss = mean_recent();
  report.malformed_records = (*train)->stats().malformed;
  LogMalformed((*train)->stats());

  // Leave the live set (nobody waits for this worker any more), then wait
  // until every worker has left: the model is final.
  if (auto s = coordinator.Leave("finished its data"); !s.ok()) return s;
  if (auto s = coordinator.Barrier("trained"); !s.ok()) return s;

  if (test) {
    auto point = worker.Evaluate(*test);
    if (!point.ok()) return point.status();
    point->epoch = config.train.epochs;
    point->at_s = elapsed();
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
  return j.dump();
}

}  // namespace hetps
