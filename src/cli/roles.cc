#include "cli/roles.h"

#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <deque>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <optional>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/str_split.h"
#include "absl/time/time.h"
#include "cli/process_group.h"
#include "cli/report.h"
#include "common/channel.h"
#include "common/clock.h"
#include "common/file.h"
#include "common/logging.h"
#include "common/ports.h"
#include "common/proto_json.h"
#include "config/credentials.h"
#include "coord/coordinator.h"
#include "coord/coordinator_client.h"
#include "hetps/version.h"
#include "nlohmann/json.hpp"
#include "node/server_node.h"
#include "server/checkpoint.h"
#include "worker/calibration.h"
#include "worker/trainer.h"

namespace hetps {
namespace {

constexpr absl::Duration kJobEndPoll = absl::Milliseconds(500);

// The servers' record of the hot-row caches' lag (AggregatorStats.read_lag_*)
// summed over servers: pushes computed from cached rows, the histogram of
// their lags, the largest, the bound and the pushes over it.
nlohmann::json ReadLagSummary(const rpc::StatusResponse& status) {
  uint64_t pushes = 0, max_lag = 0, bound = 0, violations = 0;
  std::vector<uint64_t> counts;
  for (const rpc::ServerStatus& server : status.servers()) {
    const rpc::AggregatorStats& s = server.stats();
    pushes += s.cached_pushes();
    max_lag = std::max(max_lag, s.max_read_lag());
    bound = std::max(bound, s.read_lag_bound());
    violations += s.read_lag_violations();
    counts.resize(std::max<size_t>(counts.size(), s.read_lag_counts_size()));
    for (int i = 0; i < s.read_lag_counts_size(); ++i) {
      counts[i] += s.read_lag_counts(i);
    }
  }
  return {{"cached_pushes", pushes},
          {"max", max_lag},
          {"bound", bound},
          {"violations", violations},
          {"counts", counts}};
}

// One of StatusToJson's hot_keys: "user:42 (server 1, 31% of requests)".
std::string FormatHotKey(const nlohmann::json& key) {
  return absl::StrFormat("%s:%d (server %d, %.0f%% of requests)",
                         key.value("table", ""), key.value("key", uint64_t{0}),
                         key.value("server", 0), 100 * key.value("share", 0.0));
}

// The Rebalancer's latest plan: "load max/mean 1.33 at 12 s; moving 37
// buckets (0.3 MB: 1->0) to make it 1.05; 37 moved so far (last: ...)"
// (or "would make it ... (advice: ...)" without sharding.migrate), or its
// reason
// when it plans no moves.
std::string FormatPlacement(const rpc::PlacementPlan& plan) {
  if (plan.moves() == 0) {
    return absl::StrFormat("load max/mean %.2f at %.0f s: %s",
                           plan.max_over_mean(), plan.at_s(), plan.reason());
  }
  std::string flows;
  for (const rpc::BucketFlow& f : plan.flows()) {
    absl::StrAppend(&flows, flows.empty() ? "" : ", ", f.buckets(), " ",
                    f.from(), "->", f.to());
  }
  return absl::StrFormat(
      "load max/mean %.2f at %.0f s; moving %d buckets (%.1f MB: %s) %s "
      "make it %.2f%s",
      plan.max_over_mean(), plan.at_s(), plan.moves(), plan.bytes() / 1e6,
      flows, plan.migrate() ? "to" : "would", plan.planned_max_over_mean(),
      plan.migrate()
          ? absl::StrCat("; ", plan.moved_buckets(), " moved so far",
                         plan.last_move().empty() ? "" : " (last: ",
                         plan.last_move(), plan.last_move().empty() ? "" : ")")
          : " (advice: sharding.migrate is off)");
}

// Whether the status shows a job with nothing left for the servers: every
// worker done, or gone without finishing its data (dead).
bool JobOver(const rpc::StatusResponse& status) {
  if (status.workers().empty()) return false;
  for (const rpc::WorkerStatus& w : status.workers()) {
    const bool gone = !w.live() && w.left_reason() != kFinishedItsData;
    if (!w.done() && !gone) return false;
  }
  return true;
}

// `hetps run`: waits until the job is over (or `stop`), then SIGTERMs this
// process (its main thread waits in sigwait). Returns the exit code.
int WatchForJobEnd(const JobConfig& config, int rank,
                   const std::atomic<bool>& stop) {
  Clock& clock = Clock::Real();
  absl::Time reachable = clock.Now();
  int code = kExitOk;
  bool over = false;
  while (!stop) {
    auto status =
        QueryStatus(config.coordinator_address(), 2.0, config.credentials);
    if (status.ok()) {
      reachable = clock.Now();
      if (!over && JobOver(*status)) {
        over = true;
        spdlog::info("every worker is done: stopping");
      }
      // Server 0 hosts the coordinator the others watch: it goes last.
      bool others_up = false;
      for (const rpc::ServerStatus& s : status->servers()) {
        others_up |= s.rank() != 0 && s.reachable();
      }
      if (over && (rank != 0 || !others_up)) break;
    } else if (over) {
      break;
    } else if (clock.Now() - reachable >
               absl::Seconds(config.client.connect_deadline_s)) {
      spdlog::error("coordinator at {} unreachable for {} s: stopping",
                    config.coordinator_address(),
                    config.client.connect_deadline_s);
      code = kExitFailure;
      break;
    }
    if (over && clock.Now() - reachable > absl::Seconds(10)) break;
    clock.SleepFor(kJobEndPoll);
  }
  if (!stop) kill(getpid(), SIGTERM);
  return code;
}

}  // namespace

int RunServerRole(const JobConfig& config, const JobShape& shape, int rank,
                  bool until_done) {
  // Block the stop signals before gRPC starts its threads, so only sigwait
  // below sees them.
  sigset_t stop_signals;
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGINT);
  sigaddset(&stop_signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);

