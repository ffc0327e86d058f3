// Runs `hetps launch` jobs for the end-to-end benchmarks (bench/hetero,
// bench/compress) and reads their summaries: AUC over time, time to a
// target AUC. Header-only; each benchmark is one program.
#pragma once

#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "nlohmann/json.hpp"

extern char** environ;

namespace hetps::bench {

using Json = nlohmann::json;

// The pid of `hetps worker --config <config> --rank <rank>`, from /proc.
inline std::optional<pid_t> FindWorker(const std::string& config, int rank) {
  for (const auto& entry : std::filesystem::directory_iterator("/proc")) {
    const std::string name = entry.path().filename();
    if (name.find_first_not_of("0123456789") != std::string::npos) continue;
    std::ifstream in(entry.path() / "cmdline", std::ios::binary);
    std::string cmdline((std::istreambuf_iterator<char>(in)), {});
    std::vector<std::string> argv = absl::StrSplit(cmdline, '\0');
    for (size_t i = 0; i + 4 < argv.size(); ++i) {
      if (argv[i] == "worker" && argv[i + 1] == "--config" &&
          argv[i + 2] == config && argv[i + 3] == "--rank" &&
          argv[i + 4] == std::to_string(rank)) {
        return static_cast<pid_t>(std::stol(name));
      }
    }
  }
  return std::nullopt;
}

struct RunResult {
  Json summary;
  int exit_code = -1;
  double killed_at_s = -1;
};

// `hetps launch config --set ...` with its output in `log` and its summary
// read back. With `kill_rank`, that worker gets SIGKILL `kill_at_s` after
// the start.
inline RunResult Launch(const std::string& hetps, const std::string& config,
                        const std::vector<std::string>& sets,
                        const std::string& log,
                        std::optional<int> kill_rank = std::nullopt,
                        double kill_at_s = 0) {
  using Clock = std::chrono::steady_clock;
  const std::string summary_path = log + ".summary.json";
  std::filesystem::remove(summary_path);
  // Verbose into `log` (the benchmarks read the roles' lines), the run
  // directory beside it.
  std::vector<std::string> args = {
      hetps,       "launch",     config,           "--no-status", "-v",
      "--run-dir", log + ".run", "--summary-json", summary_path};
  for (const std::string& s : sets) {
    args.push_back("--set");
    args.push_back(s);
  }
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, STDOUT_FILENO, log.c_str(),
                                   O_WRONLY | O_CREAT | O_TRUNC, 0644);
  posix_spawn_file_actions_adddup2(&actions, STDOUT_FILENO, STDERR_FILENO);
  pid_t pid = 0;
  RunResult result;
  const auto start = Clock::now();
  const int spawned =
      posix_spawn(&pid, argv[0], &actions, nullptr, argv.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  if (spawned != 0) {
    std::cerr << "cannot start " << hetps << "\n";
    return result;
  }
  bool killed = !kill_rank.has_value();
  int status = 0;
  while (true) {
    const pid_t done = waitpid(pid, &status, WNOHANG);
    if (done == pid) break;
    const double t =
        std::chrono::duration<double>(Clock::now() - start).count();
    if (!killed && t >= kill_at_s) {
      if (auto victim = FindWorker(config, *kill_rank)) {
        kill(*victim, SIGKILL);
        result.killed_at_s = t;
        std::cerr << absl::StrFormat("  killed worker %d (pid %d) at %.1f s\n",
                                     *kill_rank, *victim, t);
      }
      killed = true;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  result.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128;
  std::ifstream in(summary_path);
  if (in) result.summary = Json::parse(in, nullptr, false);
  return result;
}

// [seconds, AUC] of a summary's evaluations (periodic and final), in time
// order.
inline Json Curve(const Json& summary) {
  std::vector<std::pair<double, double>> points;
  if (summary.is_object() && summary.contains("evals")) {
    for (const Json& e : summary["evals"]) {
      points.emplace_back(e["at_s"].get<double>(), e["auc"].get<double>());
    }
  }
  std::sort(points.begin(), points.end());
  Json out = Json::array();
  for (const auto& [t, auc] : points) out.push_back({t, auc});
  return out;
}

// The first time a [seconds, AUC] curve reaches `target`.
inline std::optional<double> TimeToTarget(const Json& curve, double target) {
  for (const Json& pt : curve) {
    if (pt[1].get<double>() >= target) return pt[0].get<double>();
  }
  return std::nullopt;
}

}  // namespace hetps::bench
