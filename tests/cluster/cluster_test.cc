// Multi-process clusters on 127.0.0.1: real `hetps server` processes and
// worker processes pushing known gradients, checked value by value.
#include <gtest/gtest.h>
#include <signal.h>

#include <atomic>
#include <cstdio>
#include <functional>
#include <map>
#include <mutex>
#include <random>
#include <regex>
#include <thread>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "cli/roles.h"
#include "cluster/pattern.h"
#include "hetps/ps_client.h"
#include "hetps/version.h"
#include "server/checkpoint.h"
#include "server/ps_server.h"
#include "shard/bucket_mover.h"
#include "support/test_support.h"

namespace hetps {
namespace {

using ::testing::HasSubstr;
using testing::RunCommand;
using testing::ServerProcesses;
using testing::TempDir;

std::string PatternConfig(const std::string& mode,
                          const std::vector<std::string>& endpoints,
                          int workers, const std::string& extra = "") {
  return absl::StrCat(R"(name: pattern
mode: )",
                      mode, R"(
cluster:
  workers: )",
                      workers, R"(
  ps_endpoints: [)",
                      absl::StrJoin(endpoints, ", "), R"(]
client:
  connect_deadline_s: 30
server:
  heartbeat_timeout_s: 60
train:
  model: none
  warmup_rounds: 0  # the tests check exact sums of full steps
  batch_size: 1     # a full round's samples known before the first
tables:
  - name: emb
    kind: sparse
    dim: 4
    optimizer: {type: sgd, learning_rate: 0.5}
    init: {type: zero}
  - name: dense
    kind: dense
    dim: 10
    optimizer: {type: sgd, learning_rate: 0.5}
    init: {type: zero}
)",
                      extra);
}

// Runs pattern workers for `rounds` against 2 servers; returns the final
// sparse rows of `keys` and the dense table, read back through a PsClient.
struct Final {
  std::map<uint64_t, std::vector<float>> rows;
  std::vector<float> dense;
};

struct PatternRun {
  int workers = 3;
  int pause_ms = 0;          // after each round
  std::string extra_config;  // appended to PatternConfig's
  // Runs beside the workers until `done` turns true (they all exited).
  std::function<void(const std::vector<std::string>& endpoints,
                     const std::atomic<bool>& done)>
      during;
};

// Runs `workers` pattern workers for `rounds` in `group`, `during` beside
// them (its flag turns true once they all exited); expects each to exit 0
// within two minutes.
void RunWorkers(ProcessGroup& group, const std::string& config,
                const std::vector<std::string>& endpoints, int workers,
                int rounds, int pause_ms,
                const std::function<void(const std::vector<std::string>&,
                                         const std::atomic<bool>&)>& during) {
  for (int w = 0; w < workers; ++w) {
    auto pid = group.Spawn(absl::StrCat("worker ", w),
                           {HETPS_PATTERN_WORKER, config, std::to_string(w),
                            std::to_string(rounds), std::to_string(pause_ms)});
    EXPECT_TRUE(pid.ok()) << pid.status();
  }
  std::atomic<bool> workers_done{false};
  std::thread beside;
  if (during) beside = std::thread([&] { during(endpoints, workers_done); });
  int done = 0;
  const auto deadline =
      std::chrono::steady_clock::now() + std::chrono::seconds(120);
  while (done < workers && std::chrono::steady_clock::now() < deadline) {
    auto exit = group.WaitAny(absl::Milliseconds(100));
    if (!exit) continue;
    EXPECT_EQ(exit->exit_code, 0) << exit->label;
    EXPECT_THAT(exit->label, HasSubstr("worker"));
    ++done;
  }
  EXPECT_EQ(done, workers) << "workers did not finish in time";
  workers_done = true;
  if (beside.joinable()) beside.join();
}

// The rows of `keys` and the dense table, read through a PsClient.
Final ReadFinal(const std::vector<std::string>& endpoints,
                const std::vector<uint64_t>& keys) {
  Final final;
  PsClientOptions options;
  options.endpoints = endpoints;
  options.worker_id = 0;
  auto client = PsClient::Connect(options);
  EXPECT_TRUE(client.ok()) << client.status();
  if (!client.ok()) return final;
  std::vector<float> rows(keys.size() * pattern::kDim);
  EXPECT_TRUE((*client)->PullSparse(pattern::kSparse, keys, rows).ok());
  for (size_t i = 0; i < keys.size(); ++i) {
    final.rows[keys[i]] =
        std::vector<float>(rows.begin() + i * pattern::kDim,
                           rows.begin() + (i + 1) * pattern::kDim);
  }
  final.dense.resize(pattern::kDenseSize);
  EXPECT_TRUE((*client)->PullDense(pattern::kDense, final.dense).ok());
  return final;
}