  // With endpoint lists a server listens at its own; at a rendezvous server
  // 0 listens at the rendezvous and the others at a free port of the
  // address that reaches it, which they then register there.
  const bool rendezvous = config.cluster.ps_endpoints.empty();
  std::string listen, local_ip;
  if (!rendezvous) {
    listen = config.cluster.ps_endpoints.at(rank);
  } else if (rank == 0) {
    const std::string& r = config.cluster.rendezvous;
    listen = "0.0.0.0" + r.substr(r.rfind(':'));
  } else {
    auto ip = LocalAddressToward(config.cluster.rendezvous);
    if (!ip.ok()) {
      spdlog::error("server {}: cluster.rendezvous: {}", rank,
                    ip.status().message());
      return kExitFailure;
    }
    local_ip = *ip;
    listen = local_ip + ":0";
  }
  auto node = ServerNode::Start(config, rank, listen, shape);
  if (!node.ok()) {
    spdlog::error("{}", node.status().message());
    return kExitFailure;
  }
  std::string endpoint = listen;
  if (rendezvous) {
    endpoint = rank == 0 ? config.cluster.rendezvous
                         : absl::StrCat(local_ip, ":", (*node)->port());
  }
  if (rendezvous && rank > 0) {
    if (absl::Status s = RegisterServerAtRendezvous(config, rank, endpoint);
        !s.ok()) {
      spdlog::error("server {}: cannot register at the rendezvous: {}", rank,
                    s.message());
      return kExitFailure;
    }
  }
  std::cout << kListeningPrefix << endpoint << std::endl;
  std::atomic<bool> stop_watching{false};
  std::atomic<int> watched_code{kExitOk};
  std::thread watcher;
  if (until_done) {
    watcher = std::thread(
        [&] { watched_code = WatchForJobEnd(config, rank, stop_watching); });
  }
  int signal_number = 0;
  sigwait(&stop_signals, &signal_number);
  stop_watching = true;
  if (watcher.joinable()) watcher.join();
  spdlog::info("signal {} received, shutting down", signal_number);
  (*node)->Shutdown(absl::Seconds(5));
  for (const TableConfig& table : config.tables) {
    if (SparseTable* t = (*node)->ps().sparse_table(table.name)) {
      spdlog::info("table '{}': {} rows held here", table.name, t->size());
    }
  }
  // The server's own record of the consistency it kept.
  const AggregatorStats st = (*node)->ps().aggregator_stats();
  if (config.mode != ConsistencyMode::kSemiAsync) {
    spdlog::info("aggregator: {} pushes, {} applies", st.pushes(),
                 st.applies());
  } else {
    spdlog::info(
        "aggregator: {} pushes, {} applies ({} by window, {} by all workers, "
        "{} by time), max staleness {}, pulls read ahead of the queue {}, "
        "pulls held by the bound {}, max pull lead {} clocks (window {}), "
        "bound violations {}",
        st.pushes(), st.applies(), st.applies_by_window(), st.applies_by_all(),
        st.applies_by_time(), st.max_staleness(), st.pulls_ahead(),
        st.ssp_waits(), st.max_pull_lead(), st.window(), st.bound_violations());
  }
  return watched_code;
}

absl::StatusOr<JobShape> ValidateAndResolve(JobConfig& config) {
  if (auto s = ValidateJobConfig(config); !s.ok()) return s;
  auto shape = ResolveJob(config);
  if (!shape.ok()) return shape.status();
  if (auto s = ResolveCredentials(config, std::getenv); !s.ok()) return s;
  return shape;
}

int RunWorkerRole(const JobConfig& config, const JobShape& shape, int rank,
                  bool tell_done, double calibrate_s) {
  JobConfig resolved = config;
  if (resolved.cluster.ps_endpoints.empty()) {
    auto servers = ServersAtRendezvous(config);
    if (!servers.ok()) {
      spdlog::error("worker {}: cluster.rendezvous: {}", rank,
                    servers.status().message());
      return kExitFailure;
    }
    resolved.cluster.ps_endpoints = *std::move(servers);
    spdlog::info("servers from the rendezvous: {}",
                 absl::StrJoin(resolved.cluster.ps_endpoints, ","));
  }
  auto report = calibrate_s > 0 ? RunCalibration(resolved, shape, rank,
                                                 {.seconds = calibrate_s})
                                : RunWorker(resolved, shape, rank);
  if (!report.ok()) {
    spdlog::error("worker {} failed: {}", rank, report.status().ToString());
    return kExitFailure;
  }
  std::cout << kReportPrefix << ReportToJson(*report) << std::endl;
  if (tell_done) {
    CoordinatorClient coordinator(resolved, rank);
    if (absl::Status s = coordinator.Barrier(kDoneBarrier); !s.ok()) {
      spdlog::warn("the coordinator did not hear that this worker is done: {}",
                   s.message());
    }
  }
  return kExitOk;
}

