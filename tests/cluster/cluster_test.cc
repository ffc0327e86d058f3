// Multi-process clusters on 127.0.0.1: real `hetps server` processes and
// worker processes pushing known gradients, checked value by value.
#include <gtest/gtest.h>

#include <map>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "cluster/pattern.h"
#include "hetps/ps_client.h"
#include "support/test_support.h"

namespace hetps {
namespace {

using ::testing::HasSubstr;
using testing::RunCommand;
using testing::ServerProcesses;
using testing::TempDir;

std::string PatternConfig(const std::string& mode,
                          const std::vector<std::string>& endpoints,
                          int workers) {
  return absl::StrCat(R"(name: pattern
mode: )", mode, R"(
cluster:
  workers: )", workers, R"(
  ps_endpoints: [)", absl::StrJoin(endpoints, ", "), R"(]
client:
  connect_deadline_s: 30
server:
  heartbeat_timeout_s: 60
train:
  model: none
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
)");
}

// Runs 3 pattern workers for `rounds` against 2 servers; returns the final
// sparse rows of `keys` and the dense table, read back through a PsClient.
struct Final {
  std::map<uint64_t, std::vector<float>> rows;
  std::vector<float> dense;
};

Final RunPattern(const std::string& mode, int rounds,
                 const std::vector<uint64_t>& keys) {
  TempDir dir;
  const auto endpoints = testing::FreeEndpoints(2);
  const std::string config =
      dir.Write("job.yaml", PatternConfig(mode, endpoints, 3));
  ServerProcesses servers;
  EXPECT_TRUE(servers.Start(config, 2, std::chrono::seconds(30)));
  for (int w = 0; w < 3; ++w) {
    auto pid = servers.group().Spawn(
        absl::StrCat("worker ", w),
        {HETPS_PATTERN_WORKER, config, std::to_string(w),
         std::to_string(rounds)});
    EXPECT_TRUE(pid.ok()) << pid.status();
  }
  int done = 0;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(120);
  while (done < 3 && std::chrono::steady_clock::now() < deadline) {
    auto exit = servers.group().WaitAny(std::chrono::milliseconds(100));
    if (!exit) continue;
    EXPECT_EQ(exit->exit_code, 0) << exit->label;
    EXPECT_THAT(exit->label, HasSubstr("worker"));
    ++done;
  }
  EXPECT_EQ(done, 3) << "workers did not finish in time";

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
    final.rows[keys[i]] = std::vector<float>(
        rows.begin() + i * pattern::kDim, rows.begin() + (i + 1) * pattern::kDim);
  }
  final.dense.resize(pattern::kDenseSize);
  EXPECT_TRUE((*client)->PullDense(pattern::kDense, final.dense).ok());
  return final;
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

TEST(ClusterTest, SyncTwoServersThreeWorkersGiveExactValues) {
  const auto keys = CheckedKeys();
  const Final final = RunPattern("sync", kRounds, keys);
  for (uint64_t key : keys) {
    std::vector<float> expected(pattern::kDim, 0.0f);
    for (int r = 0; r < kRounds; ++r) {
      for (uint64_t c = 0; c < pattern::kDim; ++c) {
        float merged = 0;
        for (uint32_t w = 0; w < 3; ++w) {
          merged += pattern::BatchOf(w) * WorkerGrad(w, r, key, c);
        }
        expected[c] -= pattern::kLearningRate * (merged / 4.0f);
      }
    }
    ASSERT_TRUE(final.rows.contains(key));
    EXPECT_EQ(final.rows.at(key), expected) << "key " << key;
  }
  std::vector<float> dense(pattern::kDenseSize, 0.0f);
  for (int r = 0; r < kRounds; ++r) {
    for (uint64_t i = 0; i < pattern::kDenseSize; ++i) {
      float merged = 0;
      for (uint32_t w = 0; w < 3; ++w) {
        merged += pattern::BatchOf(w) * pattern::GradOf(w, r, i, 0);
      }
      dense[i] -= pattern::kLearningRate * (merged / 4.0f);
    }
  }
  EXPECT_EQ(final.dense, dense);
}

TEST(ClusterTest, AsyncTwoServersThreeWorkersGiveTheSameTotal) {
  const auto keys = CheckedKeys();
  const Final final = RunPattern("async", kRounds, keys);
  for (uint64_t key : keys) {
    std::vector<float> expected(pattern::kDim, 0.0f);
    for (int r = 0; r < kRounds; ++r) {
      for (uint32_t w = 0; w < 3; ++w) {
        for (uint64_t c = 0; c < pattern::kDim; ++c) {
          expected[c] -= pattern::kLearningRate * WorkerGrad(w, r, key, c);
        }
      }
    }
    ASSERT_TRUE(final.rows.contains(key));
    EXPECT_EQ(final.rows.at(key), expected) << "key " << key;
  }
  std::vector<float> dense(pattern::kDenseSize, 0.0f);
  for (int r = 0; r < kRounds; ++r) {
    for (uint32_t w = 0; w < 3; ++w) {
      for (uint64_t i = 0; i < pattern::kDenseSize; ++i) {
        dense[i] -= pattern::kLearningRate * pattern::GradOf(w, r, i, 0);
      }
    }
  }
  EXPECT_EQ(final.dense, dense);
}

TEST(ClusterTest, UnreachableServerFailsWithinTheDeadlineNamingIt) {
  const std::string endpoint = testing::FreeEndpoints(1)[0];
  const auto result = RunCommand(
      {testing::HetpsBinary(), "worker", "--rank", "0", "--set",
       "cluster.ps_endpoints=" + endpoint, "--set", "cluster.workers=1",
       "--set", "client.connect_deadline_s=2"},
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
      "worker 0", {testing::HetpsBinary(), "worker", "--config", config,
                   "--rank", "0"});
  ASSERT_TRUE(worker.ok()) << worker.status();
  std::this_thread::sleep_for(std::chrono::seconds(2));
  EXPECT_EQ(cluster.group().RunningLabels().size(), 1u)
      << "the worker must still be waiting for its servers";
  ASSERT_TRUE(cluster.Start(config, 2, std::chrono::seconds(30)));
  std::optional<ChildExit> exit;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (!exit && std::chrono::steady_clock::now() < deadline) {
    exit = cluster.group().WaitAny(std::chrono::milliseconds(100));
  }
  ASSERT_TRUE(exit.has_value()) << "worker did not finish";
  EXPECT_EQ(exit->label, "worker 0");
  EXPECT_EQ(exit->exit_code, 0);
}

}  // namespace
}  // namespace hetps
