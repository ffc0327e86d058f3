// Authentication end to end with real processes: a job whose auth section
// sets a token and mutual TLS trains to the end, and `hetps status` is
// refused without the job's token, with a message that says why.
#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"
#include "support/test_support.h"

namespace hetps {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;
using testing::RunCommand;
using testing::ServerProcesses;
using testing::SourcePath;
using testing::TempDir;

constexpr char kToken[] = "cluster-test-token-42";

std::string TlsSection() {
  return absl::StrCat(
      "  tls_ca: ", SourcePath("tests/data/tls/ca.pem"),
      "\n  tls_cert: ", SourcePath("tests/data/tls/server.pem"),
      "\n  tls_key: ", SourcePath("tests/data/tls/server.key"),
      "\n  require_client_cert: true\n  tls_client_cert: ",
      SourcePath("tests/data/tls/client.pem"),
      "\n  tls_client_key: ", SourcePath("tests/data/tls/client.key"), "\n");
}

TEST(AuthClusterTest, JobWithTokenAndMutualTlsTrains) {
  TempDir dir;
  dir.Write("token", std::string(kToken) + "\n");
  // token_file is relative to the config file.
  const std::string config = dir.Write("job.yaml", absl::StrCat(R"(name: secure
cluster: {servers: 2, workers: 2}
train:
  model: lr
  epochs: 1
  data: {train_samples: 4000, test_samples: 500}
auth:
  token_file: token
)",
                                                                TlsSection()));
  testing::LaunchedJob job =
      testing::LaunchJob(dir, config, {}, std::chrono::seconds(60));
  ASSERT_EQ(job.result.exit_code, 0) << job.result.output;
  EXPECT_EQ(job.summary["samples"], 4000);
  EXPECT_THAT(job.result.output, Not(HasSubstr(kToken)));
}

TEST(AuthClusterTest, StatusWithoutTheTokenIsRefused) {
  TempDir dir;
  const std::string endpoint = testing::FreeEndpoints(1)[0];
  dir.Write("token", kToken);
  dir.Write("other", "not-the-token");
  const std::string config = dir.Write(
      "job.yaml", absl::StrCat("name: secure\ncluster:\n  workers: 1\n"
                               "  ps_endpoints: [",
                               endpoint, "]\nauth:\n  token_file: token\n"));
  ServerProcesses servers;
  ASSERT_TRUE(servers.Start(config, 1, std::chrono::seconds(30)));
  const std::string hetps = testing::HetpsBinary();

  auto refused = RunCommand({hetps, "status", "--coordinator", endpoint},
                            std::chrono::seconds(20));
  EXPECT_EQ(refused.exit_code, 1) << refused.output;
  EXPECT_THAT(
      refused.output,
      HasSubstr(absl::StrCat("coordinator at ", endpoint, ": missing token")));

  auto wrong =
      RunCommand({hetps, "status", "--coordinator", endpoint, "--config",
                  config, "--set", "auth.token_file=" + dir.path() + "/other"},
                 std::chrono::seconds(20));
  EXPECT_EQ(wrong.exit_code, 1) << wrong.output;
  EXPECT_THAT(wrong.output, HasSubstr("wrong token"));
  EXPECT_THAT(wrong.output, Not(HasSubstr("not-the-token")));

  auto unreadable =
      RunCommand({hetps, "status", "--coordinator", endpoint, "--config",
                  config, "--set", "auth.token_file=" + dir.path() + "/absent"},
                 std::chrono::seconds(20));
  EXPECT_EQ(unreadable.exit_code, 2) << unreadable.output;
  EXPECT_THAT(unreadable.output, HasSubstr("auth.token_file: cannot read"));

  auto good = RunCommand(
      {hetps, "status", "--coordinator", endpoint, "--config", config},
      std::chrono::seconds(20));
  EXPECT_EQ(good.exit_code, 0) << good.output;
  EXPECT_THAT(good.output, HasSubstr("worker 0"));
  EXPECT_THAT(good.output, Not(HasSubstr(kToken)));
}

}  // namespace
}  // namespace hetps