Final RunPattern(const std::string& mode, int rounds,
                 const std::vector<uint64_t>& keys,
                 const PatternRun& run = {}) {
  TempDir dir;
  const auto endpoints = testing::FreeEndpoints(2);
  const std::string config =
      dir.Write("job.yaml",
                PatternConfig(mode, endpoints, run.workers, run.extra_config));
  ServerProcesses servers;
  EXPECT_TRUE(servers.Start(config, 2, std::chrono::seconds(30)));
  RunWorkers(servers.group(), config, endpoints, run.workers, rounds,
             run.pause_ms, run.during);
  return ReadFinal(endpoints, keys);
}

// Gradient of `key` in worker w's step of round r, duplicates merged.
float WorkerGrad(uint32_t w, int r, uint64_t key, uint64_t c) {
  const pattern::Step step = pattern::StepOf(w, r);
  float g = 0;
  for (size_t i = 0; i < step.keys.size(); ++i) {
    if (step.keys[i] == key) g += step.sparse_grads[i * pattern::kDim + c];
  }
  return g;
}

std::vector<uint64_t> CheckedKeys() {
  std::vector<uint64_t> keys = {0, 3, 17, 39};
  for (uint32_t w = 0; w < 3; ++w) {
    keys.push_back(1000 + w * 100);
    keys.push_back(1000 + w * 100 + 7);
  }
  return keys;
}

constexpr int kRounds = 12;

// Sync: each round's pushes merged (Σ b·g over the round's batch of 4) and
// applied once: bit-exact, since every sum is of small dyadic numbers.
Final SyncValues(const std::vector<uint64_t>& keys, int rounds) {
  Final expected;
  for (uint64_t key : keys) {
    std::vector<float>& row = expected.rows[key];
    row.assign(pattern::kDim, 0.0f);
    for (int r = 0; r < rounds; ++r) {
      for (uint64_t c = 0; c < pattern::kDim; ++c) {
        float merged = 0;
        for (uint32_t w = 0; w < 3; ++w) {
          merged += pattern::BatchOf(w) * WorkerGrad(w, r, key, c);
        }
        row[c] -= pattern::kLearningRate * (merged / 4.0f);
      }
    }
  }
  expected.dense.assign(pattern::kDenseSize, 0.0f);
  for (int r = 0; r < rounds; ++r) {
    for (uint64_t i = 0; i < pattern::kDenseSize; ++i) {
      float merged = 0;
      for (uint32_t w = 0; w < 3; ++w) {
        merged += pattern::BatchOf(w) * pattern::GradOf(w, r, i, 0);
      }
      expected.dense[i] -= pattern::kLearningRate * (merged / 4.0f);
    }
  }
  return expected;
}

// Every push of `workers` applied once, as `scale` of a step: the same
// total in any order (async: 1; semi_async with batch-1 workers and queues
// of at most a full round of 2: 1/2 each).
Final EachPushOnceValues(const std::vector<uint64_t>& keys, int rounds,
                         uint32_t workers, float scale) {
  Final expected;
  for (uint64_t key : keys) {
    std::vector<float>& row = expected.rows[key];
    row.assign(pattern::kDim, 0.0f);
    for (int r = 0; r < rounds; ++r) {
      for (uint32_t w = 0; w < workers; ++w) {
        for (uint64_t c = 0; c < pattern::kDim; ++c) {
          row[c] -= pattern::kLearningRate * scale * WorkerGrad(w, r, key, c);
        }
      }
    }
  }
  expected.dense.assign(pattern::kDenseSize, 0.0f);
  for (int r = 0; r < rounds; ++r) {
    for (uint32_t w = 0; w < workers; ++w) {
      for (uint64_t i = 0; i < pattern::kDenseSize; ++i) {
        expected.dense[i] -=
            pattern::kLearningRate * scale * pattern::GradOf(w, r, i, 0);
      }
    }
  }
  return expected;
}

// Value by value, bit-exact: every row `expected` names and the dense table.
void ExpectValues(const Final& got, const Final& expected) {
  for (const auto& [key, row] : expected.rows) {
    ASSERT_TRUE(got.rows.contains(key)) << "key " << key;
    EXPECT_EQ(got.rows.at(key), row) << "key " << key;
  }
  EXPECT_EQ(got.dense, expected.dense);
}

void ExpectSyncValues(const Final& final, const std::vector<uint64_t>& keys,
                      int rounds) {
  ExpectValues(final, SyncValues(keys, rounds));
}

void ExpectEachPushOnce(const Final& final, const std::vector<uint64_t>& keys,
                        int rounds, uint32_t workers, float scale) {
  ExpectValues(final, EachPushOnceValues(keys, rounds, workers, scale));
}

TEST(ClusterTest, SyncTwoServersThreeWorkersGiveExactValues) {
  const auto keys = CheckedKeys();
  ExpectSyncValues(RunPattern("sync", kRounds, keys), keys, kRounds);
}

TEST(ClusterTest, AsyncTwoServersThreeWorkersGiveTheSameTotal) {
  const auto keys = CheckedKeys();
  ExpectEachPushOnce(RunPattern("async", kRounds, keys), keys, kRounds, 3,
                     1.0f);
}

