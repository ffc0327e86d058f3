#include "worker/calibration.h"

#include <algorithm>
#include <random>

#include "common/logging.h"
#include "common/median.h"
#include "shard/shard_map.h"
#include "worker/trainer.h"

namespace hetps {
namespace {

constexpr size_t kProbeKeysPerServer = 4096;
constexpr int kProbePulls = 3;
constexpr int kDriftSlices = 8;
constexpr uint32_t kLargestBatch = 65536;  // the memory probe's end
constexpr double kPlateau = 0.9;  // the best batch: the smallest this close

// Per server, the payload bandwidth of pulling rows it owns (Mbit/s).
// Keys of their own (a fixed seed): the calibration job's model is thrown
// away, and pulls at clock 0 wait for nobody in any mode.
absl::StatusOr<std::vector<double>> ProbeLinks(Trainer& trainer,
                                               const JobConfig& config,
                                               Clock& clock) {
  const uint32_t servers = static_cast<uint32_t>(config.num_servers());
  const ShardMap map = ShardMap::Uniform(servers, config.server.num_buckets);
  std::vector<std::vector<uint64_t>> keys(servers);
  std::mt19937_64 random(20261202);
  size_t full = 0;
  while (full < servers) {
    const uint64_t key = random();
    std::vector<uint64_t>& mine = keys[map.ServerOf(key)];
    if (mine.size() < kProbeKeysPerServer) {
      mine.push_back(key);
      if (mine.size() == kProbeKeysPerServer) ++full;
    }
  }
  const std::string table = trainer.model().Tables()[0].name;
  const uint64_t row_dim = trainer.model().row_dim();
  std::vector<float> rows(kProbeKeysPerServer * row_dim);
  const double bytes = kProbeKeysPerServer * (8.0 + 4.0 * row_dim);
  std::vector<double> mbps;
  for (uint32_t s = 0; s < servers; ++s) {
    std::vector<double> rates;
    for (int i = 0; i < kProbePulls; ++i) {
      const absl::Time began = clock.Now();
      if (auto st = trainer.session().PullSparse(table, keys[s], rows,
                                                 KeySet::kUnique);
          !st.ok()) {
        return st;
      }
      const double seconds = absl::ToDoubleSeconds(clock.Now() - began);
      rates.push_back(bytes * 8 / std::max(seconds, 1e-6) / 1e6);
    }
    mbps.push_back(Median(rates));
  }
  return mbps;
}

// Trains for `seconds` (or until the data ends); the compute rate over it.
// `more` turns false when no data is left.
absl::StatusOr<double> RateOver(Trainer& trainer, double seconds, Clock& clock,
                                bool* more) {
  WorkerSession& session = trainer.session();
  const absl::Time until = clock.Now() + absl::Seconds(seconds);
  const uint64_t samples = session.samples();
  const double busy = session.busy_seconds();
  while (*more && clock.Now() < until) {
    auto trained = trainer.TrainBatch();
    if (!trained.ok()) return trained.status();
    *more = *trained;
  }
  const double busy_s = session.busy_seconds() - busy;
  return busy_s > 0 ? (session.samples() - samples) / busy_s : 0.0;
}

}  // namespace

absl::StatusOr<TrainReport> RunCalibration(const JobConfig& config,
                                           const JobShape& shape, uint32_t rank,
                                           const CalibrationPlan& plan,
                                           Clock& clock) {
  Trainer trainer(config, shape, rank, clock);
  if (auto s = trainer.Start(); !s.ok()) return s;
  WorkerSession& session = trainer.session();
  nlohmann::json out;

  auto links = ProbeLinks(trainer, config, clock);
  if (!links.ok()) return links.status();
  out["link_mbps"] = *links;

  // The largest batch its memory holds, by doubling (no compute needed).
  uint32_t max_batch = 0;
  for (uint32_t b = plan.batches.front(); b <= kLargestBatch; b *= 2) {
    if (!session.device().CheckMemory(b).ok()) {
      out["memory_capped"] = true;
      break;
    }
    max_batch = b;
  }
  out["max_batch"] = max_batch;

  bool more = true;
  const double slice_s = 0.45 * plan.seconds / plan.batches.size();
  nlohmann::json rates = nlohmann::json::array();
  std::vector<std::pair<uint32_t, double>> measured;
  double best_rate = 0;
  for (uint32_t batch : plan.batches) {
    // A batch it holds, and one whose step fits the slice twice over.
    if (batch > max_batch) break;
    if (best_rate > 0 && batch / best_rate > slice_s / 2) break;
    session.FixPlan(batch, 1);
    auto rate = RateOver(trainer, slice_s, clock, &more);
    if (absl::IsResourceExhausted(rate.status())) {
      // A real device's out-of-memory ends the sweep like the emulated one.
      out["memory_capped"] = true;
      out["max_batch"] = measured.empty() ? 0 : measured.back().first;
      break;
    }
    if (!rate.ok()) return rate.status();
    if (!more) break;
    measured.emplace_back(batch, *rate);
    rates.push_back({{"batch", batch}, {"samples_per_s", *rate}});
    best_rate = std::max(best_rate, *rate);
  }
  uint32_t best_batch = 0;
  double best_batch_rate = 0;
  for (const auto& [batch, rate] : measured) {
    if (rate >= kPlateau * best_rate) {
      best_batch = batch;
      best_batch_rate = rate;
      break;
    }
  }
  out["rates"] = rates;
  out["best_batch"] = best_batch;
  out["samples_per_s"] = best_rate;

  std::vector<double> sustained;
  if (best_batch > 0) {
    session.FixPlan(best_batch, 1);
    for (int i = 0; i < kDriftSlices && more; ++i) {
      auto rate =
          RateOver(trainer, 0.45 * plan.seconds / kDriftSlices, clock, &more);
      if (!rate.ok()) return rate.status();
      sustained.push_back(*rate);
    }
  }
  out["sustained"] = sustained;
  // The end of the sustained run against the same batch at the start.
  const double last = sustained.size() >= 3
                          ? Median({sustained.end() - 3, sustained.end()})
                          : 0;
  out["drift"] = best_batch_rate > 0 && last > 0 ? last / best_batch_rate : 1.0;
  spdlog::info("calibration: {}", out.dump());
  auto report = trainer.Finish();
  if (!report.ok()) return report.status();
  report->calibration = std::move(out);
  return report;
}

}  // namespace hetps
