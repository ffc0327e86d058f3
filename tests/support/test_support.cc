#include "support/test_support.h"

#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "cli/roles.h"
#include "common/ports.h"

namespace hetps::testing {

std::vector<float> RandomValues(size_t n, uint64_t seed, float scale) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal(0, scale);
  std::vector<float> values(n);
  for (float& v : values) v = normal(rng);
  return values;
}

JobConfig OneTableJob(ConsistencyMode mode) {
  JobConfig config;
  config.mode = mode;
  config.train.warmup_rounds = 0;
  config.cluster.ps_endpoints = {"127.0.0.1:1"};
  config.cluster.workers = 1;
  TableConfig emb;
  emb.name = "emb";
  emb.kind = TableKind::kSparse;
  emb.dim = 2;
  emb.optimizer.type = "sgd";
  emb.optimizer.learning_rate = 1.0f;
  emb.init.type = "zero";
  config.tables = {emb};
  return config;
}

std::vector<std::string> FreeEndpoints(int count) {
  auto ports = PickFreePorts("127.0.0.1", count);
  EXPECT_TRUE(ports.ok()) << ports.status();
  std::vector<std::string> endpoints;
  if (!ports.ok()) return endpoints;
  for (int port : *ports) endpoints.push_back(absl::StrCat("127.0.0.1:", port));
  return endpoints;
}

TempDir::TempDir() {
  std::random_device rd;
  path_ = (std::filesystem::temp_directory_path() /
           absl::StrCat("hetps-test-", getpid(), "-", rd()))
              .string();
  std::filesystem::create_directories(path_);
}

TempDir::~TempDir() {
  std::error_code ec;
  std::filesystem::remove_all(path_, ec);
}

std::string TempDir::Write(const std::string& name,
                           const std::string& text) const {
  const std::string full = path_ + "/" + name;
  std::ofstream(full) << text;
  return full;
}

CommandResult RunCommand(const std::vector<std::string>& args,
                         std::chrono::seconds limit) {
  // coreutils timeout bounds the child; output is merged into one pipe.
  std::string cmd = absl::StrCat("timeout -k 5 ", limit.count());
  for (const std::string& a : args) {
    std::string quoted = "'";
    for (char c : a)
      quoted += c == '\'' ? std::string("'\\''") : std::string(1, c);
    absl::StrAppend(&cmd, " ", quoted, "'");
  }
  absl::StrAppend(&cmd, " 2>&1");
  CommandResult result;
  const auto start = std::chrono::steady_clock::now();
  FILE* pipe = popen(cmd.c_str(), "r");
  if (pipe == nullptr) return result;
  std::array<char, 4096> buf;
  size_t n;
  while ((n = fread(buf.data(), 1, buf.size(), pipe)) > 0) {
    result.output.append(buf.data(), n);
  }
  const int status = pclose(pipe);
  result.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  result.seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start)
          .count();
  return result;
}

std::optional<pid_t> FindProcess(const std::vector<std::string>& args,
                                 std::chrono::milliseconds wait) {
  const auto deadline = std::chrono::steady_clock::now() + wait;
  while (true) {
    std::error_code ec;
    for (const auto& entry : std::filesystem::directory_iterator("/proc", ec)) {
      const std::string name = entry.path().filename();
      if (name.find_first_not_of("0123456789") != std::string::npos) continue;
      std::ifstream in(entry.path() / "cmdline", std::ios::binary);
      const std::string cmdline((std::istreambuf_iterator<char>(in)), {});
      const std::vector<std::string> argv = absl::StrSplit(cmdline, '\0');
      if (argv.size() < args.size()) continue;
      for (size_t i = 0; i + args.size() <= argv.size(); ++i) {
        if (std::equal(args.begin(), args.end(), argv.begin() + i)) {
          return static_cast<pid_t>(std::stol(name));
        }
      }
    }
    if (std::chrono::steady_clock::now() >= deadline) return std::nullopt;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

LaunchedJob LaunchJob(const TempDir& dir, const std::string& config,
                      const std::vector<std::string>& sets,
                      std::chrono::seconds limit) {
  const std::string summary = dir.path() + "/summary.json";
  std::filesystem::remove(summary);
  // Verbose: the tests read what the roles log.
  std::vector<std::string> args = {HetpsBinary(),
                                   "launch",
                                   config,
                                   "--no-status",
                                   "-v",
                                   "--run-dir",
                                   dir.path() + "/run",
                                   "--summary-json",
                                   summary};
  for (const std::string& s : sets) {
    args.push_back("--set");
    args.push_back(s);
  }
  LaunchedJob job;
  job.result = RunCommand(args, limit);
  std::ifstream in(summary);
  if (in.good()) job.summary = nlohmann::json::parse(in, nullptr, false);
  return job;
}

std::string HetpsBinary() { return HETPS_BINARY; }

std::string SourcePath(const std::string& relative) {
  return absl::StrCat(HETPS_SOURCE_DIR, "/", relative);
}

bool WaitFor(const std::function<bool()>& condition, absl::Duration limit) {
  const absl::Time give_up = absl::Now() + limit;
  while (!condition()) {
    if (absl::Now() >= give_up) return false;
    absl::SleepFor(absl::Milliseconds(1));
  }
  return true;
}

int ThreadsOfThisProcess() {
  std::ifstream in("/proc/self/status");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("Threads:", 0) == 0) return std::stoi(line.substr(8));
  }
  return -1;
}

ServerProcesses::ServerProcesses()
    : group_([this](const std::string&, const std::string& line) {
        if (line.rfind(kListeningPrefix, 0) == 0) ++listening_;
      }) {}

::testing::AssertionResult ServerProcesses::Start(
    const std::string& config_path, int count, std::chrono::seconds limit,
    const std::vector<std::string>& extra) {
  const int before = listening_;
  for (int s = 0; s < count; ++s) {
    std::vector<std::string> argv = {HetpsBinary(), "server",
                                     "--config",    config_path,
                                     "--rank",      std::to_string(s)};
    argv.insert(argv.end(), extra.begin(), extra.end());
    auto pid = group_.Spawn(absl::StrCat("server ", s), argv);
    if (!pid.ok()) {
      return ::testing::AssertionFailure() << pid.status().ToString();
    }
  }
  const auto deadline = std::chrono::steady_clock::now() + limit;
  while (listening_ - before < count) {
    if (auto exit = group_.WaitAny(absl::Milliseconds(20))) {
      return ::testing::AssertionFailure()
             << exit->label << " exited with " << exit->exit_code
             << " during start-up";
    }
    if (std::chrono::steady_clock::now() > deadline) {
      return ::testing::AssertionFailure()
             << "servers did not listen within " << limit.count() << " s";
    }
  }
  return ::testing::AssertionSuccess();
}

}  // namespace hetps::testing