// Live bucket migration (issue 14): while the workers push, a BucketMover
// moves the buckets of the pattern's keys between the two servers every
// 10-50 ms; the final values are exactly those of a run without moves.
// Returns the moves made.
// Moves the buckets `workers` pattern workers push to between the two
// servers every 10-50 ms until `stop`, counting them in `moves`. A move may
// fail only once `stop` is set (the workers leaving end a move's wait).
// `start`: where the buckets are (only this mover moves them).
void MoveBucketsUntil(const std::vector<std::string>& endpoints,
                      const std::string& mode, int workers,
                      const std::atomic<bool>& stop, std::atomic<int>* moves,
                      uint32_t seed = 7,
                      const ShardMap& start = ShardMap::Uniform(
                          2, JobConfig().server.num_buckets)) {
  auto parsed = ParseConsistencyMode(mode);
  EXPECT_TRUE(parsed.ok()) << parsed.status();
  if (!parsed.ok()) return;
  BucketMover mover(endpoints, *parsed,
                    GrpcParameterServerStubs(64 << 20, Credentials()));
  // The buckets the workers push to: the shared keys' and their own.
  std::vector<uint64_t> pushed;
  for (uint32_t w = 0; w < static_cast<uint32_t>(workers); ++w) {
    for (uint64_t key : pattern::StepOf(w, 0).keys) pushed.push_back(key);
  }
  std::mt19937 random(seed);
  std::map<uint32_t, uint32_t> owner;  // as the moves left them
  while (!stop) {
    const uint32_t bucket = start.BucketOf(pushed[random() % pushed.size()]);
    auto [it, first] = owner.try_emplace(bucket, start.owner(bucket));
    const uint32_t to = 1 - it->second;
    auto moved = mover.Move({{bucket, to}});
    if (!moved.ok() && absl::StrContains(moved.status().message(),
                                         "has sent no request yet")) {
      // Sync or semi_async, a worker not started yet: the move waits for it.
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
      continue;
    }
    if (!moved.ok()) {
      EXPECT_TRUE(stop) << moved.status();
      break;
    }
    it->second = to;
    ++*moves;
    // The pace of the forced moves (issue 14: every 10-50 ms), not a wait
    // for anything: what the tests check is read after the moves end, and
    // they assert the moves happened.
    std::this_thread::sleep_for(std::chrono::milliseconds(10 + random() % 41));
  }
}

// Live bucket migration (issue 14): while the workers push, a BucketMover
// moves the buckets of the pattern's keys between the two servers every
// 10-50 ms; the final values are exactly those of a run without moves.
// Returns the moves made.
int MoveBucketsWhileTraining(const std::string& mode, int rounds,
                             const std::vector<uint64_t>& keys, PatternRun run,
                             Final* final) {
  std::atomic<int> moves{0};
  run.pause_ms = 5;
  run.during = [&](const std::vector<std::string>& endpoints,
                   const std::atomic<bool>& done) {
    MoveBucketsUntil(endpoints, mode, run.workers, done, &moves);
  };
  *final = RunPattern(mode, rounds, keys, run);
  std::printf("%d bucket moves while training\n", moves.load());
  return moves;
}

TEST(ClusterMigrationTest, AsyncBucketsMovingEveryFewMsLoseNoUpdate) {
  const auto keys = CheckedKeys();
  Final final;
  const int moves = MoveBucketsWhileTraining("async", 200, keys, {}, &final);
  EXPECT_GE(moves, 10);
  ExpectEachPushOnce(final, keys, 200, 3, 1.0f);
}

TEST(ClusterMigrationTest, SyncBucketsMovingEveryFewMsKeepExactRounds) {
  const auto keys = CheckedKeys();
  Final final;
  const int moves = MoveBucketsWhileTraining("sync", 200, keys, {}, &final);
  EXPECT_GE(moves, 10);
  ExpectSyncValues(final, keys, 200);
}

TEST(ClusterMigrationTest, SemiAsyncBucketsMovingEveryFewMsLoseNoUpdate) {
  // Two workers of batch 1 and a fixed window of 2 without staleness
  // weights: every apply takes Σ g / 2, whether a full queue or a queue a
  // handover applied early, so the total is exact.
  const auto keys = CheckedKeys();
  PatternRun run;
  run.workers = 2;
  run.extra_config = R"(semi_async:
  window_min: 2
  window_max: 2
  adapt_window: false
  staleness_decay: 0
)";
  Final final;
  const int moves =
      MoveBucketsWhileTraining("semi_async", 200, keys, run, &final);
  EXPECT_GE(moves, 10);
  std::vector<uint64_t> shared;  // worker 2's own keys were never pushed
  for (uint64_t key : keys) {
    if (key < 1200) shared.push_back(key);
  }
  ExpectEachPushOnce(final, shared, 200, 2, 0.5f);
}

