// The heterogeneity core across real processes: semi_async with emulated
// mixed devices, the staleness bound as the servers recorded it, chunks
// following speed, and a worker killed mid-run.
#include <gtest/gtest.h>
#include <signal.h>

#include <atomic>
#include <chrono>
#include <fstream>
#include <functional>
#include <map>
#include <optional>
#include <regex>
#include <thread>

#include "absl/strings/str_cat.h"
#include "common/median.h"
#include "coord/coordinator_client.h"
#include "model/criteo_gen.h"
#include "nlohmann/json.hpp"
#include "support/test_support.h"

namespace hetps {
namespace {

using ::testing::HasSubstr;
using testing::RunCommand;
using testing::TempDir;

// Logistic regression on synthetic data; 2 fast and 2 slow emulated workers.
std::string MixedJob(const std::string& mode, int window) {
  return absl::StrCat(R"(name: mixed
mode: )",
                      mode, R"(
window: )",
                      window, R"(
semi_async: {adapt_window: false, window_min: 1}
cluster: {servers: 2, workers: 4, max_worker_failures: 1}
server: {heartbeat_timeout_s: 1}
client: {heartbeat_interval_s: 0.2}
device_profiles:
  - {ranks: [0, 1], throughput: 4000}
  - {ranks: [2, 3], throughput: 1000}
train:
  model: lr
  epochs: 2
  batch_size: 50
  data: {format: synthetic, train_samples: 20000, test_samples: 2000, fields: 8, ids_per_field: 200}
  optimizer: {type: adagrad, learning_rate: 0.1}
)");
}

// `hetps status --json` of the job whose coordinator is at `coordinator`,
// asked until `wanted` holds for it or `over` turns true (the job ended);
// an empty object then.
nlohmann::json StatusWhen(
    const std::string& coordinator, const std::atomic<bool>& over,
    const std::function<bool(const nlohmann::json&)>& wanted) {
  while (!over) {
    const testing::CommandResult status =
        RunCommand({testing::HetpsBinary(), "status", "--json", "--coordinator",
                    coordinator},
                   std::chrono::seconds(20));
    nlohmann::json j = nlohmann::json::parse(status.output, nullptr, false);
    if (status.exit_code == 0 && j.is_object() && wanted(j)) return j;
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
  }
  return nlohmann::json::object();
}

TEST(HeteroClusterTest, SemiAsyncKeepsTheStalenessBound) {
  // Equal batches: the fast workers make 4x the clocks of the slow ones and
  // run into the bound.
  TempDir dir;
  const testing::LaunchedJob run =
      testing::LaunchJob(dir, dir.Write("job.yaml", MixedJob("semi_async", 2)),
                         {"planner.batch_plan=fixed"});
  ASSERT_EQ(run.result.exit_code, 0) << run.result.output;
  // Every sample of both epochs trained exactly once, by someone.
  EXPECT_EQ(run.summary["samples"].get<uint64_t>(), 40000u);
  EXPECT_GT(run.summary["test_auc"].get<double>(), 0.6);
  // The servers' own record: no pull was answered more than window (2)
  // clocks ahead of the slowest live worker, and the bound did hold pulls.
  const std::regex record(
      "pulls held by the bound ([0-9]+), max pull lead ([0-9]+) clocks "
      "\\(window 2\\), bound violations 0");
  int servers_reporting = 0;
  const std::string& out = run.result.output;
  for (std::sregex_iterator it(out.begin(), out.end(), record), end; it != end;
       ++it) {
    ++servers_reporting;
    EXPECT_LE(std::stoi((*it)[2]), 2);
    EXPECT_GT(std::stoi((*it)[1]), 0) << "fast workers never had to wait?";
  }
  EXPECT_EQ(servers_reporting, 2) << out;
  // Emulated, and labelled so.
  EXPECT_THAT(out, HasSubstr("emulated device: 4000 samples/s"));
  EXPECT_EQ(run.summary["emulated"], true);
}

