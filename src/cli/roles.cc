#include "cli/roles.h"

#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <map>
#include <mutex>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "cli/process_group.h"
#include "common/logging.h"
#include "common/ports.h"
#include "coord/coordinator.h"
#include "nlohmann/json.hpp"
#include "server/server_node.h"
#include "worker/trainer.h"

namespace hetps {
namespace {

using Clock = std::chrono::steady_clock;

}  // namespace

int RunServerRole(const JobConfig& config, int rank) {
  // Block the stop signals before gRPC starts its threads, so only sigwait
  // below sees them.
  sigset_t stop_signals;
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGINT);
  sigaddset(&stop_signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);

  const std::string& endpoint = config.cluster.ps_endpoints.at(rank);
  auto node = ServerNode::Start(config, rank, endpoint);
  if (!node.ok()) {
    spdlog::error("{}", node.status().message());
    return kExitFailure;
  }
  std::cout << kListeningPrefix << endpoint << std::endl;
  int signal_number = 0;
  sigwait(&stop_signals, &signal_number);
  spdlog::info("signal {} received, shutting down", signal_number);
  (*node)->Shutdown(absl::Seconds(5));
  for (const TableConfig& table : config.tables) {
    if (SparseTable* t = (*node)->ps().sparse_table(table.name)) {
      spdlog::info("table '{}': {} rows held here", table.name, t->size());
    }
  }
  return kExitOk;
}

int RunWorkerRole(const JobConfig& config, int rank) {
  auto report = RunWorker(config, rank);
  if (!report.ok()) {
    spdlog::error("worker {} failed: {}", rank, report.status().ToString());
    return kExitFailure;
  }
  std::cout << kReportPrefix << ReportToJson(*report) << std::endl;
  return kExitOk;
}

int RunLaunch(JobConfig config, const LaunchOptions& options) {
  const auto start = Clock::now();
  if (config.cluster.ps_endpoints.empty()) {
    auto ports = PickFreePorts(config.cluster.host, config.cluster.servers);
    if (!ports.ok()) {
      spdlog::error("{}", ports.status().message());
      return kExitFailure;
    }
    for (int port : *ports) {
      config.cluster.ps_endpoints.push_back(
          absl::StrCat(config.cluster.host, ":", port));
    }
  }
  const int servers = config.num_servers();
  const int workers = config.num_workers();
  spdlog::info("job '{}': {} servers, {} workers, mode {}, servers at {}",
               config.name, servers, workers, ConsistencyModeName(config.mode),
               absl::StrJoin(config.cluster.ps_endpoints, ","));

  std::atomic<int> listening{0};
  std::mutex reports_mu;
  std::map<int, nlohmann::json> reports;  // guarded by reports_mu
  ProcessGroup group([&](const std::string& label, const std::string& line) {
    if (absl::StartsWith(label, "server") &&
        absl::StartsWith(line, kListeningPrefix)) {
      ++listening;
    } else if (absl::StartsWith(line, kReportPrefix)) {
      auto j = nlohmann::json::parse(line.substr(strlen(kReportPrefix)),
                                     nullptr, /*allow_exceptions=*/false);
      if (j.is_object() && j.contains("rank")) {
        std::lock_guard<std::mutex> lock(reports_mu);
        reports[j["rank"].get<int>()] = j;
      }
    }
  });

  auto child_args = [&](const char* role, int rank) {
    std::vector<std::string> argv = {options.self_path, role,
                                     "--config",        options.config_path,
                                     "--rank",          std::to_string(rank)};
    for (const std::string& o : options.overrides) {
      argv.push_back("--set");
      argv.push_back(o);
    }
    argv.push_back("--set");
    argv.push_back("cluster.ps_endpoints=" +
                   absl::StrJoin(config.cluster.ps_endpoints, ","));
    return argv;
  };
  auto fail = [&](const std::string& why) {
    spdlog::error("{}; stopping the job", why);
    group.StopAll(std::chrono::seconds(5));
    return ProcessGroup::interrupted() ? kExitInterrupted : kExitFailure;
  };

  for (int s = 0; s < servers; ++s) {
    auto pid = group.Spawn(absl::StrCat("server ", s), child_args("server", s));
    if (!pid.ok()) return fail(std::string(pid.status().message()));
  }
  // Servers first: workers start once every server listens.
  const auto ready_deadline =
      start + std::chrono::duration<double>(config.client.connect_deadline_s);
  while (listening < servers) {
    if (auto exit = group.WaitAny(std::chrono::milliseconds(50))) {
      return fail(absl::StrCat(exit->label, " exited with code ",
                               exit->exit_code, " during start-up"));
    }
    if (ProcessGroup::interrupted()) return fail("interrupted");
    if (Clock::now() > ready_deadline) {
      return fail("servers did not start listening in time");
    }
  }
  for (int w = 0; w < workers; ++w) {
    auto pid = group.Spawn(absl::StrCat("worker ", w), child_args("worker", w));
    if (!pid.ok()) return fail(std::string(pid.status().message()));
  }

  int finished = 0;
  while (finished < workers) {
    auto exit = group.WaitAny(std::chrono::milliseconds(200));
    if (ProcessGroup::interrupted()) return fail("interrupted (Ctrl-C)");
    if (!exit) continue;
    if (exit->exit_code != 0) {
      return fail(absl::StrCat(exit->label, " failed with exit code ",
                               exit->exit_code));
    }
    if (absl::StartsWith(exit->label, "server")) {
      return fail(absl::StrCat(exit->label, " exited while workers run"));
    }
    ++finished;
  }
  for (const ChildExit& exit : group.StopAll(std::chrono::seconds(10))) {
    if (exit.exit_code != 0) {
      spdlog::error("{} exited with code {} at shutdown", exit.label,
                    exit.exit_code);
      return kExitFailure;
    }
  }
  const double wall_s =
      std::chrono::duration<double>(Clock::now() - start).count();

  // Summary: the job's throughput and rank 0's evaluation of the final model.
  nlohmann::json summary = {{"job", config.name},
                            {"mode", ConsistencyModeName(config.mode)},
                            {"servers", servers},
                            {"workers", workers},
                            {"wall_s", wall_s}};
  uint64_t samples = 0;
  double train_s = 0;
  {
    std::lock_guard<std::mutex> lock(reports_mu);
    if (static_cast<int>(reports.size()) != workers) {
      spdlog::error("only {} of {} workers reported results", reports.size(),
                    workers);
      return kExitFailure;
    }
    uint64_t malformed = 0;
    for (auto& [rank, r] : reports) {
      samples += r["samples"].get<uint64_t>();
      malformed += r.value("malformed_records", uint64_t{0});
      train_s = std::max(train_s, r["train_s"].get<double>());
    }
    summary["malformed_records"] = malformed;
    summary["model"] = config.train.model;
    summary["data"] = config.train.data.format;
    summary["samples"] = samples;
    summary["samples_per_s"] = train_s > 0 ? samples / train_s : 0.0;
    if (reports[0].contains("test_auc")) {
      summary["test_auc"] = reports[0]["test_auc"];
      summary["test_logloss"] = reports[0]["test_logloss"];
      summary["evals"] = reports[0]["evals"];
    }
  }
  std::printf(
      "\n== hetps job '%s' done: mode %s, %d servers, %d workers\n"
      "   test AUC %.4f  logloss %.4f\n"
      "   %llu samples trained, %.0f samples/s, wall %.1f s\n",
      config.name.c_str(), ConsistencyModeName(config.mode), servers, workers,
      summary.value("test_auc", 0.0), summary.value("test_logloss", 0.0),
      static_cast<unsigned long long>(samples),
      summary["samples_per_s"].get<double>(), wall_s);
  std::fflush(stdout);
  if (!options.summary_json.empty()) {
    std::ofstream out(options.summary_json);
    out << summary.dump(2) << "\n";
    if (!out) {
      spdlog::error("cannot write --summary-json {}", options.summary_json);
      return kExitFailure;
    }
  }
  return kExitOk;
}