constexpr absl::Duration kStatusEvery = absl::Seconds(3);
constexpr absl::Duration kProgressEvery = absl::Seconds(1);

// The compact status line `launch` prints while the job runs.
void PrintLiveStatus(const JobConfig& config) {
  absl::StatusOr<rpc::StatusResponse> st =
      QueryStatus(config.cluster.ps_endpoints[0], 1.0, config.credentials);
  if (!st.ok()) return;
  std::printf("%s\n", FormatStatusLine(*st).c_str());
  std::fflush(stdout);
}

// The one progress line a quiet `launch` keeps rewriting on a terminal:
// the data handed out, the time left at the pace so far, throughput, the
// window.
void PrintProgressLine(const rpc::StatusResponse& status, double elapsed_s) {
  const rpc::StatusResponse* st = &status;
  if (st->chunks_total() == 0) return;
  const double done = std::min(
      1.0, static_cast<double>(st->chunks_given()) / st->chunks_total());
  constexpr int kWidth = 30;
  const int filled = static_cast<int>(done * kWidth);
  double samples_per_s = 0;
  for (const rpc::WorkerStatus& w : st->workers()) {
    if (w.live()) samples_per_s += w.progress().samples_per_s();
  }
  const std::string eta =
      done > 0.02 ? absl::StrFormat("%.0f s", elapsed_s * (1 - done) / done)
                  : std::string("?");
  std::string auc;
  for (const rpc::WorkerStatus& w : st->workers()) {
    if (w.rank() == 0 && w.progress().test_auc_at_s() > 0) {
      auc = absl::StrFormat("  AUC %.4f", w.progress().test_auc());
    }
  }
  std::printf(
      "\r[%s%s] %3.0f%%  %5.1f s  ETA %s  %.0f samples/s%s  window %d   ",
      std::string(filled, '#').c_str(),
      std::string(kWidth - filled, '.').c_str(), 100 * done, elapsed_s,
      eta.c_str(), samples_per_s, auc.c_str(), st->window());
  std::fflush(stdout);
}

// `program` as execve takes it: a path as given, a bare name looked up on
// PATH.
absl::StatusOr<std::string> FindProgram(const std::string& program) {
  if (program.find('/') != std::string::npos) return program;
  const char* path = std::getenv("PATH");
  for (absl::string_view dir : absl::StrSplit(path ? path : "", ':')) {
    if (dir.empty()) continue;
    std::string candidate = absl::StrCat(dir, "/", program);
    if (access(candidate.c_str(), X_OK) == 0) return candidate;
  }
  return absl::NotFoundError(
      absl::StrCat("'", program, "' is not a path and not found on PATH"));
}

// The environment of a worker.command process (JobConfig::WorkerConfig).
std::vector<std::pair<std::string, std::string>> WorkerEnvironment(
    const JobConfig& config, const LaunchOptions& options,
    const std::vector<std::string>& overrides, int rank) {
  return {
      {"HETPS_CONFIG", std::filesystem::absolute(options.config_path).string()},
      {"HETPS_SET", absl::StrJoin(overrides, "\n")},
      {"HETPS_RANK", std::to_string(rank)},
      {"TRAINING_ROLE", "TRAINER"},
      {"PADDLE_TRAINER_ID", std::to_string(rank)},
      {"PADDLE_TRAINERS_NUM", std::to_string(config.num_workers())},
      {"PADDLE_PSERVERS_IP_PORT_LIST",
       absl::StrJoin(config.cluster.ps_endpoints, ",")},
      // Lines reach the launcher as they are printed.
      {"PYTHONUNBUFFERED", "1"}};
}