// issue 14: the workers' hot-row cache in a real job. 8 fields of 200 ids
// each: every id is in a good share of the batches, so many rows are read
// from the copies, each at most max_lag applies behind the step's pull by
// the servers' own record; every sample is still trained once.
TEST(HeteroClusterTest, HotRowCacheReadsCopiesWithinTheBound) {
  TempDir dir;
  const testing::LaunchedJob run = testing::LaunchJob(
      dir, dir.Write("job.yaml", MixedJob("semi_async", 8)),
      {"client.hot_rows.enabled=true", "client.hot_rows.max_lag=3"});
  ASSERT_EQ(run.result.exit_code, 0) << run.result.output;
  const nlohmann::json& s = run.summary;
  EXPECT_EQ(s["samples"].get<uint64_t>(), 40000u);
  EXPECT_GT(s["test_auc"].get<double>(), 0.6);
  const uint64_t cached = s["cached_rows"].get<uint64_t>();
  const uint64_t pulled = s["pulled_rows"].get<uint64_t>();
  // (43% when written: a copy lives 3 applies, about 3 steps of a worker)
  EXPECT_GT(4 * cached, cached + pulled) << "a quarter of the rows or more";
  EXPECT_GT(pulled, 0u);
  const nlohmann::json& lag = s["read_lag"];
  EXPECT_EQ(lag["bound"], 3);
  EXPECT_EQ(lag["violations"], 0);
  EXPECT_LE(lag["max"].get<uint64_t>(), 3u);
  EXPECT_GT(lag["cached_pushes"].get<uint64_t>(), 0u);
  uint64_t counted = 0;
  for (const auto& n : lag["counts"]) counted += n.get<uint64_t>();
  EXPECT_EQ(counted, lag["cached_pushes"].get<uint64_t>());
  EXPECT_THAT(run.result.output, HasSubstr("hot-row cache: "));
}

TEST(HeteroClusterTest, ProportionalBatchesKeepEveryWorkerBusy) {
  TempDir dir;
  const testing::LaunchedJob run =
      testing::LaunchJob(dir, dir.Write("job.yaml", MixedJob("semi_async", 8)));
  ASSERT_EQ(run.result.exit_code, 0) << run.result.output;
  EXPECT_EQ(run.summary["samples"].get<uint64_t>(), 40000u);
  // Fast workers get 4x the batch of slow ones (total 4 x 50 per step).
  EXPECT_THAT(run.result.output, HasSubstr("worker 0 batch 80 push_freq 1"));
  EXPECT_THAT(run.result.output, HasSubstr("worker 3 batch 20 push_freq 1"));
  // ...and about 4x the chunks; nobody idles.
  uint64_t fast_chunks = 0, slow_chunks = 0;
  for (const auto& w : run.summary["per_worker"]) {
    const int rank = w["rank"].get<int>();
    (rank < 2 ? fast_chunks : slow_chunks) += w["chunks"].get<uint64_t>();
    EXPECT_GT(w["busy_fraction"].get<double>(), 0.6) << "worker " << rank;
  }
  EXPECT_GT(fast_chunks, 2 * slow_chunks);
}

TEST(HeteroClusterTest, ABatchLargerThanTheEmulatedMemoryFailsTheWorker) {
  TempDir dir;
  const testing::LaunchedJob run =
      testing::LaunchJob(dir, dir.Write("job.yaml", MixedJob("semi_async", 2)),
                         {"device_profiles[1].memory_mb=0.001",
                          "device_profiles[1].batch_size=50"});
  EXPECT_EQ(run.result.exit_code, 1) << run.result.output;
  EXPECT_THAT(run.result.output,
              HasSubstr("emulated out of memory: a batch of 50 samples"));
}

// Runs `config` with `sets` and, once worker 2 has trained for 2.5 s,
// does `to_worker2` to its pid.
testing::LaunchedJob LaunchDisturbingWorker2(
    const TempDir& dir, const std::string& config,
    const std::vector<std::string>& sets,
    const std::function<void(pid_t)>& to_worker2) {
  testing::LaunchedJob run;
  std::thread launcher([&] { run = testing::LaunchJob(dir, config, sets); });
  const auto victim = testing::FindProcess(
      {"worker", "--config", config, "--rank", "2"}, std::chrono::seconds(30));
  EXPECT_TRUE(victim.has_value()) << "worker 2 never started";
  if (victim) {
    std::this_thread::sleep_for(std::chrono::milliseconds(2500));
    to_worker2(*victim);
  }
  launcher.join();
  return run;
}

testing::LaunchedJob LaunchKillingWorker2(
    const TempDir& dir, const std::string& config,
    const std::vector<std::string>& sets) {
  return LaunchDisturbingWorker2(dir, config, sets,
                                 [](pid_t pid) { kill(pid, SIGKILL); });
}

