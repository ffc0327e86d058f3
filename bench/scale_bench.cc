// Many light workers against a few servers (issue 17, target 4): how the
// round time, the servers' threads and their memory grow with the number of
// workers that wait on them at once.
//
//   scale_bench [--servers 4] [--workers 16,64,256] [--modes sync,semi_async]
//               [--rounds 40] [--keys 64] [--compute_ms 2] [--out f.json]
//
// For every mode and worker count: `--servers` fresh `hetps server`
// processes on 127.0.0.1 and that many worker threads in this process, one
// PsClient each. A worker's step pulls `--keys` random rows of a dim-8
// sparse table and a 256-float dense table (in the same call, as the
// trainer does, unless --dense_along=false), "computes" for `--compute_ms`
// (a sleep: the workers are light, the servers are what is measured) and
// pushes gradients for both. Round r ends when the last worker has pushed
// its step r; the JSON reports the median round time over the timed rounds
// (after 5 untimed ones), the servers' CPU time per round, their most
// threads at once (sampled from /proc every 20 ms) and their peak resident
// memory (VmHWM), summed over the servers.
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <barrier>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <random>
#include <thread>

#include "CLI/CLI.hpp"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "cli/process_group.h"
#include "cli/roles.h"
#include "common/median.h"
#include "common/ports.h"
#include "common/process_tuning.h"
#include "hetps/ps_client.h"
#include "nlohmann/json.hpp"
#include "server_processes.h"

namespace {

using SteadyClock = std::chrono::steady_clock;

constexpr int kUntimedRounds = 5;
constexpr uint64_t kSparseDim = 8;
constexpr uint64_t kDenseSize = 256;
constexpr uint64_t kVocabulary = 100000;

// A field of /proc/<pid>/status ("Threads", "VmHWM" in kB); -1 if absent.
int64_t ProcStatus(int pid, const std::string& field) {
  std::ifstream in(absl::StrCat("/proc/", pid, "/status"));
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind(field + ":", 0) != 0) continue;
    std::vector<std::string> parts =
        absl::StrSplit(line.substr(field.size() + 1), absl::ByAnyChar(" \t"),
                       absl::SkipEmpty());
    int64_t value = 0;
    if (!parts.empty() && absl::SimpleAtoi(parts[0], &value)) return value;
  }
  return -1;
}

// User + system CPU seconds of process `pid` so far (/proc/<pid>/stat).
double ProcCpuSeconds(int pid) {
  std::ifstream in(absl::StrCat("/proc/", pid, "/stat"));
  std::string stat((std::istreambuf_iterator<char>(in)),
                   std::istreambuf_iterator<char>());
  // Fields after the command name, which is in parentheses and may hold
  // spaces: state is field 3, utime 14, stime 15.
  const size_t close = stat.rfind(')');
  if (close == std::string::npos) return 0;
  std::vector<std::string> fields =
      absl::StrSplit(stat.substr(close + 2), ' ', absl::SkipEmpty());
  double utime = 0, stime = 0;
  if (fields.size() < 13 || !absl::SimpleAtod(fields[11], &utime) ||
      !absl::SimpleAtod(fields[12], &stime)) {
    return 0;
  }
  return (utime + stime) / static_cast<double>(sysconf(_SC_CLK_TCK));
}

struct Case {
  std::string mode;
  int servers = 4;
  int workers = 16;
  int rounds = 40;
  uint64_t keys = 64;
  double compute_ms = 2;
  bool dense_along = true;
};