int RunLaunch(JobConfig config, const LaunchOptions& options) {
  Clock& clock = Clock::Real();
  const absl::Time start = clock.Now();
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
  // The run directory: every role's log, the launcher's, the summary.
  std::filesystem::path run_dir = options.run_dir;
  if (run_dir.empty()) {
    run_dir = std::filesystem::path("runs") /
              absl::StrCat(config.name, "-",
                           absl::FormatTime("%Y%m%d-%H%M%S", absl::Now(),
                                            absl::UTCTimeZone()),
                           "-", getpid());
  }
  std::error_code dir_error;
  std::filesystem::create_directories(run_dir, dir_error);
  if (dir_error) {
    spdlog::error("cannot create the run directory {}: {}", run_dir.string(),
                  dir_error.message());
    return kExitFailure;
  }
  if (!options.verbose) LogToFileQuietly((run_dir / "launch.log").string());
  std::printf("hetps: job '%s', mode %s, %d servers, %d workers; logs in %s\n",
              config.name.c_str(), ConsistencyModeName(config.mode), servers,
              workers, run_dir.c_str());
  std::fflush(stdout);
  spdlog::info("job '{}': {} servers, {} workers, mode {}, servers at {}",
               config.name, servers, workers, ConsistencyModeName(config.mode),
               absl::StrJoin(config.cluster.ps_endpoints, ","));

  // What every child gets on top of the config file: the --set flags and
  // the servers' endpoints.
  std::vector<std::string> overrides = options.overrides;
  overrides.push_back("cluster.ps_endpoints=" +
                      absl::StrJoin(config.cluster.ps_endpoints, ","));
  std::optional<std::string> worker_program;
  if (!config.worker.command.empty()) {
    auto program = FindProgram(config.worker.command[0]);
    if (!program.ok()) {
      spdlog::error("worker.command: {}", program.status().message());
      return kExitFailure;
    }
    worker_program = *program;
  }

  std::atomic<int> listening{0};
  // Workers' report lines, by rank, as the output pumps see them.
  struct Reports {
    absl::Mutex mu;
    std::map<int, nlohmann::json> by_rank ABSL_GUARDED_BY(mu);
  } reports;
  // Every role's lines, in <run dir>/<role>.log, and the last few of each
  // for the terminal when the role fails.
  struct RoleLogs {
    absl::Mutex mu;
    std::map<std::string, std::ofstream> files ABSL_GUARDED_BY(mu);
    std::map<std::string, std::deque<std::string>> tails ABSL_GUARDED_BY(mu);
  } logs;
  constexpr size_t kTailLines = 12;
  const auto log_file = [&](const std::string& label) {
    return run_dir / (absl::StrReplaceAll(label, {{" ", "-"}}) + ".log");
  };
  ProcessGroup group(
      [&](const std::string& label, const std::string& line) {
        {
          absl::MutexLock lock(&logs.mu);
          std::ofstream& file = logs.files[label];
          if (!file.is_open()) file.open(log_file(label), std::ios::app);
          file << line << std::endl;
          std::deque<std::string>& tail = logs.tails[label];
          tail.push_back(line);
          if (tail.size() > kTailLines) tail.pop_front();
        }
        if (absl::StartsWith(label, "server") &&
            absl::StartsWith(line, kListeningPrefix)) {
          ++listening;
        } else if (absl::StartsWith(line, kReportPrefix)) {
          auto j = nlohmann::json::parse(line.substr(strlen(kReportPrefix)),
                                         nullptr, /*allow_exceptions=*/false);
          if (j.is_object() && j.contains("rank")) {
            absl::MutexLock lock(&reports.mu);
            reports.by_rank[j["rank"].get<int>()] = j;
          }
        }
      },
      Clock::Real(), /*echo=*/options.verbose);

  auto child_args = [&](const char* role, int rank) {
    std::vector<std::string> argv = {options.self_path, role,
                                     "--config",        options.config_path,
                                     "--rank",          std::to_string(rank)};
    for (const std::string& o : overrides) {
      argv.push_back("--set");
      argv.push_back(o);
    }
    return argv;
  };
  // A worker: `hetps worker`, or the job's worker.command with the job in
  // its environment.
  auto spawn_worker = [&](int rank) -> absl::StatusOr<pid_t> {
    const std::string label = absl::StrCat("worker ", rank);
    if (!worker_program) {
      std::vector<std::string> argv = child_args("worker", rank);
      argv.insert(argv.end(), options.worker_args.begin(),
                  options.worker_args.end());
      return group.Spawn(label, argv);
    }
    std::vector<std::string> argv = config.worker.command;
    argv[0] = *worker_program;
    return group.Spawn(label, argv,
                       WorkerEnvironment(config, options, overrides, rank));
  };
  auto fail = [&](const std::string& why) {
    spdlog::error("{}; stopping the job", why);
    group.StopAll(absl::Seconds(5));
    // The failing role's last lines (its whole log is in the run directory).
    if (!options.verbose) {
      absl::MutexLock lock(&logs.mu);
      for (const auto& [label, tail] : logs.tails) {
        if (!absl::StartsWith(why, label + " ")) continue;
        std::fprintf(stderr, "---- %s, last lines (all in %s):\n",
                     label.c_str(), log_file(label).c_str());
        for (const std::string& line : tail) {
          std::fprintf(stderr, "%s\n", line.c_str());
        }
      }
    }
    return ProcessGroup::interrupted() ? kExitInterrupted : kExitFailure;
  };

  for (int s = 0; s < servers; ++s) {
    auto pid = group.Spawn(absl::StrCat("server ", s), child_args("server", s));
    if (!pid.ok()) return fail(std::string(pid.status().message()));
  }
  // Servers first: workers start once every server listens.
  const absl::Time ready_deadline =
      start + absl::Seconds(config.client.connect_deadline_s);
  while (listening < servers) {
    if (auto exit = group.WaitAny(absl::Milliseconds(50))) {
      return fail(absl::StrCat(exit->label, " exited with code ",
                               exit->exit_code, " during start-up"));
    }
    if (ProcessGroup::interrupted()) return fail("interrupted");
    if (clock.Now() > ready_deadline) {
      return fail("servers did not start listening in time");
    }
  }
  for (int w = 0; w < workers; ++w) {
    auto pid = spawn_worker(w);
    if (!pid.ok()) return fail(std::string(pid.status().message()));
  }

  int finished = 0;
  int server_restarts = 0;
  int worker_restarts = 0;
  std::vector<int> failed_workers;
  absl::Time last_status = clock.Now();
  absl::Time last_sample = clock.Now();
  JobTimeline timeline;
  // Quiet: one progress line, rewritten, and only on a terminal.
  const bool progress_line =
      options.live_status && !options.verbose && isatty(STDOUT_FILENO);
  while (finished < workers) {
    auto exit = group.WaitAny(absl::Milliseconds(200));
    if (ProcessGroup::interrupted()) return fail("interrupted (Ctrl-C)");
    if (options.live_status && options.verbose &&
        clock.Now() - last_status > kStatusEvery) {
      last_status = clock.Now();
      PrintLiveStatus(config);
    }
    if (clock.Now() - last_sample > kProgressEvery) {
      // For report.html, and the progress line.
      last_sample = clock.Now();
      const double elapsed_s = absl::ToDoubleSeconds(clock.Now() - start);
      absl::StatusOr<rpc::StatusResponse> st =
          QueryStatus(config.cluster.ps_endpoints[0], 1.0, config.credentials);
      if (st.ok()) {
        timeline.Add(elapsed_s, *st);
        if (progress_line) PrintProgressLine(*st, elapsed_s);
      }
    }
    if (!exit) continue;
    if (absl::StartsWith(exit->label, "server")) {
      // A server that dies while workers run comes back from its newest
      // checkpoint; the workers retry their calls meanwhile.
      if (config.checkpoint.dir.empty() ||
          server_restarts >= config.checkpoint.max_server_restarts) {
        return fail(
            absl::StrCat(exit->label, " exited with code ", exit->exit_code,
                         " while workers run",
                         config.checkpoint.dir.empty()
                             ? " (no checkpoint.dir to restart it from)"
                             : " (checkpoint.max_server_restarts reached)"));
      }
      ++server_restarts;
      const int rank = std::stoi(exit->label.substr(strlen("server ")));
      spdlog::warn(
          "{} died (exit code {}); restarting it from its newest "
          "checkpoint ({} of checkpoint.max_server_restarts = {})",
          exit->label, exit->exit_code, server_restarts,
          config.checkpoint.max_server_restarts);
      std::vector<std::string> argv = child_args("server", rank);
      argv.push_back("--set");
      argv.push_back("checkpoint.resume=true");
      auto pid = group.Spawn(exit->label, argv);
      if (!pid.ok()) return fail(std::string(pid.status().message()));
      continue;
    }
    if (exit->exit_code != 0) {
      const int rank = std::stoi(exit->label.substr(strlen("worker ")));
      if (worker_restarts < config.cluster.max_worker_restarts) {
        ++worker_restarts;
        spdlog::warn(
            "{} died (exit code {}); starting it again ({} of "
            "cluster.max_worker_restarts = {})",
            exit->label, exit->exit_code, worker_restarts,
            config.cluster.max_worker_restarts);
        auto pid = spawn_worker(rank);
        if (!pid.ok()) return fail(std::string(pid.status().message()));
        continue;
      }
      // Rank 0 evaluates the model: the job cannot end well without it.
      if (rank == 0 || static_cast<int>(failed_workers.size()) >=
                           config.cluster.max_worker_failures) {
        return fail(absl::StrCat(exit->label, " failed with exit code ",
                                 exit->exit_code));
      }
      failed_workers.push_back(rank);
      spdlog::warn(
          "{} died (exit code {}); the job goes on without it ({} of "
          "cluster.max_worker_failures = {})",
          exit->label, exit->exit_code, failed_workers.size(),
          config.cluster.max_worker_failures);
    }
    ++finished;
  }
  // The coordinator's count of the data trained, before the servers stop.
  const auto final_status =
      QueryStatus(config.cluster.ps_endpoints[0], 10.0, config.credentials);
  for (const ChildExit& exit : group.StopAll(absl::Seconds(10))) {
    if (exit.exit_code != 0) {
      spdlog::error("{} exited with code {} at shutdown", exit.label,
                    exit.exit_code);
      return kExitFailure;
    }
  }
  const double wall_s = absl::ToDoubleSeconds(clock.Now() - start);

  // Summary: the job's throughput and rank 0's evaluation of the final model.
  nlohmann::json summary = {{"job", config.name},
                            {"mode", ConsistencyModeName(config.mode)},
                            {"servers", servers},
                            {"workers", workers},
                            {"wall_s", wall_s}};
  uint64_t samples = 0;
  double train_s = 0;
  {
    absl::MutexLock lock(&reports.mu);
    if (static_cast<int>(reports.by_rank.size() + failed_workers.size()) !=
            workers ||
        !reports.by_rank.contains(0)) {
      spdlog::error("only {} of {} workers reported results",
                    reports.by_rank.size(), workers);
      return kExitFailure;
    }
    uint64_t malformed = 0;
    nlohmann::json per_worker = nlohmann::json::array();
    uint64_t raw_bytes = 0, sent_bytes = 0;
    uint64_t raw_value_bytes = 0, sent_value_bytes = 0;
    uint64_t pulled_rows = 0, pulled_bytes = 0, cached_rows = 0;
    uint64_t refetched_rows = 0;
    nlohmann::json sent_by_codec = nlohmann::json::object();
    for (auto& [rank, r] : reports.by_rank) {
      pulled_rows += r.value("pulled_rows", uint64_t{0});
      pulled_bytes += r.value("pulled_bytes", uint64_t{0});
      cached_rows += r.value("cached_rows", uint64_t{0});
      refetched_rows += r.value("refetched_rows", uint64_t{0});
      raw_bytes += r.value("raw_bytes", uint64_t{0});
      sent_bytes += r.value("sent_bytes", uint64_t{0});
      raw_value_bytes += r.value("raw_value_bytes", uint64_t{0});
      sent_value_bytes += r.value("sent_value_bytes", uint64_t{0});
      if (r.contains("sent_by_codec")) {
        for (const auto& [codec, bytes] : r["sent_by_codec"].items()) {
          sent_by_codec[codec] =
              sent_by_codec.value(codec, uint64_t{0}) + bytes.get<uint64_t>();
        }
      }
      samples += r["samples"].get<uint64_t>();
      malformed += r.value("malformed_records", uint64_t{0});
      train_s = std::max(train_s, r["train_s"].get<double>());
      per_worker.push_back({{"rank", rank},
                            {"samples", r["samples"]},
                            {"chunks", r.value("chunks", uint64_t{0})},
                            {"rejoins", r.value("rejoins", uint64_t{0})},
                            {"busy_fraction", r.value("busy_fraction", 0.0)},
                            {"train_s", r["train_s"]},
                            {"device", r.value("device", std::string())},
                            {"raw_bytes", r.value("raw_bytes", uint64_t{0})},
                            {"pushes", r.value("pushes", uint64_t{0})}});
      if (r.contains("calibration")) {
        per_worker.back()["calibration"] = r["calibration"];
      }
    }
    summary["per_worker"] = per_worker;
    summary["codec"] = config.compress.codec;
    summary["gradient_bytes_raw"] = raw_bytes;
    summary["gradient_bytes_sent"] = sent_bytes;
    summary["sent_by_codec"] = sent_by_codec;
    summary["compression_ratio"] =
        sent_bytes > 0 ? static_cast<double>(raw_bytes) / sent_bytes : 1.0;
    // Sparse pulls, and what the hot-row cache (client.hot_rows) saved.
    summary["pulled_rows"] = pulled_rows;
    summary["pulled_bytes"] = pulled_bytes;
    summary["cached_rows"] = cached_rows;
    summary["refetched_rows"] = refetched_rows;
    // Gradient values only: keys are 8 bytes in every codec.
    summary["gradient_value_bytes_raw"] = raw_value_bytes;
    summary["gradient_value_bytes_sent"] = sent_value_bytes;
    summary["value_compression_ratio"] =
        sent_value_bytes > 0
            ? static_cast<double>(raw_value_bytes) / sent_value_bytes
            : 1.0;
    summary["loss_curve"] =
        reports.by_rank[0].value("loss_curve", nlohmann::json::array());
    summary["warnings"] =
        reports.by_rank[0].value("warnings", nlohmann::json::array());
    summary["failed_workers"] = failed_workers;
    summary["server_restarts"] = server_restarts;
    summary["worker_restarts"] = worker_restarts;
    if (final_status.ok()) {
      summary["finished_chunks"] = final_status->finished_chunks();
      summary["finished_samples"] = final_status->finished_samples();
      summary["requeued_chunks"] = final_status->requeued_chunks();
      // Each server's CPU over the job (calibrate sizes the servers by it).
      summary["server_cpu"] = nlohmann::json::array();
      for (const rpc::ServerStatus& server : final_status->servers()) {
        summary["server_cpu"].push_back(
            {{"rank", server.rank()},
             {"cpu_s", server.stats().cpu_s()},
             {"allowed_cpus", server.stats().allowed_cpus()}});
      }
      // Where the rows' load fell (SPEC §4), as status shows it.
      const nlohmann::json status_json = StatusToJson(*final_status);
      summary["server_load"] = nlohmann::json::array();
      for (const nlohmann::json& server : status_json["servers"]) {
        nlohmann::json load = server["load"];
        load["rank"] = server["rank"];
        summary["server_load"].push_back(std::move(load));
      }
      summary["server_load_max_over_mean"] =
          status_json["server_load_max_over_mean"];
      summary["hot_keys"] = status_json["hot_keys"];
      summary["placement"] = status_json["placement"];
      if (config.client.hot_rows.enabled) {
        summary["read_lag"] = ReadLagSummary(*final_status);
      }
      summary["diagnostics"] = nlohmann::json::array();
      for (const rpc::Diagnostic& d : final_status->diagnostics()) {
        summary["diagnostics"].push_back(ProtoToJson(d));
      }
    }
    summary["emulated"] = !config.device_profiles.empty();
    summary["malformed_records"] = malformed;
    summary["model"] = config.train.model;
    summary["data"] = config.train.data.format;
    summary["samples"] = samples;
    summary["samples_per_s"] = train_s > 0 ? samples / train_s : 0.0;
    if (reports.by_rank[0].contains("test_auc")) {
      summary["test_auc"] = reports.by_rank[0]["test_auc"];
      summary["test_logloss"] = reports.by_rank[0]["test_logloss"];
      summary["evals"] = reports.by_rank[0]["evals"];
    }
  }
  if (progress_line) std::printf("\n");
  std::printf(
      "\n== hetps job '%s' done: mode %s, %d servers, %d workers\n"
      "   test AUC %.4f  logloss %.4f\n"
      "   %llu samples trained, %.0f samples/s, wall %.1f s\n",
      config.name.c_str(), ConsistencyModeName(config.mode), servers, workers,
      summary.value("test_auc", 0.0), summary.value("test_logloss", 0.0),
      static_cast<unsigned long long>(samples),
      summary["samples_per_s"].get<double>(), wall_s);
  // What heterogeneity bought: each worker's share and how busy it was.
  if (final_status.ok() && summary.contains("per_worker")) {
    std::string batches, busy;
    for (const nlohmann::json& w : summary["per_worker"]) {
      const int rank = w["rank"].get<int>();
      for (const rpc::WorkerStatus& ws : final_status->workers()) {
        if (static_cast<int>(ws.rank()) == rank) {
          absl::StrAppend(&batches, batches.empty() ? "" : " ",
                          ws.progress().batch_size());
        }
      }
      absl::StrAppend(
          &busy, busy.empty() ? "" : " ",
          absl::StrFormat("%.0f%%", 100 * w["busy_fraction"].get<double>()));
    }
    std::printf("   per worker: batch %s, busy %s; window %d\n",
                batches.c_str(), busy.c_str(), final_status->window());
    if (summary.contains("read_lag")) {
      const uint64_t cached = summary["cached_rows"].get<uint64_t>();
      const uint64_t pulled = summary["pulled_rows"].get<uint64_t>();
      const nlohmann::json& lag = summary["read_lag"];
      std::printf(
          "   hot-row cache: %.0f%% of rows read from it, %.1f MB pulled; "
          "lag <= %llu applies (bound %llu, %llu pushes over)\n",
          cached + pulled > 0 ? 100.0 * cached / (cached + pulled) : 0.0,
          summary["pulled_bytes"].get<uint64_t>() / 1e6,
          static_cast<unsigned long long>(lag["max"].get<uint64_t>()),
          static_cast<unsigned long long>(lag["bound"].get<uint64_t>()),
          static_cast<unsigned long long>(lag["violations"].get<uint64_t>()));
    }
    if (!summary["hot_keys"].empty()) {
      std::printf("   servers' load max/mean %.2f; hottest key %s\n",
                  summary["server_load_max_over_mean"].get<double>(),
                  FormatHotKey(summary["hot_keys"][0]).c_str());
    }
    if (final_status.ok() && final_status->placement().moves() > 0) {
      std::printf("   placement: %s\n",
                  FormatPlacement(final_status->placement()).c_str());
    }
  }
  // The diagnostics raised during the run (all in summary.json).
  if (final_status.ok()) {
    constexpr int kShown = 3;
    const auto& diagnostics = final_status->diagnostics();
    for (int i = 0; i < std::min(kShown, diagnostics.size()); ++i) {
      std::printf("   warning: %s: %s %s\n", diagnostics[i].subject().c_str(),
                  diagnostics[i].kind().c_str(),
                  diagnostics[i].message().c_str());
    }
    if (diagnostics.size() > kShown) {
      std::printf("   (%d more warnings in summary.json)\n",
                  diagnostics.size() - kShown);
    }
  }
  absl::StatusOr<std::string> config_file = ReadFile(options.config_path);
  std::string config_text = config_file.ok() ? *config_file : "";
  if (!options.overrides.empty()) {
    absl::StrAppend(&config_text, "\n# --set\n# ",
                    absl::StrJoin(options.overrides, "\n# "), "\n");
  }
  const std::string report = (run_dir / "report.html").string();
  if (absl::Status s = WriteReport(report, timeline, summary, config_text);
      !s.ok()) {
    spdlog::error("report: {}", s.message());
  }
  std::printf("   logs, summary.json and report.html in %s\n", run_dir.c_str());
  std::fflush(stdout);
  for (const std::string& path :
       {(run_dir / "summary.json").string(), options.summary_json}) {
    if (path.empty()) continue;
    std::ofstream out(path);
    out << summary.dump(2) << "\n";
    if (!out) {
      spdlog::error("cannot write the summary to {}", path);
      return kExitFailure;
    }
  }
  return kExitOk;
}