// Kills worker 2 (slow) of 4 mid-run. The job finishes, the chunk it held
// goes back to the queue, every sample of every epoch is trained by someone
// (the coordinator counts the samples of each finished chunk), and the
// model is as good as an undisturbed run's.
void KillMidRun(const std::string& mode) {
  TempDir dir;
  const std::string config = dir.Write("job.yaml", MixedJob(mode, 4));
  const testing::LaunchedJob undisturbed = testing::LaunchJob(dir, config);
  ASSERT_EQ(undisturbed.result.exit_code, 0) << undisturbed.result.output;
  EXPECT_EQ(undisturbed.summary["finished_samples"], 40000);
  EXPECT_EQ(undisturbed.summary["requeued_chunks"], 0);

  const testing::LaunchedJob run = LaunchKillingWorker2(dir, config, {});
  ASSERT_EQ(run.result.exit_code, 0) << run.result.output;
  const std::string& out = run.result.output;
  EXPECT_THAT(out, HasSubstr("worker 2 died"));
  EXPECT_THAT(out, HasSubstr("worker 2 left the live set"));
  EXPECT_THAT(out, HasSubstr("no heartbeat for"));
  EXPECT_EQ(run.summary["failed_workers"], nlohmann::json::array({2}));
  EXPECT_THAT(out,
              HasSubstr("that worker 2 was training goes back to the queue"));
  // 20000 samples x 2 epochs, each in exactly one finished chunk: the
  // killed worker's unfinished share was trained by the others.
  EXPECT_EQ(run.summary["requeued_chunks"], 1);
  EXPECT_EQ(run.summary["finished_samples"], 40000);
  EXPECT_NEAR(run.summary["test_auc"].get<double>(),
              undisturbed.summary["test_auc"].get<double>(), 0.005);
}

// Kills worker 2 of 4 mid-run with cluster.max_worker_restarts = 1: launch
// starts it again, it registers again (incarnation 2), the servers move its
// clocks (back at 0) to where the job is, it trains on, and every sample is
// still trained exactly once.
void RestartMidRun(const std::string& mode) {
  TempDir dir;
  const std::string config = dir.Write("job.yaml", MixedJob(mode, 4));
  const testing::LaunchedJob run =
      LaunchKillingWorker2(dir, config, {"cluster.max_worker_restarts=1"});
  ASSERT_EQ(run.result.exit_code, 0) << run.result.output;
  const std::string& out = run.result.output;
  EXPECT_THAT(out, HasSubstr("worker 2 died"));
  EXPECT_THAT(out, HasSubstr("starting it again"));
  EXPECT_THAT(out, HasSubstr("worker 2 registered again (incarnation 2"));
  EXPECT_THAT(out, HasSubstr("worker 2 restarted (incarnation 2): its clock 0 "
                             "continues as"));
  EXPECT_EQ(run.summary["worker_restarts"], 1);
  EXPECT_EQ(run.summary["failed_workers"], nlohmann::json::array());
  EXPECT_EQ(run.summary["requeued_chunks"], 1);
  EXPECT_EQ(run.summary["finished_samples"], 40000);
  // The new process reported, and trained.
  bool reported = false;
  for (const auto& w : run.summary["per_worker"]) {
    if (w["rank"] == 2) reported = w["samples"].get<uint64_t>() > 0;
  }
  EXPECT_TRUE(reported);
  EXPECT_GT(run.summary["test_auc"].get<double>(), 0.7);
}

// issue 15: worker 2 of 4 is paused (SIGSTOP) for three heartbeat timeouts
// mid-run and then runs again (SIGCONT), as after a link that was down.
// The coordinator drops it as before and hands its chunk on; when it runs
// again it notices, discards the push in hand (the servers refuse it
// anyway), registers again (incarnation 2), the servers move its clock to
// where the job is, and it trains on — in a job that allows no failed
// worker. Every sample is in exactly one finished chunk.
void PauseMidRun(const std::string& mode) {
  TempDir dir;
  const std::string config = dir.Write("job.yaml", MixedJob(mode, 4));
  const std::vector<std::string> endpoints = testing::FreeEndpoints(2);
  // Worker 2 stays stopped until the coordinator's status says it was
  // dropped (or 30 s pass, which the assertions below then show).
  const auto dropped = [&] {
    auto status = QueryStatus(endpoints[0], 2.0, {});
    if (!status.ok()) return false;
    for (const rpc::WorkerStatus& w : status->workers()) {
      if (w.rank() == 2) return !w.live();
    }
    return false;
  };
  const testing::LaunchedJob run = LaunchDisturbingWorker2(
      dir, config,
      {"cluster.max_worker_failures=0", "train.epochs=4",
       absl::StrCat("cluster.ps_endpoints=", endpoints[0], ",", endpoints[1])},
      [&](pid_t pid) {
        kill(pid, SIGSTOP);
        const auto deadline =
            std::chrono::steady_clock::now() + std::chrono::seconds(30);
        while (!dropped() && std::chrono::steady_clock::now() < deadline) {
          std::this_thread::sleep_for(std::chrono::milliseconds(50));
        }
        kill(pid, SIGCONT);
      });
  ASSERT_EQ(run.result.exit_code, 0) << run.result.output;
  const std::string& out = run.result.output;
  EXPECT_THAT(out, HasSubstr("worker 2 left the live set"));
  EXPECT_THAT(out, HasSubstr("worker 2 was dropped from the live set"));
  EXPECT_THAT(out, HasSubstr("worker 2 registered again (incarnation 2, "
                             "rejoined the live set)"));
  // A request of the new incarnation reached the servers: it trained on.
  EXPECT_THAT(out, HasSubstr("worker 2 restarted (incarnation 2): its clock"));
  EXPECT_EQ(run.summary["failed_workers"], nlohmann::json::array());
  EXPECT_EQ(run.summary["worker_restarts"], 0);
  EXPECT_GE(run.summary["requeued_chunks"].get<int>(), 1);
  EXPECT_EQ(run.summary["finished_samples"], 80000);
  for (const auto& w : run.summary["per_worker"]) {
    EXPECT_EQ(w["rejoins"], w["rank"] == 2 ? 1 : 0) << w.dump();
  }
  EXPECT_GT(run.summary["test_auc"].get<double>(), 0.7);
}