int RunGenData(const CriteoGenConfig& config, const std::string& path) {
  const auto start = Clock::now();
  auto report = GenerateCriteo(config, path);
  if (!report.ok()) {
    std::fprintf(stderr, "hetps gen-data: %s\n",
                 std::string(report.status().message()).c_str());
    return kExitFailure;
  }
  const double seconds =
      std::chrono::duration<double>(Clock::now() - start).count();
  std::printf(
      "wrote %llu samples (%.1f%% positive) to %s in %.1f s\n"
      "teacher AUC %.4f: the best AUC any model can reach on this data\n",
      static_cast<unsigned long long>(report->samples),
      100.0 * report->positives / std::max<uint64_t>(report->samples, 1),
      path.c_str(), seconds, report->teacher_auc);
  std::printf("%s\n", nlohmann::json({{"samples", report->samples},
                                      {"positives", report->positives},
                                      {"teacher_auc", report->teacher_auc},
                                      {"path", path}})
                          .dump()
                          .c_str());
  return kExitOk;
}

int RunStatus(const std::string& coordinator_endpoint, bool json) {
  auto status = QueryStatus(coordinator_endpoint, 10.0);
  if (!status.ok()) {
    std::fprintf(stderr, "hetps status: %s\n",
                 std::string(status.status().message()).c_str());
    return kExitFailure;
  }
  nlohmann::json j = {{"epoch", status->epoch()},
                      {"mode", status->mode()},
                      {"window", status->window()}};
  for (const rpc::WorkerStatus& w : status->workers()) {
    j["workers"].push_back({{"rank", w.rank()},
                            {"live", w.live()},
                            {"step", w.step()},
                            {"samples", w.samples()},
                            {"samples_per_s", w.samples_per_s()},
                            {"last_heartbeat_age_s", w.last_heartbeat_age_s()},
                            {"left_reason", w.left_reason()}});
  }
  for (const rpc::ServerStatus& s : status->servers()) {
    nlohmann::json tables = nlohmann::json::object();
    for (const rpc::TableInfo& t : s.tables()) {
      tables[t.schema().name()] = t.rows();
    }
    j["servers"].push_back({{"rank", s.rank()},
                            {"endpoint", s.endpoint()},
                            {"reachable", s.reachable()},
                            {"applied_rounds", s.applied_rounds()},
                            {"table_rows", tables}});
  }
  if (json) {
    std::printf("%s\n", j.dump(2).c_str());
    return kExitOk;
  }
  std::printf("epoch %llu  mode %s  window %d\n",
              static_cast<unsigned long long>(status->epoch()),
              status->mode().c_str(), status->window());
  for (const rpc::WorkerStatus& w : status->workers()) {
    std::printf(
        "worker %u  %-5s step %llu  %.0f samples/s  heartbeat %.1fs ago %s\n",
        w.rank(), w.live() ? "live" : "gone",
        static_cast<unsigned long long>(w.step()), w.samples_per_s(),
        w.last_heartbeat_age_s(), w.left_reason().c_str());
  }
  for (const auto& s : j["servers"]) {
    std::printf(
        "server %d  %s  %s  rounds %llu  rows %s\n", s["rank"].get<int>(),
        s["endpoint"].get<std::string>().c_str(),
        s["reachable"].get<bool>() ? "up" : "DOWN",
        static_cast<unsigned long long>(s["applied_rounds"].get<uint64_t>()),
        s["table_rows"].dump().c_str());
  }
  return kExitOk;
}

}  // namespace hetps