absl::StatusOr<nlohmann::json> RunCase(const Case& c) {
  auto ports = hetps::PickFreePorts("127.0.0.1", c.servers);
  if (!ports.ok()) return ports.status();
  std::vector<std::string> endpoints;
  for (int port : *ports) endpoints.push_back(absl::StrCat("127.0.0.1:", port));
  const std::string yaml = absl::StrCat(
      "name: scale-bench\nmode: ", c.mode,
      "\nlog_level: warn\ntrain: {model: none}\n"
      "server: {heartbeat_timeout_s: 3600}\n"
      "cluster:\n  workers: ",
      c.workers, "\n  ps_endpoints: [", absl::StrJoin(endpoints, ", "),
      "]\ntables:\n"
      "  - {name: emb, kind: sparse, dim: ",
      kSparseDim,
      ", optimizer: {type: sgd, learning_rate: 0.01}}\n"
      "  - {name: mlp, kind: dense, dim: ",
      kDenseSize, ", optimizer: {type: sgd, learning_rate: 0.01}}\n");
  const std::string config_path =
      absl::StrCat("/tmp/hetps-scale-bench-", getpid(), ".yaml");
  std::ofstream(config_path) << yaml;

  std::atomic<int> listening{0};
  hetps::ProcessGroup group([&](const std::string&, const std::string& line) {
    if (line.rfind(hetps::kListeningPrefix, 0) == 0) ++listening;
  });
  auto pids = hetps::bench::StartServers(group, HETPS_BINARY, config_path,
                                         c.servers, listening);
  if (!pids.ok()) return pids.status();

  std::vector<std::unique_ptr<hetps::PsClient>> clients;
  for (int w = 0; w < c.workers; ++w) {
    hetps::PsClientOptions options;
    options.endpoints = endpoints;
    options.worker_id = w;
    auto client = hetps::PsClient::Connect(options);
    if (!client.ok()) return client.status();
    clients.push_back(std::move(*client));
  }

  // The servers' threads, sampled while the workers run.
  std::atomic<bool> running{true};
  std::vector<int64_t> max_threads(c.servers, 0);
  std::thread sampler([&] {
    while (running) {
      for (int s = 0; s < c.servers; ++s) {
        max_threads[s] =
            std::max(max_threads[s], ProcStatus((*pids)[s], "Threads"));
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  });

  double cpu_before = 0;
  for (int s = 0; s < c.servers; ++s) cpu_before += ProcCpuSeconds((*pids)[s]);
  const int total_rounds = kUntimedRounds + c.rounds;
  std::vector<std::vector<SteadyClock::time_point>> ends(
      c.workers, std::vector<SteadyClock::time_point>(total_rounds));
  std::atomic<bool> failed{false};
  std::string failure;
  std::mutex failure_mu;
  std::barrier start(c.workers);
  std::vector<std::thread> threads;
  for (int w = 0; w < c.workers; ++w) {
    threads.emplace_back([&, w] {
      std::mt19937_64 rng(7000 + w);
      std::uniform_int_distribution<uint64_t> key(0, kVocabulary - 1);
      std::vector<uint64_t> keys(c.keys);
      std::vector<float> rows(c.keys * kSparseDim), dense(kDenseSize);
      std::vector<float> sparse_grads(rows.size(), 0.001f);
      std::vector<float> dense_grads(kDenseSize, 0.001f);
      hetps::PsClient& client = *clients[w];
      start.arrive_and_wait();
      for (int r = 0; r < total_rounds && !failed; ++r) {
        for (uint64_t& k : keys) k = key(rng);
        absl::Status s;
        if (c.dense_along) {  // as the trainer pulls (StepRunner::Pull)
          const hetps::PsClient::DenseAlong along{"mlp", dense};
          s = client.PullSparse("emb", keys, rows, hetps::KeySet::kMayRepeat,
                                hetps::RowSource::kCacheAllowed, &along);
        } else {
          s = client.PullSparse("emb", keys, rows);
          if (s.ok()) s = client.PullDense("mlp", dense);
        }
        std::this_thread::sleep_for(
            std::chrono::duration<double, std::milli>(c.compute_ms));
        const hetps::TableGrad grads[] = {{"emb", keys, sparse_grads},
                                          {"mlp", {}, dense_grads}};
        if (s.ok()) s = client.Push(grads, 1);
        if (!s.ok()) {
          std::lock_guard<std::mutex> lock(failure_mu);
          failure =
              absl::StrCat("worker ", w, " round ", r, ": ", s.ToString());
          failed = true;
          return;
        }
        ends[w][r] = SteadyClock::now();
      }
    });
  }
  for (std::thread& t : threads) t.join();
  running = false;
  sampler.join();
  int64_t threads_now = 0, threads_max = 0, hwm_kb = 0;
  double cpu_s = 0;
  for (int s = 0; s < c.servers; ++s) {
    cpu_s += ProcCpuSeconds((*pids)[s]);
    threads_now += ProcStatus((*pids)[s], "Threads");
    threads_max += max_threads[s];
    hwm_kb += ProcStatus((*pids)[s], "VmHWM");
  }
  clients.clear();
  group.StopAll(absl::Seconds(5));
  std::remove(config_path.c_str());
  if (failed) return absl::InternalError(failure);

  std::vector<double> round_ms;
  SteadyClock::time_point previous;
  for (int r = kUntimedRounds - 1; r < total_rounds; ++r) {
    SteadyClock::time_point end = ends[0][r];
    for (int w = 1; w < c.workers; ++w) end = std::max(end, ends[w][r]);
    if (r >= kUntimedRounds) {
      round_ms.push_back(
          std::chrono::duration<double, std::milli>(end - previous).count());
    }
    previous = end;
  }
  return nlohmann::json{
      {"mode", c.mode},
      {"servers", c.servers},
      {"workers", c.workers},
      {"keys", c.keys},
      {"compute_ms", c.compute_ms},
      {"dense_along", c.dense_along},
      {"rounds", c.rounds},
      {"round_ms_median", hetps::Percentile(round_ms, 0.5)},
      {"round_ms_p90", hetps::Percentile(round_ms, 0.9)},
      {"server_cpu_ms_per_round", (cpu_s - cpu_before) * 1000.0 / total_rounds},
      {"server_threads_max", threads_max},
      {"server_threads_end", threads_now},
      {"server_peak_rss_mb", static_cast<double>(hwm_kb) / 1024.0}};
}

}  // namespace

int main(int argc, char** argv) {
  hetps::TuneProcess();
  CLI::App app{"hetps scale benchmark: many light workers, few servers"};
  Case base;
  std::string workers_list = "16,64,256";
  std::string modes_list = "sync,semi_async";
  std::string out_path;
  app.add_option("--servers", base.servers, "server processes");
  app.add_option("--workers", workers_list, "worker counts, comma-separated");
  app.add_option("--modes", modes_list, "consistency modes, comma-separated");
  app.add_option("--rounds", base.rounds, "timed rounds per case");
  app.add_option("--keys", base.keys, "sparse keys per step");
  app.add_option("--compute_ms", base.compute_ms, "each step's compute");
  app.add_option("--dense_along", base.dense_along,
                 "pull the dense table with the rows (as the trainer does; "
                 "false: a PullDense after the PullSparse)");
  app.add_option("--out", out_path, "also write the JSON here");
  CLI11_PARSE(app, argc, argv);

  nlohmann::json results = nlohmann::json::array();
  for (auto mode : absl::StrSplit(modes_list, ',')) {
    for (auto workers : absl::StrSplit(workers_list, ',')) {
      Case c = base;
      c.mode = std::string(mode);
      if (!absl::SimpleAtoi(workers, &c.workers) || c.workers < 1) {
        std::fprintf(stderr, "bad worker count '%s'\n",
                     std::string(workers).c_str());
        return 2;
      }
      auto row = RunCase(c);
      if (!row.ok()) {
        std::fprintf(stderr, "%s x%d: %s\n", c.mode.c_str(), c.workers,
                     row.status().ToString().c_str());
        return 1;
      }
      std::fprintf(stderr,
                   "%-10s %3d workers: round %.2f ms (p90 %.2f), server "
                   "CPU %.1f ms/round, threads %lld, peak RSS %.0f MB\n",
                   c.mode.c_str(), c.workers,
                   (*row)["round_ms_median"].get<double>(),
                   (*row)["round_ms_p90"].get<double>(),
                   (*row)["server_cpu_ms_per_round"].get<double>(),
                   static_cast<long long>((*row)["server_threads_max"]),
                   (*row)["server_peak_rss_mb"].get<double>());
      results.push_back(*row);
    }
  }
  nlohmann::json doc = {{"benchmark", "scale"}, {"results", results}};
  std::printf("%s\n", doc.dump(2).c_str());
  if (!out_path.empty()) std::ofstream(out_path) << doc.dump(2) << "\n";
  return 0;
}