TEST(HeteroClusterTest, PausedWorkerRejoinsByItselfSync) {
  PauseMidRun("sync");
}

TEST(HeteroClusterTest, PausedWorkerRejoinsByItselfSemiAsync) {
  PauseMidRun("semi_async");
}

TEST(HeteroClusterTest, PausedWorkerRejoinsByItselfAsync) {
  PauseMidRun("async");
}

TEST(HeteroClusterTest, RestartedWorkerRejoinsSync) { RestartMidRun("sync"); }

TEST(HeteroClusterTest, RestartedWorkerRejoinsSemiAsync) {
  RestartMidRun("semi_async");
}

TEST(HeteroClusterTest, KilledWorkerIsDroppedAndSemiAsyncFinishes) {
  KillMidRun("semi_async");
}

TEST(HeteroClusterTest, KilledWorkerIsDroppedAndSyncFinishes) {
  KillMidRun("sync");
}

// issue 11: on Criteo-shaped data semi_async ended ~0.02-0.04 AUC below
// sync with the same proportional batches. The reference cluster of
// bench/hetero (3 workers at 2000 samples/s, 7 at 600: --speed-scale 2),
// FM on 150k generated samples of vocab 1000, 1 epoch, adagrad 0.05.
// Measured on 7887569 (before the fix), two runs: sync 0.6955 / 0.6901,
// semi_async 0.6707 / 0.6739 (0.016-0.025 below); after: sync 0.6912 /
// 0.6817, semi_async 0.6972 / 0.6989. (Vocab 100 is left to the benchmark
// matrix: its hot rows make single runs of every mode spread by 0.02-0.03,
// docs/BENCHMARKS.md §5b.)
//
// The warm-up (train.warmup_rounds) is 40 rounds here, not the default 20:
// lr 0.05 is the high end, where the largest adagrad step of the run comes
// as the warm-up ends, and some semi_async runs overshoot there. Measured
// on c59d3bd (docs/BENCHMARKS.md §5e): at 20 rounds sync 0.7166-0.7235 (8
// runs; CI once 0.7269), semi_async median 0.7232 over 25 runs, but 3 of
// them at 0.7045-0.7089, which a 0.01 bar fails; at 40 rounds sync
// 0.7247-0.7278 (4), semi_async 0.7197-0.7254 (10, median 0.7214). The bar
// is one-sided, on the mean of two semi_async runs: semi_async may not end
// more than 0.01 below sync. What issue 11 broke is checked from the
// servers' own record: the reads ahead of the queue.
// Generated Criteo-format data in `dir`.
std::string GeneratedCriteo(const TempDir& dir, uint64_t samples,
                            uint32_t vocab, uint64_t seed) {
  CriteoGenConfig gen;
  gen.samples = samples;
  gen.vocab = vocab;
  gen.seed = seed;
  const std::string data = dir.path() + "/criteo.tsv";
  EXPECT_TRUE(GenerateCriteo(gen, data).ok());
  return data;
}

// The reference cluster of bench/hetero (3 fast workers, 7 slow ones, 3
// servers) at `fast` / `slow` samples/s, FM on `data`, 1 epoch; the
// default warm-up unless `warmup_rounds` is given.
testing::LaunchedJob ReferenceClusterOnCriteo(
    const TempDir& dir, const std::string& data, const std::string& mode,
    const std::string& plan, int fast, int slow, double learning_rate,
    std::optional<int> warmup_rounds = {}) {
  std::vector<std::string> sets = {
      absl::StrCat("mode=", mode),
      absl::StrCat("planner.batch_plan=", plan),
      absl::StrCat("device_profiles=[{ranks: [0, 1, 2], throughput: ", fast,
                   "}, {ranks: [3, 4, 5, 6, 7, 8, 9], throughput: ", slow,
                   "}]"),
      "train.model=fm",
      "train.data.format=criteo",
      absl::StrCat("train.data.path=", data),
      absl::StrCat("train.optimizer.learning_rate=", learning_rate)};
  if (warmup_rounds) {
    sets.push_back(absl::StrCat("train.warmup_rounds=", *warmup_rounds));
  }
  return testing::LaunchJob(
      dir, testing::SourcePath("bench/hetero/reference.yaml"), sets);
}

