// The hetps command line as a user meets it: configuration errors name the
// field and exit with 2; the quickstart job trains and reports.
#include <gtest/gtest.h>
#include <signal.h>

#include <atomic>
#include <cctype>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "absl/strings/str_split.h"
#include "nlohmann/json.hpp"
#include "support/test_support.h"

namespace hetps {
namespace {

using ::testing::HasSubstr;
using testing::RunCommand;
using testing::TempDir;

struct BadConfig {
  std::string yaml;
  std::string expected;  // in the message
};

class ConfigErrorTest : public ::testing::TestWithParam<BadConfig> {};

TEST_P(ConfigErrorTest, LaunchExitsTwoNamingTheField) {
  TempDir dir;
  const std::string path = dir.Write("bad.yaml", GetParam().yaml);
  const auto result = RunCommand({testing::HetpsBinary(), "launch", path},
                                 std::chrono::seconds(20));
  EXPECT_EQ(result.exit_code, 2) << result.output;
  EXPECT_THAT(result.output, HasSubstr("configuration error"));
  EXPECT_THAT(result.output, HasSubstr(GetParam().expected));
}

INSTANTIATE_TEST_SUITE_P(
    Fields, ConfigErrorTest,
    ::testing::Values(BadConfig{"cluster:\n  wokers: 3\n", "cluster.wokers"},
                      BadConfig{
                          "cluster:\n  ps_endpoints: [\"127.0.0.1:70000\"]\n",
                          "cluster.ps_endpoints[0]"},
                      BadConfig{"cluster:\n  ps_endpoints: [\"nohost\"]\n",
                                "cluster.ps_endpoints[0]"},
                      BadConfig{"window: -3\n", "window"},
                      BadConfig{"train:\n  epochs: many\n", "train.epochs"},
                      BadConfig{"mode: eventually\n", "mode"}),
    [](const ::testing::TestParamInfo<BadConfig>& info) {
      std::string name;
      for (char c : info.param.expected) {
        name += std::isalnum(static_cast<unsigned char>(c)) ? c : '_';
      }
      return name + "_" + std::to_string(info.index);
    });

TEST(CliTest, OverrideOfUnknownFieldExitsTwo) {
  const auto result =
      RunCommand({testing::HetpsBinary(), "launch",
                  testing::SourcePath("examples/quickstart.yaml"), "--set",
                  "train.epoch=3"},
                 std::chrono::seconds(20));
  EXPECT_EQ(result.exit_code, 2) << result.output;
  EXPECT_THAT(result.output, HasSubstr("train.epoch"));
}

TEST(CliTest, MissingConfigFileExitsTwoNamingIt) {
  const auto result =
      RunCommand({testing::HetpsBinary(), "launch", "/nonexistent/job.yaml"},
                 std::chrono::seconds(20));
  EXPECT_EQ(result.exit_code, 2) << result.output;
  EXPECT_THAT(result.output, HasSubstr("/nonexistent/job.yaml"));
}

TEST(CliTest, QuickstartTrainsAndWritesTheSummary) {
  TempDir dir;
  const std::string summary = dir.path() + "/summary.json";
  const auto result =
      RunCommand({testing::HetpsBinary(), "launch",
                  testing::SourcePath("examples/quickstart.yaml"),
                  "--summary-json", summary, "--run-dir", dir.path() + "/run"},
                 std::chrono::seconds(240));
  ASSERT_EQ(result.exit_code, 0) << result.output;
  EXPECT_THAT(result.output, HasSubstr("test AUC"));
  std::ifstream in(summary);
  ASSERT_TRUE(in.good());
  const nlohmann::json j = nlohmann::json::parse(in);
  EXPECT_EQ(j["mode"], "sync");
  EXPECT_EQ(j["workers"], 3);
  EXPECT_EQ(j["servers"], 2);
  // 2 epochs over 40000 samples, all of them trained once per epoch.
  EXPECT_EQ(j["samples"], 80000);
  // The teacher is a logistic regression over the same features, so the
  // student learns it well; a broken update rule stays near 0.5.
  EXPECT_GT(j["test_auc"].get<double>(), 0.75);
  EXPECT_LT(j["test_logloss"].get<double>(), 0.62);
}

TEST(CliTest, LaunchFailsWhenARoleFails) {
  // Model 'none' has no built-in trainer, so every worker exits with 1.
  TempDir dir;
  const std::string path =
      dir.Write("job.yaml",
                "cluster: {servers: 1, workers: 2}\ntrain: {model: none}\n"
                "tables:\n  - {name: t, kind: sparse, dim: 2}\n");
  const auto result = RunCommand({testing::HetpsBinary(), "launch", path,
                                  "--run-dir", dir.path() + "/run"},
                                 std::chrono::seconds(60));
  EXPECT_EQ(result.exit_code, 1) << result.output;
  EXPECT_THAT(result.output, HasSubstr("failed with exit code 1"));
  // Quiet, but the failing role's last lines are shown, and its log kept.
  EXPECT_THAT(result.output, HasSubstr("has no built-in trainer"));
  EXPECT_THAT(result.output,
              HasSubstr(", last lines (all in " + dir.path() + "/run/worker-"));
}

// issue 16: the main job is the mixed cluster in semi_async, the terminal
// stays quiet (a header, the summary: no role's lines), and the run
// directory holds every role's log, the launcher's and summary.json.
TEST(CliTest, MainJobIsQuietAndKeepsItsRunDirectory) {
  TempDir dir;
  const std::string run = dir.path() + "/run";
  const auto result = RunCommand(
      {testing::HetpsBinary(), "launch",
       testing::SourcePath("examples/main-job.yaml"), "--run-dir", run},
      std::chrono::seconds(240));
  ASSERT_EQ(result.exit_code, 0) << result.output;
  const std::vector<std::string> lines =
      absl::StrSplit(result.output, '\n', absl::SkipEmpty());
  EXPECT_LE(lines.size(), 15u) << result.output;
  EXPECT_THAT(result.output, HasSubstr("test AUC"));
  EXPECT_THAT(result.output, HasSubstr("per worker: batch "));
  EXPECT_THAT(result.output,
              HasSubstr("logs, summary.json and report.html in " + run));
  EXPECT_THAT(result.output, ::testing::Not(HasSubstr("[worker 0]")));
  for (const char* file :
       {"launch.log", "server-0.log", "server-1.log", "worker-0.log",
        "worker-1.log", "worker-2.log", "worker-3.log", "summary.json",
        "report.html"}) {
    EXPECT_TRUE(std::filesystem::exists(run + "/" + file)) << file;
  }
  std::ifstream in(run + "/summary.json");
  const nlohmann::json j = nlohmann::json::parse(in, nullptr, false);
  EXPECT_EQ(j["mode"], "semi_async");
  EXPECT_TRUE(j["emulated"].get<bool>());
  EXPECT_GE(j["test_auc"].get<double>(), 0.79);
  std::ifstream worker3(run + "/worker-3.log");
  const std::string log((std::istreambuf_iterator<char>(worker3)), {});
  EXPECT_THAT(log, HasSubstr("emulated device"));
}

TEST(CliTest, CtrlCStopsEveryRoleAndExits130) {
  TempDir dir;
  // Enough data that the job is still running when the interrupt comes.
  const std::string path =
      dir.Write("job.yaml",
                "cluster: {servers: 2, workers: 2}\n"
                "train: {epochs: 50, data: {train_samples: 400000}}\n");
  std::atomic<bool> training{false};
  ProcessGroup group([&](const std::string& label, const std::string& line) {
    if (label == "launch" && line.find("step") != std::string::npos) {
      training = true;
    }
  });
  auto pid = group.Spawn("launch", {testing::HetpsBinary(), "launch", path,
                                    "-v", "--run-dir", dir.path() + "/run"});
  ASSERT_TRUE(pid.ok()) << pid.status();
  const auto deadline =
      std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (!training && std::chrono::steady_clock::now() < deadline) {
    ASSERT_FALSE(group.WaitAny(absl::Milliseconds(100)).has_value())
        << "the launch ended before it was interrupted";
  }
  ASSERT_TRUE(training) << "no progress line within 60 s";
  kill(*pid, SIGINT);
  std::optional<ChildExit> exit;
  while (!exit && std::chrono::steady_clock::now() < deadline) {
    exit = group.WaitAny(absl::Milliseconds(100));
  }
  ASSERT_TRUE(exit.has_value()) << "launch did not stop after SIGINT";
  EXPECT_EQ(exit->exit_code, 130);
  // Every role is gone. (The pattern's brackets keep it from matching the
  // command line of the pgrep call itself.)
  const auto ps =
      RunCommand({"pgrep", "-f", "hetps [sw][eo]r[vk]er --config " + path},
                 std::chrono::seconds(5));
  EXPECT_EQ(ps.exit_code, 1) << "still running: " << ps.output;
}

}  // namespace
}  // namespace hetps