// Checkpoints saved while buckets move, and a whole-job resume from them
// (issue 14). The workers push while buckets move every 10-50 ms and the
// servers save every 30 ms; once the workers are done, saves and moves go
// on side by side, then moves alone (those rows are only in the move
// records); then the job stops between two moves. Resumed, every row is
// exactly the sum of what was pushed, and a second run of the workers,
// moving buckets on from where the first left them, adds exactly its own.
struct CheckpointedMigration {
  std::string mode;
  int workers = 3;
  std::string extra_config = "";
  std::function<Final(int rounds)> expected;
};

void SaveOnEveryServer(const std::vector<std::string>& endpoints) {
  for (const std::string& endpoint : endpoints) {
    auto stub = GrpcParameterServerStubs(64 << 20, Credentials())(endpoint);
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() +
                         std::chrono::seconds(60));
    rpc::SaveRequest request;
    request.set_protocol_version(kProtocolVersion);
    rpc::SaveResponse response;
    const grpc::Status status = stub->Save(&context, request, &response);
    EXPECT_TRUE(status.ok()) << endpoint << ": " << status.error_message();
  }
}

Final Sum(const Final& a, const Final& b) {
  Final sum = a;
  for (auto& [key, row] : sum.rows) {
    for (size_t c = 0; c < row.size(); ++c) row[c] += b.rows.at(key)[c];
  }
  for (size_t i = 0; i < sum.dense.size(); ++i) sum.dense[i] += b.dense[i];
  return sum;
}

// Waits until `moves` reaches `count` (the mover counts its moves), for at
// most a minute.
void AwaitMoves(const std::atomic<int>& moves, int count) {
  const auto deadline =
      std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (moves < count && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  ASSERT_GE(moves, count) << "the mover stopped moving";
}

void ResumeAfterSavesWhileBucketsMove(const CheckpointedMigration& job) {
  constexpr int kFirst = 60;
  // Past kMaxHoldAhead (64) with room: a move's cut lies as many clocks
  // ahead as the workers run during a hold (the median of the last ones),
  // up to that cap, and under TSan a hold is long. At 40 rounds, when the
  // cut followed the last hold alone (which for the resumed job's first
  // move included the mover's connecting), the second move's cut lay past
  // the last round in 3 of 4 TSan runs: 2 moves made.
  constexpr int kSecond = 150;
  const auto keys = CheckedKeys();
  TempDir dir;
  const auto endpoints = testing::FreeEndpoints(2);
  const std::string ckpt = dir.path() + "/ckpt";
  const std::string config = dir.Write(
      "job.yaml",
      PatternConfig(job.mode, endpoints, job.workers,
                    absl::StrCat(job.extra_config, "checkpoint:\n  dir: ", ckpt,
                                 "\n  max_server_restarts: 0\n")));
  {
    ServerProcesses servers;
    ASSERT_TRUE(servers.Start(config, 2, std::chrono::seconds(30)));
    std::atomic<int> moves{0};
    std::atomic<int> saves{0};
    std::atomic<bool> stop_moving{false};
    std::thread mover([&] {
      MoveBucketsUntil(endpoints, job.mode, job.workers, stop_moving, &moves);
    });
    RunWorkers(servers.group(), config, endpoints, job.workers, kFirst, 5,
               [&](const std::vector<std::string>& eps,
                   const std::atomic<bool>& done) {
                 while (!done) {
                   SaveOnEveryServer(eps);
                   ++saves;
                   std::this_thread::sleep_for(std::chrono::milliseconds(30));
                 }
               });
    const int moves_while_training = moves;
    // Saves beside the moves (at least 5 more, and 10 in all however many
    // the training left time for), then moves after the last save.
    for (int i = 0; i < 5 || saves < 10; ++i) {
      const int before = moves;
      SaveOnEveryServer(endpoints);
      ++saves;
      AwaitMoves(moves, before + 1);
    }
    const int moves_at_last_save = moves;
    AwaitMoves(moves, moves_at_last_save + 10);
    stop_moving = true;
    mover.join();
    std::printf("%d moves while training, %d in all, %d saves\n",
                moves_while_training, moves.load(), saves.load());
    EXPECT_GE(moves_while_training, 5);
    servers.group().StopAll(absl::Seconds(5));
  }

  auto resumed = ResumedShardMap(ckpt, 2, JobConfig().server.num_buckets);
  ASSERT_TRUE(resumed.ok()) << resumed.status();
  EXPECT_GT(resumed->version(), 1u) << "the moves left every bucket home";
  ServerProcesses servers;
  ASSERT_TRUE(servers.Start(config, 2, std::chrono::seconds(30), {"--resume"}));
  ExpectValues(ReadFinal(endpoints, keys), job.expected(kFirst));
  std::atomic<int> moves{0};
  RunWorkers(
      servers.group(), config, endpoints, job.workers, kSecond, 5,
      [&](const std::vector<std::string>& eps, const std::atomic<bool>& done) {
        MoveBucketsUntil(eps, job.mode, job.workers, done, &moves, 11,
                         *resumed);
      });
  EXPECT_GE(moves, 3);
  ExpectValues(ReadFinal(endpoints, keys),
               Sum(job.expected(kFirst), job.expected(kSecond)));
}

TEST(ClusterMigrationTest, AsyncSavesWhileBucketsMoveResumeExactly) {
  ResumeAfterSavesWhileBucketsMove(
      {.mode = "async", .expected = [](int rounds) {
         return EachPushOnceValues(CheckedKeys(), rounds, 3, 1.0f);
       }});
}

TEST(ClusterMigrationTest, SyncSavesWhileBucketsMoveResumeExactly) {
  ResumeAfterSavesWhileBucketsMove({.mode = "sync", .expected = [](int rounds) {
                                      return SyncValues(CheckedKeys(), rounds);
                                    }});
}

TEST(ClusterMigrationTest, SemiAsyncSavesWhileBucketsMoveResumeExactly) {
  // As SemiAsyncBucketsMovingEveryFewMsLoseNoUpdate: two workers, a fixed
  // window of 2.
  std::vector<uint64_t> shared;
  for (uint64_t key : CheckedKeys()) {
    if (key < 1200) shared.push_back(key);
  }
  ResumeAfterSavesWhileBucketsMove({.mode = "semi_async",
                                    .workers = 2,
                                    .extra_config = R"(semi_async:
  window_min: 2
  window_max: 2
  adapt_window: false
  staleness_decay: 0
)",
                                    .expected = [shared](int rounds) {
                                      return EachPushOnceValues(shared, rounds,
                                                                2, 0.5f);
                                    }});
}