TEST(HeteroClusterTest, SemiAsyncEndsAsAccurateAsSyncOnGeneratedCriteo) {
  TempDir dir;
  const std::string data = GeneratedCriteo(dir, 150000, 1000, 5);
  auto run = [&](const std::string& mode) {
    return ReferenceClusterOnCriteo(dir, data, mode, "proportional", 2000, 600,
                                    0.05, 40);
  };
  const testing::LaunchedJob sync = run("sync");
  ASSERT_EQ(sync.result.exit_code, 0) << sync.result.output;
  const double sync_auc = sync.summary["test_auc"].get<double>();
  EXPECT_GT(sync_auc, 0.66);
  std::vector<double> semi_aucs;
  for (int i = 0; i < 2; ++i) {
    const testing::LaunchedJob semi = run("semi_async");
    ASSERT_EQ(semi.result.exit_code, 0) << semi.result.output;
    semi_aucs.push_back(semi.summary["test_auc"].get<double>());
    // Both trained every sample once.
    EXPECT_EQ(sync.summary["samples"], semi.summary["samples"]);
    // The servers read ahead of their queues, and no gradient they applied
    // was computed on parameters more than one apply old.
    const std::regex record(
        "max staleness ([0-9]+), pulls read ahead of the queue ([0-9]+)");
    const std::string& out = semi.result.output;
    int servers_reporting = 0;
    for (std::sregex_iterator it(out.begin(), out.end(), record), end;
         it != end; ++it) {
      ++servers_reporting;
      EXPECT_LE(std::stoi((*it)[1]), 1);
      EXPECT_GT(std::stoi((*it)[2]), 0);
    }
    EXPECT_EQ(servers_reporting, 3) << out;
  }
  const double semi_auc = (semi_aucs[0] + semi_aucs[1]) / 2;
  EXPECT_GE(semi_auc, sync_auc - 0.01) << "semi_async " << semi_aucs[0] << ", "
                                       << semi_aucs[1] << "; sync " << sync_auc;
}

// issue 11, vocab 100: every row of the first columns is in every batch.
// Without a warm-up, semi_async's early one-apply-late gradients at the full
// adagrad step tipped some runs into a plateau: on this cell (FM, the
// reference cluster at speed scale 4, 300k samples, adagrad 0.025) 4 runs
// ended at 0.709-0.746 against sync-with-equal-batches' 0.7293; with
// train.warmup_rounds 20 (the default) 4 runs 0.7552-0.7598, sync equal
// 0.7553 (docs/BENCHMARKS.md §5c).
TEST(HeteroClusterTest, SemiAsyncWarmsUpPastTheHotRowPlateau) {
  TempDir dir;
  const std::string data = GeneratedCriteo(dir, 300000, 100, 3);
  auto run = [&](const std::string& mode, const std::string& plan) {
    return ReferenceClusterOnCriteo(dir, data, mode, plan, 4000, 1200, 0.025);
  };
  const testing::LaunchedJob sync = run("sync", "fixed");
  ASSERT_EQ(sync.result.exit_code, 0) << sync.result.output;
  // Two semi_async runs, judged by their mean: one run on this cell spreads
  // 0.7497-0.7653 with the warm-up on this 2-core machine (it cannot hold
  // the x4 speeds steadily), while the plateau took every run without it
  // (0.709-0.746), so the mean still tells the two apart.
  std::vector<double> semi_aucs;
  for (int i = 0; i < 2; ++i) {
    const testing::LaunchedJob semi = run("semi_async", "proportional");
    ASSERT_EQ(semi.result.exit_code, 0) << semi.result.output;
    semi_aucs.push_back(semi.summary["test_auc"].get<double>());
  }
  const double sync_auc = sync.summary["test_auc"].get<double>();
  const double semi_auc = (semi_aucs[0] + semi_aucs[1]) / 2;
  EXPECT_GT(semi_auc, 0.75)
      << "the plateau: semi_async " << semi_aucs[0] << ", " << semi_aucs[1]
      << "; sync equal " << sync_auc;
  EXPECT_GE(semi_auc, sync_auc - 0.005)
      << "semi_async " << semi_aucs[0] << ", " << semi_aucs[1]
      << "; sync equal " << sync_auc;
}