int RunGenData(const CriteoGenConfig& config, const std::string& path) {
  Clock& clock = Clock::Real();
  const absl::Time start = clock.Now();
  auto report = GenerateCriteo(config, path);
  if (!report.ok()) {
    std::fprintf(stderr, "hetps gen-data: %s\n",
                 std::string(report.status().message()).c_str());
    return kExitFailure;
  }
  const double seconds = absl::ToDoubleSeconds(clock.Now() - start);
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

std::string FormatStatusLine(const rpc::StatusResponse& status) {
  uint32_t live = 0;
  double samples_per_s = 0;
  double busy = 0;
  uint64_t max_staleness = 0;
  for (const rpc::WorkerStatus& w : status.workers()) {
    if (!w.live()) continue;
    ++live;
    samples_per_s += w.progress().samples_per_s();
    busy += w.progress().busy_fraction();
    max_staleness = std::max(max_staleness, w.staleness());
  }
  uint64_t queued = 0;
  for (const rpc::ServerStatus& s : status.servers()) {
    queued += s.stats().queue_length();
  }
  return absl::StrFormat(
      "[status] %.0f s  %s  window %d  live %d/%d  %.0f samples/s  busy "
      "%.0f%%  queue %d  staleness <= %d",
      status.elapsed_s(), status.mode(), status.window(), live,
      status.workers_size(), samples_per_s, live ? 100 * busy / live : 0.0,
      queued, max_staleness);
}

int RunStatus(const std::string& coordinator_endpoint, bool json,
              const Credentials& credentials) {
  auto status = QueryStatus(coordinator_endpoint, 10.0, credentials);
  if (!status.ok()) {
    std::fprintf(stderr, "hetps status: %s\n",
                 std::string(status.status().message()).c_str());
    return kExitFailure;
  }
  const nlohmann::json j = StatusToJson(*status);
  if (json) {
    std::printf("%s\n", j.dump(2).c_str());
    return kExitOk;
  }
  std::printf("%s\n", FormatStatusLine(*status).c_str());
  for (const rpc::WorkerStatus& w : status->workers()) {
    const rpc::WorkerProgress& p = w.progress();
    std::printf(
        "worker %u  %-5s%s clock %llu  batch %u x%u  %.0f samples/s "
        "(%.0f when busy)  busy %.0f%%  staleness %llu  codec %s (%.1fx)%s  "
        "heartbeat %.1fs ago %s\n",
        w.rank(), w.live() ? "live" : "gone", p.emulated() ? " (emulated)" : "",
        static_cast<unsigned long long>(p.clock()), p.batch_size(),
        p.push_freq(), p.samples_per_s(), p.compute_samples_per_s(),
        100 * p.busy_fraction(), static_cast<unsigned long long>(w.staleness()),
        p.codec().c_str(),
        p.sent_bytes() > 0 ? static_cast<double>(p.raw_bytes()) / p.sent_bytes()
                           : 1.0,
        p.cached_rows() > 0
            ? absl::StrFormat(
                  "  cache %.0f%% of rows",
                  100.0 * p.cached_rows() / (p.cached_rows() + p.pulled_rows()))
                  .c_str()
            : "",
        w.last_heartbeat_age_s(), w.left_reason().c_str());
  }
  for (const auto& s : j["servers"]) {
    const std::string metrics = s.value("metrics_endpoint", "");
    std::printf(
        "server %d  %s  %s  applies %llu  queue %llu  cpu %.0f%%  rows %s  "
        "load %.0f%% (%.1f s serving; %llu rows pulled, %llu pushed)%s\n",
        s["rank"].get<int>(), s["endpoint"].get<std::string>().c_str(),
        s["reachable"].get<bool>() ? "up" : "DOWN",
        static_cast<unsigned long long>(s["applied_rounds"].get<uint64_t>()),
        static_cast<unsigned long long>(s["queue_length"].get<uint64_t>()),
        100 * s["cpu_fraction"].get<double>(), s["table_rows"].dump().c_str(),
        100 * s["load"]["service_share"].get<double>(),
        s["load"]["service_s"].get<double>(),
        static_cast<unsigned long long>(
            s["load"]["pulled_rows"].get<uint64_t>()),
        static_cast<unsigned long long>(
            s["load"]["pushed_rows"].get<uint64_t>()),
        metrics.empty()
            ? ""
            : absl::StrCat("  metrics http://", metrics, "/metrics").c_str());
  }
  if (!j["hot_keys"].empty()) {
    std::string keys;
    for (const auto& k : j["hot_keys"]) {
      absl::StrAppend(&keys, keys.empty() ? "" : ", ", FormatHotKey(k));
    }
    std::printf("hot keys (load max/mean %.2f): %s\n",
                j["server_load_max_over_mean"].get<double>(), keys.c_str());
  }
  if (status->placement().at_s() > 0) {
    std::printf("placement: %s\n",
                FormatPlacement(status->placement()).c_str());
  }
  for (const std::string& change : status->window_changes()) {
    std::printf("window change: %s\n", change.c_str());
  }
  for (const rpc::Diagnostic& d : status->diagnostics()) {
    std::printf("warning: %s: %s %s (%.0f-%.0f s%s)\n", d.subject().c_str(),
                d.kind().c_str(), d.message().c_str(), d.first_s(), d.last_s(),
                d.active() ? ", still holds" : "");
  }
  return kExitOk;
}

int RunSave(const std::string& coordinator_endpoint,
            const Credentials& credentials) {
  auto status = QueryStatus(coordinator_endpoint, 10.0, credentials);
  if (!status.ok()) {
    std::fprintf(stderr, "hetps save: %s\n",
                 std::string(status.status().message()).c_str());
    return kExitFailure;
  }
  int failed = 0;
  for (const rpc::ServerStatus& server : status->servers()) {
    auto stub = rpc::ParameterServer::NewStub(
        MakeChannel(server.endpoint(), 64 << 20, credentials));
    grpc::ClientContext ctx;
    ctx.set_deadline(RpcDeadline(Clock::Real(), 600));
    rpc::SaveRequest request;
    request.set_protocol_version(kProtocolVersion);
    rpc::SaveResponse response;
    const grpc::Status st = stub->Save(&ctx, request, &response);
    if (st.ok()) {
      std::printf("server %u: %s\n", server.rank(), response.path().c_str());
    } else {
      ++failed;
      std::fprintf(stderr, "hetps save: server %u (%s): %s\n", server.rank(),
                   server.endpoint().c_str(), st.error_message().c_str());
    }
  }
  return failed == 0 ? kExitOk : kExitFailure;
}

int RunExport(const std::string& checkpoint_dir, const std::string& out_dir) {
  auto exported = ExportModel(checkpoint_dir, out_dir);
  if (!exported.ok()) {
    std::fprintf(stderr, "hetps export: %s\n",
                 std::string(exported.status().message()).c_str());
    return kExitFailure;
  }
  std::printf("%s\n", exported->dump(2).c_str());
  return kExitOk;
}

}  // namespace hetps