// `hetps server` of rank `rank` saving every 5 applies under `ckpt_dir`.
std::vector<std::string> SavingServer(const std::string& config,
                                      const std::string& ckpt_dir, int rank) {
  return {testing::HetpsBinary(),
          "server",
          "--config",
          config,
          "--rank",
          std::to_string(rank),
          "--checkpoint-dir",
          ckpt_dir,
          "--checkpoint-every",
          "5"};
}

// Servers 0 and 1 (SavingServer) in `group`, whose line callback counts
// the servers' listening lines in `listening`, then once both listen one
// pattern worker of `rounds` rounds pausing `pause_ms` after each. Returns
// server 1's pid.
absl::StatusOr<pid_t> StartSavingJob(ProcessGroup& group,
                                     const std::atomic<int>& listening,
                                     const std::string& config,
                                     const std::string& ckpt_dir, int rounds,
                                     int pause_ms) {
  auto server0 = group.Spawn("server 0", SavingServer(config, ckpt_dir, 0));
  if (!server0.ok()) return server0.status();
  auto server1 = group.Spawn("server 1", SavingServer(config, ckpt_dir, 1));
  if (!server1.ok()) return server1.status();
  const auto deadline =
      std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (listening < 2 && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  if (listening < 2) {
    return absl::DeadlineExceededError("the servers did not listen in 30 s");
  }
  auto worker = group.Spawn(
      "worker 0", {HETPS_PATTERN_WORKER, config, "0", std::to_string(rounds),
                   std::to_string(pause_ms)});
  if (!worker.ok()) return worker.status();
  return *server1;
}

// A server killed with SIGKILL while buckets move between the two servers
// every 10-50 ms, and started again by hand (--resume) while the worker and
// the mover wait and retry (issue 14). The moves go on, the worker
// finishes, and every row holds every push but at most one run of rounds
// that the killed server applied after its newest checkpoint (or move
// record) of that row: what the checkpoint contract allows, and no more —
// no row goes back further, loses its state or gets a push twice.
TEST(ClusterMigrationTest,
     AServerKilledWhileBucketsMoveLosesOnlyWhatItsCheckpointAllows) {
  constexpr int kLongRounds = 120;
  TempDir dir;
  const auto endpoints = testing::FreeEndpoints(2);
  const std::string ckpt_dir = dir.path() + "/ckpt";
  const std::string config_path =
      dir.Write("job.yaml", PatternConfig("async", endpoints, 1));
  std::atomic<int> listening{0};
  ProcessGroup group([&](const std::string&, const std::string& line) {
    if (line.rfind(kListeningPrefix, 0) == 0) ++listening;
  });
  auto server1 =
      StartSavingJob(group, listening, config_path, ckpt_dir, kLongRounds, 20);
  ASSERT_TRUE(server1.ok()) << server1.status();
  std::atomic<int> moves{0};
  std::atomic<bool> stop_moving{false};
  std::thread mover(
      [&] { MoveBucketsUntil(endpoints, "async", 1, stop_moving, &moves); });

  // Kill server 1 once it has checkpointed push 20 or later, and buckets
  // have moved.
  const std::string server1_dir = ServerCheckpointDir(ckpt_dir, 1);
  const auto ckpt_deadline =
      std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (std::chrono::steady_clock::now() < ckpt_deadline) {
    auto newest = NewestCheckpoint(server1_dir, nullptr);
    if (newest.ok() && newest->manifest.value("applied_rounds", 0) >= 20 &&
        moves >= 5) {
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  // Any later moment would do: the check below holds for every kill point.
  ASSERT_EQ(kill(*server1, SIGKILL), 0);
  auto killed = group.WaitAny(absl::Seconds(10));
  ASSERT_TRUE(killed.has_value());
  ASSERT_EQ(killed->label, "server 1");
  const int moves_at_kill = moves;
  // Every push to server 1 before its newest checkpoint is in it.
  auto newest = NewestCheckpoint(server1_dir, nullptr);
  ASSERT_TRUE(newest.ok()) << newest.status();
  const int saved = newest->manifest.value("applied_rounds", -1);
  ASSERT_GE(saved, 20);
  ASSERT_LT(saved, kLongRounds) << "the worker finished before the kill";

  std::vector<std::string> again = SavingServer(config_path, ckpt_dir, 1);
  again.push_back("--resume");
  ASSERT_TRUE(group.Spawn("server 1 again", again).ok());
  auto done = group.WaitAny(absl::Seconds(120));
  ASSERT_TRUE(done.has_value()) << "the worker did not finish";
  EXPECT_EQ(done->label, "worker 0");
  EXPECT_EQ(done->exit_code, 0) << "the worker must wait and retry";
  stop_moving = true;
  mover.join();
  std::printf("%d moves before the kill, %d after; server 1 saved at push %d\n",
              moves_at_kill, moves.load() - moves_at_kill, saved);
  EXPECT_GE(moves.load() - moves_at_kill, 3) << "the moves stopped";

  // Each value is every round's step but those of one run [a, b) with
  // a >= the saved push: one worker's pushes are its rounds, in order.
  auto lost_at_most_one_run = [&](auto grad_of) {
    std::vector<float> all(kLongRounds + 1, 0.0f);  // all[r]: rounds < r
    for (int r = 0; r < kLongRounds; ++r) {
      all[r + 1] = all[r] - pattern::kLearningRate * grad_of(r);
    }
    return [all, saved](float value) {
      const int n = static_cast<int>(all.size()) - 1;
      for (int a = saved; a <= n; ++a) {
        for (int b = a; b <= n; ++b) {
          if (all[n] - (all[b] - all[a]) == value) return true;
        }
      }
      return false;
    };
  };
  const Final final = ReadFinal(endpoints, CheckedKeys());
  for (const auto& [k, row] : final.rows) {
    const uint64_t key = k;  // a lambda may not capture a binding (C++17)
    for (uint64_t c = 0; c < pattern::kDim; ++c) {
      auto fits =
          lost_at_most_one_run([&](int r) { return WorkerGrad(0, r, key, c); });
      EXPECT_TRUE(fits(row[c]))
          << "key " << key << " column " << c << ": " << row[c];
    }
  }
  for (uint64_t i = 0; i < pattern::kDenseSize; ++i) {
    auto fits = lost_at_most_one_run(
        [&](int r) { return pattern::GradOf(0, r, i, 0); });
    EXPECT_TRUE(fits(final.dense[i]))
        << "dense " << i << ": " << final.dense[i];
  }
  group.StopAll(absl::Seconds(5));
}

// A server killed with SIGKILL mid-run comes back (by hand, --resume) from
// its newest checkpoint while the worker waits and retries. With one sync
// worker every round is deterministic, so the final table is known exactly:
// server 0 holds what an undisturbed run holds, server 1 holds its
// checkpoint plus exactly the rounds applied after the restart.
TEST(ClusterTest, KilledServerResumesFromItsCheckpointPlusTheLaterRounds) {
  constexpr int kLongRounds = 80;
  TempDir dir;
  const auto endpoints = testing::FreeEndpoints(2);
  const std::string ckpt_dir = dir.path() + "/ckpt";
  const std::string config_path =
      dir.Write("job.yaml", PatternConfig("sync", endpoints, 1));
  std::atomic<int> listening{0};
  std::mutex mu;
  std::vector<std::string> restarted_output;  // guarded by mu
  ProcessGroup group([&](const std::string& label, const std::string& line) {
    if (line.rfind(kListeningPrefix, 0) == 0) ++listening;
    if (label == "server 1 again") {
      std::lock_guard<std::mutex> lock(mu);
      restarted_output.push_back(line);
    }
  });
  auto server1 =
      StartSavingJob(group, listening, config_path, ckpt_dir, kLongRounds, 40);
  ASSERT_TRUE(server1.ok()) << server1.status();

  // Kill server 1 once it has checkpointed round 20 or later.
  const std::string server1_dir = ServerCheckpointDir(ckpt_dir, 1);
  const auto ckpt_deadline =
      std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (std::chrono::steady_clock::now() < ckpt_deadline) {
    auto newest = NewestCheckpoint(server1_dir, nullptr);
    if (newest.ok() && newest->manifest.value("applied_rounds", 0) >= 20) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  // A few rounds after the checkpoint: they are lost on server 1.
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  ASSERT_EQ(kill(*server1, SIGKILL), 0);
  auto killed = group.WaitAny(absl::Seconds(10));
  ASSERT_TRUE(killed.has_value());
  ASSERT_EQ(killed->label, "server 1");

  // What the restarted server will load, read before it writes newer ones.
  auto newest = NewestCheckpoint(server1_dir, nullptr);
  ASSERT_TRUE(newest.ok()) << newest.status();
  const int saved_round = newest->manifest.value("applied_rounds", -1);
  ASSERT_GE(saved_round, 20);
  ASSERT_LT(saved_round, kLongRounds) << "the worker finished before the kill";
  auto config = LoadJobConfigFile(config_path);
  ASSERT_TRUE(config.ok() && ValidateJobConfig(*config).ok());
  config->checkpoint.dir = ckpt_dir;
  config->checkpoint.resume = true;
  auto saved = PsServer::Create(*config, 1);
  ASSERT_TRUE(saved.ok());
  ASSERT_TRUE(Checkpointer(*config, 1, saved->get()).Restore().ok());

  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  std::vector<std::string> again = SavingServer(config_path, ckpt_dir, 1);
  again.push_back("--resume");
  ASSERT_TRUE(group.Spawn("server 1 again", again).ok());
  auto done = group.WaitAny(absl::Seconds(120));
  ASSERT_TRUE(done.has_value()) << "the worker did not finish";
  EXPECT_EQ(done->label, "worker 0");
  EXPECT_EQ(done->exit_code, 0) << "the worker must wait and retry";

  // The first round the restarted server applied: the rounds before it
  // closed empty there (logged, "E of rounds A..B ... closed empty"). The
  // rounds A..B closed together, and those that had pushes are the last
  // B - A + 1 - E of them (the worker's retried push of the round it was
  // in when the server died, when that push arrived before the close), so
  // the first applied is A + E, not always B + 1.
  int first_applied = -1;
  {
    std::lock_guard<std::mutex> lock(mu);
    const std::regex closed(R"((\d+) of rounds (\d+)\.\.(\d+) .*closed empty)");
    for (const std::string& line : restarted_output) {
      std::smatch m;
      if (!std::regex_search(line, m, closed)) continue;
      first_applied = std::stoi(m[2]) + std::stoi(m[1]);
    }
  }
  ASSERT_GE(first_applied, saved_round)
      << "no 'closed empty' line from the restarted server";
  ASSERT_LT(first_applied, kLongRounds);

  PsClientOptions options;
  options.endpoints = endpoints;
  auto client = PsClient::Connect(options);
  ASSERT_TRUE(client.ok()) << client.status();
  const ShardMap shard_map = ShardMap::Uniform(2, config->server.num_buckets);
  int on_server1 = 0;
  for (uint64_t key : CheckedKeys()) {
    std::vector<float> row(pattern::kDim);
    ASSERT_TRUE(
        (*client)
            ->PullSparse(pattern::kSparse, std::vector<uint64_t>{key}, row)
            .ok());
    std::vector<float> expected(pattern::kDim, 0.0f);
    int from = 0;
    if (shard_map.ServerOf(key) == 1) {
      ++on_server1;
      // Rows the checkpoint lacks (keys worker 0 never pushes) start at 0.
      (*saved)->sparse_table(pattern::kSparse)->Lookup(key, expected);
      from = first_applied;
    }
    for (int r = from; r < kLongRounds; ++r) {
      for (uint64_t c = 0; c < pattern::kDim; ++c) {
        expected[c] -= pattern::kLearningRate * WorkerGrad(0, r, key, c);
      }
    }
    EXPECT_EQ(row, expected)
        << "key " << key << " on server " << shard_map.ServerOf(key);
  }
  EXPECT_GT(on_server1, 0);
  std::vector<float> dense(pattern::kDenseSize);
  ASSERT_TRUE((*client)->PullDense(pattern::kDense, dense).ok());
  const DenseTable::Snapshot slice =
      (*saved)->dense_table(pattern::kDense)->Save();
  const uint64_t offset = (*saved)->dense_table(pattern::kDense)->offset();
  for (uint64_t i = 0; i < pattern::kDenseSize; ++i) {
    const bool restored = i >= offset && i - offset < slice.weights.size();
    float expected = restored ? slice.weights[i - offset] : 0.0f;
    for (int r = restored ? first_applied : 0; r < kLongRounds; ++r) {
      expected -= pattern::kLearningRate * pattern::GradOf(0, r, i, 0);
    }
    EXPECT_EQ(dense[i], expected) << "dense " << i;
  }
}

TEST(ClusterTest, UnreachableServerFailsWithinTheDeadlineNamingIt) {
  const std::string endpoint = testing::FreeEndpoints(1)[0];
  const auto result =
      RunCommand({testing::HetpsBinary(), "worker", "--rank", "0", "--set",
                  "cluster.ps_endpoints=" + endpoint, "--set",
                  "cluster.workers=1", "--set", "client.connect_deadline_s=2"},
                 std::chrono::seconds(30));
  EXPECT_EQ(result.exit_code, 1) << result.output;
  EXPECT_THAT(result.output, HasSubstr(endpoint));
  EXPECT_THAT(result.output, HasSubstr("unreachable"));
  EXPECT_GE(result.seconds, 2.0);
  EXPECT_LT(result.seconds, 10.0);
}

TEST(ClusterTest, WorkerStartedBeforeItsServersWaitsAndSucceeds) {
  TempDir dir;
  const auto endpoints = testing::FreeEndpoints(2);
  const std::string config = dir.Write(
      "job.yaml",
      absl::StrCat("mode: sync\ncluster:\n  workers: 1\n  ps_endpoints: [",
                   absl::StrJoin(endpoints, ", "),
                   "]\ntrain:\n  epochs: 1\n  data: {train_samples: 2000, "
                   "test_samples: 500}\nclient:\n  connect_deadline_s: 30\n"));
  ServerProcesses cluster;
  auto worker = cluster.group().Spawn(
      "worker 0",
      {testing::HetpsBinary(), "worker", "--config", config, "--rank", "0"});
  ASSERT_TRUE(worker.ok()) << worker.status();
  std::this_thread::sleep_for(std::chrono::seconds(2));
  EXPECT_EQ(cluster.group().RunningLabels().size(), 1u)
      << "the worker must still be waiting for its servers";
  ASSERT_TRUE(cluster.Start(config, 2, std::chrono::seconds(30)));
  std::optional<ChildExit> exit;
  const auto deadline =
      std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (!exit && std::chrono::steady_clock::now() < deadline) {
    exit = cluster.group().WaitAny(absl::Milliseconds(100));
  }
  ASSERT_TRUE(exit.has_value()) << "worker did not finish";
  EXPECT_EQ(exit->label, "worker 0");
  EXPECT_EQ(exit->exit_code, 0);
}

// issue 15: a job started from one well-known address. The workers start
// first, then server 1 (it listens on a free port and waits for the
// coordinator), then server 0 at the rendezvous: start order does not
// matter, server 1 registers, the workers learn both endpoints and train.
TEST(ClusterTest, RendezvousJobStartsInAnyOrder) {
  TempDir dir;
  const std::string rendezvous = testing::FreeEndpoints(1)[0];
  const std::string config = dir.Write(
      "job.yaml",
      absl::StrCat("mode: sync\ncluster: {servers: 2, workers: 2, "
                   "rendezvous: '",
                   rendezvous,
                   "'}\ntrain:\n  epochs: 1\n  data: {train_samples: 2000, "
                   "test_samples: 500}\n"));
  std::mutex mu;
  std::vector<std::string> lines;
  ProcessGroup group([&](const std::string& label, const std::string& line) {
    std::lock_guard<std::mutex> lock(mu);
    lines.push_back(label + ": " + line);
  });
  const auto spawn = [&](const std::string& role, int rank) {
    auto pid = group.Spawn(absl::StrCat(role, " ", rank),
                           {testing::HetpsBinary(), role, "--config", config,
                            "--rank", std::to_string(rank)});
    ASSERT_TRUE(pid.ok()) << pid.status();
  };
  spawn("worker", 0);
  spawn("worker", 1);
  spawn("server", 1);
  spawn("server", 0);
  int finished = 0;
  const auto deadline =
      std::chrono::steady_clock::now() + std::chrono::seconds(120);
  while (finished < 2 && std::chrono::steady_clock::now() < deadline) {
    std::optional<ChildExit> exit = group.WaitAny(absl::Milliseconds(100));
    if (!exit) continue;
    ASSERT_TRUE(absl::StartsWith(exit->label, "worker")) << exit->label;
    EXPECT_EQ(exit->exit_code, 0) << exit->label;
    ++finished;
  }
  EXPECT_EQ(finished, 2) << "the workers did not finish";
  group.StopAll(absl::Seconds(5));
  std::lock_guard<std::mutex> lock(mu);
  const std::string out = absl::StrJoin(lines, "\n");
  EXPECT_THAT(out, HasSubstr("server 1 registered at 127.0.0.1:"));
  EXPECT_THAT(out, HasSubstr("servers from the rendezvous: " + rendezvous +
                             ",127.0.0.1:"));
  EXPECT_THAT(out, HasSubstr("final model: test AUC"));
}

TEST(ClusterTest, UnreachableRendezvousFailsNamingIt) {
  const std::string rendezvous = testing::FreeEndpoints(1)[0];
  for (const char* role : {"worker", "server"}) {
    const auto result = RunCommand(
        {testing::HetpsBinary(), role, "--rank", "1", "--set",
         "cluster.rendezvous=" + rendezvous, "--set", "cluster.workers=2",
         "--set", "client.connect_deadline_s=2"},
        std::chrono::seconds(30));
    EXPECT_EQ(result.exit_code, 1) << result.output;
    EXPECT_THAT(result.output,
                HasSubstr("coordinator at " + rendezvous + " unreachable"));
    EXPECT_LT(result.seconds, 10.0);
  }
}

}  // namespace
}  // namespace hetps