TEST(HeteroClusterTest, StatusShowsWindowPlansClocksQueuesAndTables) {
  TempDir dir;
  const std::vector<std::string> endpoints = testing::FreeEndpoints(2);
  const std::string config = dir.Write(
      "job.yaml",
      MixedJob("semi_async", 8) +
          absl::StrCat("\n# slower, so the job is still running when asked\n"));
  std::atomic<bool> over{false};
  testing::CommandResult launched;
  std::thread launcher([&] {
    launched = RunCommand(
        {testing::HetpsBinary(), "launch", config, "-v", "--run-dir",
         dir.path() + "/run", "--set",
         absl::StrCat("cluster.ps_endpoints=", endpoints[0], ",", endpoints[1]),
         "--set", "train.epochs=4",
         // The plan stays the profiles' 4:1: a sanitizer build, or a busy
         // CI core, measures a worker below its profile (CI planned 13 for
         // a slow worker), and the re-plan that follows is the planner's
         // own tests' subject, not this one's.
         "--set", "planner.replan_threshold=1"},
        std::chrono::seconds(120));
    over = true;
  });
  // Ask while it trains, once every worker has pushed and the job has run
  // 3 s (its rates settled); then up to four more times, each once the job
  // has run another half second. A worker's rate is a decaying average
  // over ~2 s (WorkerSession's kThroughputTau), and a stall on a loaded
  // machine dips it for a moment (two TSan runs of this job at once: the
  // slow workers' fell to 0.35x of their profile for one look, and the
  // ratio read 6.1): rates are judged by their median over the looks.
  std::vector<nlohmann::json> looks = {
      StatusWhen(endpoints[0], over, [](const nlohmann::json& j) {
        if (j.value("elapsed_s", 0.0) < 3) return false;
        for (const auto& w : j["workers"]) {
          if (w.value("clock", uint64_t{0}) == 0) return false;
        }
        return true;
      })};
  while (looks.size() < 5 && !looks.back().empty()) {
    const double last = looks.back().value("elapsed_s", 0.0);
    nlohmann::json later =
        StatusWhen(endpoints[0], over, [&](const nlohmann::json& j) {
          return j.value("elapsed_s", 0.0) >= last + 0.5 &&
                 j.value("workers", nlohmann::json::array()).size() == 4;
        });
    if (later.empty()) break;
    looks.push_back(std::move(later));
  }
  const nlohmann::json& j = looks.front();
  std::map<int, std::vector<double>> rates;  // rank -> its rate at each look
  for (const nlohmann::json& look : looks) {
    for (const auto& w : look["workers"]) {
      rates[w["rank"].get<int>()].push_back(
          w["compute_samples_per_s"].get<double>());
    }
  }
  const testing::CommandResult text = RunCommand(
      {testing::HetpsBinary(), "status", "--coordinator", endpoints[0]},
      std::chrono::seconds(20));
  launcher.join();
  ASSERT_EQ(launched.exit_code, 0) << launched.output;
  ASSERT_FALSE(j.empty()) << "the job ended before status showed it running";
  EXPECT_EQ(j["mode"], "semi_async");
  EXPECT_EQ(j["window"], 8);
  ASSERT_EQ(j["workers"].size(), 4u);
  double fast_rate = 0, slow_rate = 0;
  for (const auto& w : j["workers"]) {
    const int rank = w["rank"].get<int>();
    EXPECT_EQ(w["live"], true) << rank;
    EXPECT_EQ(w["emulated"], true) << rank;
    // 4:1 of the 200 per step by the profiles.
    EXPECT_EQ(w["batch_size"], rank < 2 ? 80 : 20) << rank;
    EXPECT_EQ(w["push_freq"], 1) << rank;
    EXPECT_GT(w["clock"].get<uint64_t>(), 0u) << rank;
    EXPECT_GT(w["busy_fraction"].get<double>(), 0.3) << rank;
    // Samples per busy second: never above the emulated speed (the pacing
    // holds each batch to it) and not far below; busy time includes the
    // push, so a loaded machine (CI, a ctest -j2 neighbour) lowers every
    // worker's rate alike -- CI measured 0.55x of the profile on all four.
    const double speed = rank < 2 ? 4000 : 1000;
    const double rate = Median(rates[rank]);
    EXPECT_LE(rate, 1.05 * speed) << rank;
    EXPECT_GE(rate, 0.3 * speed) << rank;
    (rank < 2 ? fast_rate : slow_rate) += rate / 2;
  }
  // What the planner needs of it: the workers' 4:1.
  EXPECT_NEAR(fast_rate / slow_rate, 4.0, 0.8)
      << "fast " << fast_rate << ", slow " << slow_rate << " (medians of "
      << looks.size() << " looks)";
  ASSERT_EQ(j["servers"].size(), 2u);
  std::vector<double> service;
  double service_share = 0;
  for (const auto& s : j["servers"]) {
    EXPECT_EQ(s["reachable"], true);
    EXPECT_GT(s["pushes"].get<uint64_t>(), 0u);
    EXPECT_GT(s["table_rows"]["lr_emb"].get<uint64_t>(), 0u);
    EXPECT_GE(s["cpu_fraction"].get<double>(), 0.0);
    EXPECT_EQ(s["bound_violations"], 0);
    // Where its Prometheus metrics are (docs/OPERATING.md), with the pull
    // and push latencies recorded so far.
    EXPECT_THAT(s["metrics_endpoint"].get<std::string>(),
                ::testing::StartsWith("127.0.0.1:"));
    EXPECT_GT(s["pull_latency"]["counts"].size(), 1u);
    // issue 14: what its requests touched. Keys hash evenly over 4096
    // buckets, half of them this server's; lr_emb rows are one float.
    const auto& load = s["load"];
    EXPECT_GT(load["pulled_rows"].get<uint64_t>(), 0u);
    EXPECT_GT(load["pushed_rows"].get<uint64_t>(), 0u);
    EXPECT_EQ(load["bytes"].get<uint64_t>(),
              4 * (load["pulled_rows"].get<uint64_t>() +
                   load["pushed_rows"].get<uint64_t>()));
    EXPECT_GT(load["buckets"].get<uint32_t>(), 0u);
    EXPECT_LE(load["buckets"].get<uint32_t>(), 2048u);
    EXPECT_NEAR(load["share"].get<double>(), 0.5, 0.15);
    EXPECT_GT(load["service_s"].get<double>(), 0.0);
    service.push_back(load["service_s"].get<double>());
    service_share += load["service_share"].get<double>();
    EXPECT_FALSE(s.contains("access")) << "the raw bucket totals";
  }
  // The load ratio is the service time's: the largest over the mean.
  EXPECT_NEAR(service_share, 1.0, 1e-9);
  EXPECT_NEAR(j["server_load_max_over_mean"].get<double>(),
              2 * std::max(service[0], service[1]) / (service[0] + service[1]),
              1e-9);
  // 1600 keys over 2 servers: the hottest keys of both.
  ASSERT_EQ(j["hot_keys"].size(), 10u) << j["hot_keys"].dump();
  for (const auto& k : j["hot_keys"]) {
    EXPECT_EQ(k["table"], "lr_emb");
    EXPECT_LT(k["server"].get<int>(), 2);
    EXPECT_GT(k["share"].get<double>(), 0.0);
    EXPECT_LE(k["share"].get<double>(), 1.0);
  }
  EXPECT_THAT(text.output, HasSubstr("[status]"));
  EXPECT_THAT(text.output, HasSubstr("metrics http://127.0.0.1:"));
  EXPECT_THAT(text.output, HasSubstr("window 8"));
  EXPECT_THAT(text.output, HasSubstr("(emulated)"));
  EXPECT_THAT(text.output, HasSubstr("hot keys (load max/mean "));
  EXPECT_THAT(text.output, HasSubstr("lr_emb:"));
  // launch printed its live status line while the job ran.
  EXPECT_THAT(launched.output, HasSubstr("[status] "));
}

