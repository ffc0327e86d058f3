#include "worker/trainer.h"

#include <chrono>
#include <cmath>
#include <deque>
#include <numeric>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "coord/coordinator.h"
#include "data/synthetic.h"
#include "hetps/ps_client.h"
#include "model/metrics.h"
#include "nlohmann/json.hpp"
#include "common/logging.h"

namespace hetps {
namespace {

using Clock = std::chrono::steady_clock;

constexpr const char* kWeights = "lr_w";
constexpr const char* kBias = "lr_b";

float Sigmoid(float z) { return 1.0f / (1.0f + std::exp(-z)); }

// A batch's keys reduced to unique rows plus, per feature occurrence, the
// row it reads.
struct UniqueKeys {
  std::vector<uint64_t> keys;
  std::vector<uint32_t> row;  // per occurrence

  void Build(std::span<const uint64_t> occurrences) {
    keys.clear();
    row.resize(occurrences.size());
    index_.clear();
    for (size_t i = 0; i < occurrences.size(); ++i) {
      auto [it, inserted] = index_.try_emplace(
          occurrences[i], static_cast<uint32_t>(keys.size()));
      if (inserted) keys.push_back(occurrences[i]);
      row[i] = it->second;
    }
  }

 private:
  absl::flat_hash_map<uint64_t, uint32_t> index_;
};

// Scores (probabilities) of logistic regression on `n` samples.
absl::Status Predict(PsClient& client, std::span<const uint64_t> keys,
                     int fields, std::vector<float>& p) {
  UniqueKeys unique;
  unique.Build(keys);
  std::vector<float> w(unique.keys.size());
  float bias = 0;
  if (auto s = client.PullSparse(kWeights, unique.keys, w, KeySet::kUnique);
      !s.ok()) {
    return s;
  }
  if (auto s = client.PullDense(kBias, std::span<float>(&bias, 1)); !s.ok()) {
    return s;
  }
  const size_t n = keys.size() / fields;
  p.resize(n);
  for (size_t i = 0; i < n; ++i) {
    float z = bias;
    for (int f = 0; f < fields; ++f) z += w[unique.row[i * fields + f]];
    p[i] = Sigmoid(z);
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<TrainReport> RunWorker(const JobConfig& config, uint32_t rank) {
  if (config.train.model != "lr") {
    return absl::UnimplementedError(absl::StrCat(
        "train.model: '", config.train.model,
        "' has no built-in trainer (drive the PsClient API instead)"));
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

  coordinator.StartHeartbeats();
  if (auto s = coordinator.Barrier("start"); !s.ok()) return s;

  const SyntheticLrData data(config.train.data);
  const int fields = data.fields();
  const uint32_t workers = static_cast<uint32_t>(config.num_workers());
  const uint64_t my_samples =
      data.train_size() / workers + (rank < data.train_size() % workers);
  const uint32_t batch = static_cast<uint32_t>(config.train.batch_size);

  TrainReport report;
  report.rank = rank;
  std::vector<uint64_t> keys;
  std::vector<float> labels;
  UniqueKeys unique;
  std::vector<float> w, grad_w;
  std::deque<double> recent_loss;
  const auto start = Clock::now();
  auto last_log = start;

  for (int epoch = 0; epoch < config.train.epochs; ++epoch) {
    for (uint64_t first = 0; first < my_samples; first += batch) {
      const uint64_t n = std::min<uint64_t>(batch, my_samples - first);
      keys.resize(n * fields);
      labels.resize(n);
      for (uint64_t i = 0; i < n; ++i) {
        // Sample j of this worker's share is global sample j·W + rank.
        labels[i] = data.TrainSample((first + i) * workers + rank,
                                     std::span(&keys[i * fields], fields));
      }
      unique.Build(keys);
      w.resize(unique.keys.size());
      float bias = 0;
      if (auto s = (*client)->PullSparse(kWeights, unique.keys, w,
                                         KeySet::kUnique);
          !s.ok()) {
        return s;
      }
      if (auto s = (*client)->PullDense(kBias, std::span<float>(&bias, 1));
          !s.ok()) {
        return s;
      }
      // Forward and backward of the mean logloss over the batch.
      grad_w.assign(unique.keys.size(), 0.0f);
      float grad_b = 0;
      double loss = 0;
      for (uint64_t i = 0; i < n; ++i) {
        float z = bias;
        for (int f = 0; f < fields; ++f) z += w[unique.row[i * fields + f]];
        const float p = Sigmoid(z);
        loss -= labels[i] > 0.5f ? std::log(std::max(p, 1e-7f))
                                 : std::log(std::max(1 - p, 1e-7f));
        const float g = (p - labels[i]) / static_cast<float>(n);
        for (int f = 0; f < fields; ++f) grad_w[unique.row[i * fields + f]] += g;
        grad_b += g;
      }
      const TableGrad grads[] = {
          {kWeights, unique.keys, grad_w},
          {kBias, {}, std::span<const float>(&grad_b, 1)}};
      if (auto s = (*client)->Push(grads, static_cast<uint32_t>(n),
                                   KeySet::kUnique);
          !s.ok()) {
        return s;
      }
      ++report.steps;
      report.samples += n;
      recent_loss.push_back(loss / n);
      if (recent_loss.size() > 50) recent_loss.pop_front();

      const auto now = Clock::now();
      const double elapsed = std::chrono::duration<double>(now - start).count();
      coordinator.ReportProgress(report.steps, report.samples,
                                 report.samples / std::max(elapsed, 1e-9));
      if (now - last_log > std::chrono::seconds(2)) {
        last_log = now;
        spdlog::info("epoch {} step {} loss {:.4f} {:.0f} samples/s", epoch + 1,
                     report.steps,
                     std::accumulate(recent_loss.begin(), recent_loss.end(),
                                     0.0) / recent_loss.size(),
                     report.samples / std::max(elapsed, 1e-9));
      }
    }
  }
  report.train_s = std::chrono::duration<double>(Clock::now() - start).count();
  report.samples_per_s = report.samples / std::max(report.train_s, 1e-9);
  report.last_loss =
      recent_loss.empty()
          ? 0
          : std::accumulate(recent_loss.begin(), recent_loss.end(), 0.0) /
                recent_loss.size();

  // Leave the live set (nobody waits for this worker any more), then wait
  // until every worker has left: the model is final.
  if (auto s = coordinator.Leave("finished its data"); !s.ok()) return s;
  if (auto s = coordinator.Barrier("trained"); !s.ok()) return s;

  if (rank == 0) {
    std::vector<uint64_t> test_keys(data.test_size() * fields);
    std::vector<float> test_labels(data.test_size());
    for (uint64_t i = 0; i < data.test_size(); ++i) {
      test_labels[i] =
          data.TestSample(i, std::span(&test_keys[i * fields], fields));
    }
    std::vector<float> p;
    if (auto s = Predict(**client, test_keys, fields, p); !s.ok()) return s;
    report.test_auc = Auc(p, test_labels);
    report.test_logloss = LogLoss(p, test_labels);
    spdlog::info("test AUC {:.4f} logloss {:.4f} on {} held-out samples",
                 *report.test_auc, *report.test_logloss, data.test_size());
  }
  return report;
}

std::string ReportToJson(const TrainReport& report) {
  nlohmann::json j = {{"rank", report.rank},
                      {"steps", report.steps},
                      {"samples", report.samples},
                      {"train_s", report.train_s},
                      {"samples_per_s", report.samples_per_s},
                      {"last_loss", report.last_loss}};
  if (report.test_auc) j["test_auc"] = *report.test_auc;
  if (report.test_logloss) j["test_logloss"] = *report.test_logloss;
  return j.dump();
}

}  // namespace hetps
