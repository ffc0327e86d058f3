// Checkpoints through `hetps launch`: a server killed mid-run is restarted
// from its checkpoint and the job finishes; `hetps save` checkpoints a
// running job; an interrupted job resumes with --resume and trains each
// remaining sample once; `hetps export` writes the model.
#include <gtest/gtest.h>
#include <signal.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <optional>
#include <regex>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/channel.h"
#include "hetps/version.h"
#include "nlohmann/json.hpp"
#include "server/checkpoint.h"
#include "shard/shard_map.h"
#include "support/test_support.h"

namespace hetps {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;
using ::testing::Not;
using testing::RunCommand;
using testing::TempDir;

// Logistic regression on synthetic data, slowed to about 8 s by emulated
// devices, checkpointing every 20 rounds to `ckpt`.
std::string SlowJob(const std::string& ckpt,
                    const std::vector<std::string>& endpoints) {
  return absl::StrCat(R"(name: persist
mode: sync
cluster: {servers: 2, workers: 2, ps_endpoints: [)",
                      absl::StrJoin(endpoints, ", "), R"(]}
client: {connect_deadline_s: 30}
device_profiles:
  - {ranks: [0, 1], throughput: 2500}
checkpoint: {dir: )",
                      ckpt, R"(, every_rounds: 20}
train:
  model: lr
  epochs: 2
  batch_size: 50
  data: {format: synthetic, train_samples: 20000, test_samples: 2000, fields: 8, ids_per_field: 200}
  optimizer: {type: adagrad, learning_rate: 0.1}
)");
}

// The pid of the process with `args` (-1 when none starts within 30 s).
pid_t AwaitPid(const std::vector<std::string>& args) {
  return testing::FindProcess(args, std::chrono::seconds(30)).value_or(-1);
}

// Waits until `dir` holds a checkpoint that verifies.
bool AwaitCheckpoint(const std::string& dir, std::chrono::seconds limit) {
  const auto deadline = std::chrono::steady_clock::now() + limit;
  while (std::chrono::steady_clock::now() < deadline) {
    if (NewestCheckpoint(dir, nullptr).ok()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return false;
}

TEST(PersistenceTest, LaunchRestartsAKilledServerFromItsCheckpoint) {
  TempDir dir;
  const std::string ckpt = dir.path() + "/ckpt";
  const std::string config =
      dir.Write("job.yaml", SlowJob(ckpt, testing::FreeEndpoints(2)));
  testing::LaunchedJob run;
  std::thread launcher([&] { run = testing::LaunchJob(dir, config); });
  const pid_t server1 = AwaitPid({"server", "--config", config, "--rank", "1"});
  ASSERT_GT(server1, 0);
  ASSERT_TRUE(
      AwaitCheckpoint(ServerCheckpointDir(ckpt, 1), std::chrono::seconds(60)));
  kill(server1, SIGKILL);
  launcher.join();
  ASSERT_EQ(run.result.exit_code, 0) << run.result.output;
  const std::string& out = run.result.output;
  EXPECT_THAT(out, HasSubstr("server 1 died"));
  EXPECT_THAT(out, HasSubstr("restarting it from its newest checkpoint"));
  EXPECT_THAT(out, HasSubstr("server 1: restored"));
  EXPECT_EQ(run.summary["server_restarts"], 1);
  EXPECT_EQ(run.summary["finished_samples"], 40000);
  EXPECT_GT(run.summary["test_auc"].get<double>(), 0.7);
}

// The shard map `server` holds (none when it does not answer).
std::optional<ShardMap> ServerShardMap(
    rpc::ParameterServer::StubInterface& server) {
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() +
                       std::chrono::seconds(2));
  rpc::TableInfoRequest request;
  request.set_protocol_version(kProtocolVersion);
  rpc::TableInfoResponse info;
  if (!server.GetTableInfo(&context, request, &info).ok()) return std::nullopt;
  auto map = ShardMap::FromProto(info.shard_map());
  if (!map.ok()) return std::nullopt;
  return *map;
}

// When the test kills server 0 (the coordinator) while buckets move off a
// quarter-speed server 1.
enum class KillServerZero {
  kAfterAMove,         // once a move has settled (map version >= 3)
  kInTheMiddleOfAMove  // as a move's rows reach it (its move record)
};

// Server 0 is killed while server 1 and the workers go on, and restarted
// from its checkpoint: it takes the running job's shard map from server 1
// (its own checkpoint may predate the moves), finishes a handover the
// killed process left open (the rows are still at server 1, its cut in
// the map), restores its rows and the data progress, and carries out the
// rebalancer's later moves. Before, it rebuilt a map of its own from the
// checkpoints, a version server 1 did not hold: after a settled move every
// later move failed ("the servers hold different shard maps"); in the
// middle of a move the workers were refused for good ("belongs to server
// 1, not 0") or waited 30 s for rows that never came, and the job failed.
void RestartServerZeroWhileBucketsMove(KillServerZero when) {
  TempDir dir;
  const std::string ckpt = dir.path() + "/ckpt";
  const std::vector<std::string> endpoints = testing::FreeEndpoints(2);
  const std::string config =
      dir.Write("job.yaml", SlowJob(ckpt, endpoints) +
                                "server_profiles: [{ranks: [1], speed: 0.25}]\n"
                                "sharding: {migrate: true}\n");
  testing::LaunchedJob run;
  std::thread launcher([&] {
    run =
        testing::LaunchJob(dir, config, {"mode=semi_async", "train.epochs=3"});
  });
  const pid_t server0 = AwaitPid({"server", "--config", config, "--rank", "0"});
  ASSERT_GT(server0, 0);
  const std::string moved_in = ServerCheckpointDir(ckpt, 0) + "/moved-in";
  const auto server1 = GrpcParameterServerStubs(64 << 20, {})(endpoints[1]);
  const bool ready = testing::WaitFor(
      [&] {
        // A checkpoint of server 0 to restart from, then the moment.
        if (!NewestCheckpoint(ServerCheckpointDir(ckpt, 0), nullptr).ok()) {
          return false;
        }
        if (when == KillServerZero::kInTheMiddleOfAMove) {
          std::error_code ec;
          return fs::exists(moved_in, ec) && !fs::is_empty(moved_in, ec);
        }
        // The first move's maps are versions 2 (handover) and 3 (settled).
        const std::optional<ShardMap> map = ServerShardMap(*server1);
        return map && map->version() >= 3 && map->pending().empty();
      },
      absl::Seconds(60));
  kill(server0, SIGKILL);
  launcher.join();
  ASSERT_TRUE(ready) << run.result.output;
  ASSERT_EQ(run.result.exit_code, 0) << run.result.output;
  const std::string& out = run.result.output;
  EXPECT_THAT(out, HasSubstr("server 0 died"));
  std::smatch taken;
  ASSERT_TRUE(std::regex_search(
      out, taken,
      std::regex("other servers are running; taking their shard map "
                 "\\(version ([0-9]+)")))
      << out;
  EXPECT_GE(std::stoull(taken[1]), 2u) << "a map of a move";
  EXPECT_THAT(out, HasSubstr("server 0: restored"));
  EXPECT_THAT(out, Not(HasSubstr("different shard maps")));
  EXPECT_THAT(out, Not(HasSubstr("finishing the open handover failed")));
  // A move after the restart.
  const size_t restored = out.find("server 0: restored");
  EXPECT_NE(out.find("placement: moved", restored), std::string::npos) << out;
  EXPECT_EQ(run.summary["server_restarts"], 1);
  EXPECT_EQ(run.summary["finished_samples"], 60000);
  EXPECT_GT(run.summary["test_auc"].get<double>(), 0.7);
}

TEST(PersistenceTest, ServerZeroRestartedAfterAMoveTakesTheRunningJobsMap) {
  RestartServerZeroWhileBucketsMove(KillServerZero::kAfterAMove);
}

// Killed as the rows of a move reach it — between TakeOver and the settled
// map, a window of a few ms the test hit in 4 of 4 runs here (the log then
// says "finished the open handover"; BucketMoverTest.
// AHandoverLeftOpenIsFinishedByAnotherMover checks that part exactly).
TEST(PersistenceTest, ServerZeroRestartedInTheMiddleOfAMoveFinishesIt) {
  RestartServerZeroWhileBucketsMove(KillServerZero::kInTheMiddleOfAMove);
}

TEST(PersistenceTest, KilledServerWithoutCheckpointsStopsTheJobSayingWhy) {
  TempDir dir;
  const std::string config = dir.Write(
      "job.yaml", SlowJob(dir.path() + "/ckpt", testing::FreeEndpoints(2)));
  testing::LaunchedJob run;
  std::thread launcher([&] {
    run = testing::LaunchJob(dir, config,
                             {"checkpoint.dir=", "checkpoint.every_rounds=0"});
  });
  const pid_t server1 = AwaitPid({"server", "--config", config, "--rank", "1"});
  ASSERT_GT(server1, 0);
  std::this_thread::sleep_for(std::chrono::seconds(2));
  kill(server1, SIGKILL);
  launcher.join();
  EXPECT_EQ(run.result.exit_code, 1) << run.result.output;
  EXPECT_THAT(run.result.output,
              HasSubstr("no checkpoint.dir to restart it from"));
}

TEST(PersistenceTest, SaveInterruptResumeAndExport) {
  TempDir dir;
  const std::string ckpt = dir.path() + "/ckpt";
  const auto endpoints = testing::FreeEndpoints(2);
  const std::string config = dir.Write("job.yaml", SlowJob(ckpt, endpoints));
  testing::LaunchedJob first;
  std::thread launcher([&] {
    first = testing::LaunchJob(dir, config, {"checkpoint.every_rounds=0"});
  });
  ASSERT_GT(AwaitPid({"worker", "--config", config, "--rank", "1"}), 0);
  std::this_thread::sleep_for(std::chrono::seconds(3));

  // `hetps save` on the running job: one checkpoint per server.
  const auto saved = RunCommand(
      {testing::HetpsBinary(), "save", "--coordinator", endpoints[0]},
      std::chrono::seconds(60));
  EXPECT_EQ(saved.exit_code, 0) << saved.output;
  EXPECT_THAT(saved.output,
              HasSubstr("server 0: " + ckpt + "/server-0/ckpt-00000001"));
  EXPECT_THAT(saved.output,
              HasSubstr("server 1: " + ckpt + "/server-1/ckpt-00000001"));

  // Interrupt the job (Ctrl-C) before it finishes.
  const pid_t launch = AwaitPid({"launch", config});
  ASSERT_GT(launch, 0);
  kill(launch, SIGINT);
  launcher.join();
  ASSERT_EQ(first.result.exit_code, 130) << first.result.output;

  // --resume: the data progress comes back; every sample of both epochs is
  // counted once over the two runs.
  const testing::LaunchedJob resumed =
      testing::LaunchJob(dir, config, {"checkpoint.resume=true"});
  ASSERT_EQ(resumed.result.exit_code, 0) << resumed.result.output;
  EXPECT_THAT(resumed.result.output, HasSubstr("data progress restored"));
  EXPECT_THAT(resumed.result.output, HasSubstr("server 1: restored"));
  EXPECT_EQ(resumed.summary["finished_samples"], 40000);
  EXPECT_LT(resumed.summary["samples"].get<uint64_t>(), 40000u);
  EXPECT_GT(resumed.summary["test_auc"].get<double>(), 0.7);

  // Export the newest checkpoints (the resumed run wrote more).
  const std::string out = dir.path() + "/model";
  const auto exported = RunCommand({testing::HetpsBinary(), "export",
                                    "--checkpoint-dir", ckpt, "--out", out},
                                   std::chrono::seconds(60));
  ASSERT_EQ(exported.exit_code, 0) << exported.output;
  std::ifstream in(fs::path(out) / "model.json");
  const nlohmann::json model = nlohmann::json::parse(in, nullptr, false);
  ASSERT_TRUE(model.is_object());
  EXPECT_EQ(model["format"], "hetps-model-1");
  ASSERT_FALSE(model["tables"].empty());
  for (const auto& table : model["tables"]) {
    const fs::path file = fs::path(out) / table["file"].get<std::string>();
    ASSERT_TRUE(fs::exists(file)) << file;
    const uint64_t dim = table["dim"].get<uint64_t>();
    if (table["kind"] == "sparse") {
      EXPECT_GT(table["rows"].get<uint64_t>(), 0u);
      EXPECT_EQ(fs::file_size(file),
                table["rows"].get<uint64_t>() * (8 + 4 * dim));
    } else {
      EXPECT_EQ(fs::file_size(file), 4 * dim);
    }
  }
}

TEST(PersistenceTest, CorruptNewestCheckpointIsRefusedAndThePreviousLoads) {
  TempDir dir;
  const std::string ckpt = dir.path() + "/ckpt";
  const auto endpoints = testing::FreeEndpoints(2);
  const std::string config = dir.Write("job.yaml", SlowJob(ckpt, endpoints));
  // A short first run leaves several checkpoints per server.
  const testing::LaunchedJob first =
      testing::LaunchJob(dir, config, {"train.epochs=1", "checkpoint.keep=3"});
  ASSERT_EQ(first.result.exit_code, 0) << first.result.output;
  std::vector<std::string> refused;
  auto newest = NewestCheckpoint(ServerCheckpointDir(ckpt, 1), &refused);
  ASSERT_TRUE(newest.ok()) << newest.status();
  const std::string victim = newest->path + "/table-lr_emb.sparse";
  ASSERT_TRUE(fs::exists(victim)) << victim;
  fs::resize_file(victim, fs::file_size(victim) / 2);

  const testing::LaunchedJob resumed = testing::LaunchJob(
      dir, config, {"train.epochs=1", "checkpoint.resume=true"});
  ASSERT_EQ(resumed.result.exit_code, 0) << resumed.result.output;
  EXPECT_THAT(resumed.result.output,
              HasSubstr("checkpoint refused: " + victim));
  EXPECT_THAT(resumed.result.output, HasSubstr("truncated"));
  EXPECT_THAT(resumed.result.output, HasSubstr("server 1: restored"));
}

}  // namespace
}  // namespace hetps