// `hetps launch` of `config` on the two servers at `endpoints` for
// `epochs`, with a control period of 0.5 s, on a thread of its own:
// `launched` holds its result and `over` turns true when it ends.
std::thread LaunchTwoServerJob(const TempDir& dir, const std::string& config,
                               const std::vector<std::string>& endpoints,
                               int epochs, testing::CommandResult& launched,
                               std::atomic<bool>& over) {
  return std::thread([&dir, config, endpoints, epochs, &launched, &over] {
    launched = RunCommand(
        {testing::HetpsBinary(), "launch", config, "--run-dir",
         dir.path() + "/run", "--set",
         absl::StrCat("cluster.ps_endpoints=", endpoints[0], ",", endpoints[1]),
         "--set", absl::StrCat("train.epochs=", epochs), "--set",
         "semi_async.adapt_every_s=0.5"},
        std::chrono::seconds(180));
    over = true;
  });
}

TEST(HeteroClusterTest, PlacementPlansBucketsOffATenthSpeedServer) {
  // Server 1 emulates a machine at a tenth of this one's speed: equal rows,
  // ten times the CPU time. The coordinator's Rebalancer plans to move
  // buckets off it, and status shows the plan (advice: without
  // sharding.migrate buckets do not move).
  TempDir dir;
  const std::vector<std::string> endpoints = testing::FreeEndpoints(2);
  const std::string config = dir.Write(
      "job.yaml", MixedJob("semi_async", 8) +
                      "server_profiles: [{ranks: [1], speed: 0.1}]\n");
  std::atomic<bool> over{false};
  testing::CommandResult launched;
  std::thread launcher =
      LaunchTwoServerJob(dir, config, endpoints, 8, launched, over);
  // The service time is the wall time plus the emulated extra (nine times
  // the CPU time), so time off the CPU (preemption on a loaded machine, a
  // sanitizer) dilutes the ratio: 1.13 was read at a quarter speed under
  // ASan on a busy CI machine. The first plan with moves made at a
  // max/mean over 1.3 is judged: a plan read in a quieter moment may be
  // noise either way (a CI sanitizer pass judged one that moved 0 -> 1 as
  // an earlier plan had been over 1.3).
  double largest = 0;
  const nlohmann::json status =
      StatusWhen(endpoints[0], over, [&](const nlohmann::json& j) {
        if (!j.contains("placement")) return false;
        const double max_over_mean =
            j["placement"].value("max_over_mean", 0.0);
        largest = std::max(largest, max_over_mean);
        return j["placement"].value("moves", 0u) > 0 && max_over_mean > 1.3;
      });
  const nlohmann::json placement =
      status.empty() ? nlohmann::json() : status["placement"];
  const testing::CommandResult text = RunCommand(
      {testing::HetpsBinary(), "status", "--coordinator", endpoints[0]},
      std::chrono::seconds(20));
  launcher.join();
  ASSERT_EQ(launched.exit_code, 0) << launched.output;
  // Server 1 spends up to ~10x the time on as many rows (max/mean up to
  // 1.8); the plan moves buckets from 1 to 0 only.
  ASSERT_TRUE(placement.is_object())
      << "no plan with moves above max/mean 1.3 during the job; largest "
      << largest;
  EXPECT_LT(placement["planned_max_over_mean"].get<double>(),
            placement["max_over_mean"].get<double>())
      << placement;
  ASSERT_EQ(placement["flows"].size(), 1u) << placement;
  EXPECT_EQ(placement["flows"][0]["from"], 1);
  EXPECT_EQ(placement["flows"][0]["to"], 0);
  EXPECT_EQ(placement["flows"][0]["buckets"], placement["moves"]);
  EXPECT_GT(placement["bytes"].get<uint64_t>(), 0u);
  std::ifstream server1(dir.path() + "/run/server-1.log");
  const std::string log((std::istreambuf_iterator<char>(server1)), {});
  EXPECT_THAT(log, HasSubstr("emulated server: 10% speed"));
  if (text.exit_code == 0) {  // the job may have ended meanwhile
    EXPECT_THAT(text.output, HasSubstr("placement: load max/mean"));
  }
}

TEST(HeteroClusterTest, MigrationMovesBucketsOffAQuarterSpeedServer) {
  // As above with sharding.migrate: the coordinator carries the plans out
  // while the job trains, and the rows served move to server 0.
  TempDir dir;
  const std::vector<std::string> endpoints = testing::FreeEndpoints(2);
  const std::string config =
      dir.Write("job.yaml", MixedJob("semi_async", 8) +
                                "server_profiles: [{ranks: [1], speed: 0.25}]\n"
                                "sharding: {migrate: true}\n");
  std::atomic<bool> over{false};
  testing::CommandResult launched;
  std::thread launcher =
      LaunchTwoServerJob(dir, config, endpoints, 12, launched, over);
  double before = 0;
  const nlohmann::json moved =
      StatusWhen(endpoints[0], over, [&](const nlohmann::json& j) {
        if (!j.contains("placement")) return false;
        before = std::max(before, j["placement"].value("max_over_mean", 0.0));
        return j["placement"].value("moved_buckets", 0u) > 0;
      });
  launcher.join();
  ASSERT_EQ(launched.exit_code, 0) << launched.output;
  ASSERT_FALSE(moved.empty()) << "no bucket moved during the job";
  const nlohmann::json& placement = moved["placement"];
  EXPECT_TRUE(placement.value("migrate", false)) << placement;
  EXPECT_GT(before, 1.3) << placement;
  EXPECT_THAT(placement.value("last_move", std::string()),
              HasSubstr("buckets"));
  // Over the run, server 0 served most rows (hashing alone gives it about
  // half; by hand 0.95 with the moves), and the job trained as usual.
  std::ifstream summary_file(dir.path() + "/run/summary.json");
  const nlohmann::json summary =
      nlohmann::json::parse(summary_file, nullptr, false);
  ASSERT_TRUE(summary.is_object());
  ASSERT_EQ(summary["server_load"].size(), 2u) << summary["server_load"];
  EXPECT_GT(summary["server_load"][0]["share"].get<double>(), 0.7)
      << summary["server_load"];
  EXPECT_GT(summary["test_auc"].get<double>(), 0.7) << summary["test_auc"];
  std::ifstream server0(dir.path() + "/run/server-0.log");
  const std::string log((std::istreambuf_iterator<char>(server0)), {});
  EXPECT_THAT(log, HasSubstr("placement: moved"));
}

}  // namespace
}  // namespace hetps
