// Live bucket migration on a real cluster: `hetps server` processes on
// 127.0.0.1 (every server emulated at `--base-speed` of this machine's speed,
// server 1 at `--speeds` of that),
// worker threads (one PsClient each) in this process pulling and pushing
// Zipf-distributed keys of a 2^20-row table in async mode, as fast as they
// can. Each case runs twice: static hash placement (sharding.migrate off)
// and dynamic (the coordinator's Rebalancer plans carried out by live
// migration every control period).
//
//   migration_bench [--servers 2] [--zipf 0,1.1] [--speeds 0.5,1]
//                   [--base-speed 1] [--workers 4] [--keys 1024] [--dim 32]
//                   [--seconds 20] [--rotate-at 0]
//                   [--placements static,dynamic] [--out results.json]
//
// Per run: steps/s of all workers in the last third of the run (after the
// moves of the first periods), pull latency p50/p99 there, and p50/p99 of the
// pulls that overlapped a move (from server 0's "placement: moved" lines:
// each says how long the move took), with the moves' count, rows and bytes;
// per move, its pulls' p50/p90/max against the p50/p99 of the pulls in the
// half second before it. The coordinator's placement record, polled: each
// control period's max/mean service time (the median over the last third),
// and with --rotate-at, after the hottest 1,000 ids take new keys at that
// second, each period's max/mean and how many full periods stayed above
// 1.25.
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <mutex>
#include <regex>
#include <thread>

#include "CLI/CLI.hpp"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "cli/process_group.h"
#include "cli/roles.h"
#include "common/hash.h"
#include "common/median.h"
#include "common/ports.h"
#include "common/process_tuning.h"
#include "common/zipf.h"
#include "coord/coordinator_client.h"
#include "hetps/ps_client.h"
#include "hot_set.h"
#include "nlohmann/json.hpp"
#include "server_processes.h"

namespace {

using Clock = std::chrono::steady_clock;
constexpr uint64_t kRows = uint64_t{1} << 20;

double Seconds(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

struct Pull {
  double start_s;  // since the run began
  double ms;
  bool refused;  // a server refused part of it as "moved": asked again
};

struct Move {
  double end_s;
  double ms;
};

// One control period's plan as the coordinator's status showed it.
struct Period {
  double polled_s;  // since the run began
  double at_s;      // since the coordinator started
  double max_over_mean;
};

struct Case {
  int servers;
  int workers;
  double zipf;
  double slow_speed;  // server 1's, relative to the others
  double base_speed;  // every server's: below 1 the servers saturate first
  double rotate_at;   // seconds into the run; 0: the hot set stays
  bool migrate;
};

// One run; the JSON row, or an error message.
nlohmann::json Run(const Case& c, uint64_t keys_per_step, uint64_t dim,
                   double seconds) {
  auto ports = hetps::PickFreePorts("127.0.0.1", c.servers);
  if (!ports.ok()) return {{"error", ports.status().ToString()}};
  std::vector<std::string> endpoints;
  for (int port : *ports) endpoints.push_back(absl::StrCat("127.0.0.1:", port));
  std::string yaml = absl::StrCat(
      "name: migration-bench\nmode: async\nlog_level: info\n"
      "train: {model: none}\n"
      "cluster: {workers: ",
      c.workers, ", ps_endpoints: [", absl::StrJoin(endpoints, ", "),
      "]}\n"
      // The bench's workers do not register: nobody is dropped as silent.
      "server: {heartbeat_timeout_s: 3600}\n"
      "semi_async: {adapt_every_s: 1}\n"
      "sharding: {migrate: ",
      c.migrate ? "true" : "false",
      "}\n"
      "tables:\n  - {name: emb, kind: sparse, dim: ",
      dim, ", optimizer: {type: sgd, learning_rate: 0.01}}\n");
  // Server 1 first: a rank takes the first profile that names it.
  if (c.slow_speed * c.base_speed < 1) {
    absl::StrAppend(&yaml, "server_profiles: [{ranks: [1], speed: ",
                    c.slow_speed * c.base_speed, "}");
    if (c.base_speed < 1) {
      std::vector<int> others;
      for (int r = 0; r < c.servers; ++r) {
        if (r != 1) others.push_back(r);
      }
      absl::StrAppend(&yaml, ", {ranks: [", absl::StrJoin(others, ", "),
                      "], speed: ", c.base_speed, "}");
    }
    absl::StrAppend(&yaml, "]\n");
  }
  const std::string config_path =
      absl::StrCat("/tmp/hetps-migration-bench-", getpid(), ".yaml");
  std::ofstream(config_path) << yaml;

  const Clock::time_point began = Clock::now();
  std::mutex moves_mu;
  std::vector<Move> moves;
  uint64_t moved_rows = 0, moved_bytes = 0, moved_buckets = 0;
  const std::regex moved_line(
      R"(placement: moved (\d+) buckets, (\d+) rows \(([0-9.]+) MB\) in ([0-9.]+) ms)");
  std::atomic<int> listening{0};
  hetps::ProcessGroup group([&](const std::string&, const std::string& line) {
    if (line.rfind(hetps::kListeningPrefix, 0) == 0) ++listening;
    if (line.find("handed over") != std::string::npos) {
      std::fprintf(stderr, "%s\n", line.c_str());
    }
    std::smatch m;
    if (std::regex_search(line, m, moved_line)) {
      std::fprintf(stderr, "%s\n", line.c_str());
      std::lock_guard lock(moves_mu);
      moves.push_back({Seconds(began, Clock::now()), std::stod(m[4])});
      moved_buckets += std::stoull(m[1]);
      moved_rows += std::stoull(m[2]);
      moved_bytes += static_cast<uint64_t>(std::stod(m[3]) * 1e6);
    }
  });
  if (auto s = hetps::bench::StartServers(group, HETPS_BINARY, config_path,
                                          c.servers, listening);
      !s.ok()) {
    return {{"error", s.status().ToString()}};
  }

  const hetps::ZipfTable zipf(kRows, c.zipf);
  std::vector<std::vector<Pull>> pulls(c.workers);
  std::vector<std::vector<double>> step_ends(c.workers);
  std::atomic<bool> failed{false};
  std::atomic<bool> over{false};
  std::atomic<int> finished{0};
  const Clock::time_point start = Clock::now();
  const double offset = Seconds(began, start);
  std::vector<Period> periods;
  std::thread poller([&] {
    while (!over) {
      auto status = hetps::QueryStatus(endpoints[0], 1.0, hetps::Credentials{});
      if (status.ok() && status->has_placement() &&
          (periods.empty() ||
           status->placement().at_s() != periods.back().at_s)) {
        periods.push_back({Seconds(start, Clock::now()),
                           status->placement().at_s(),
                           status->placement().max_over_mean()});
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
  });
  std::vector<std::thread> threads;
  for (int w = 0; w < c.workers; ++w) {
    threads.emplace_back([&, w] {
      hetps::PsClientOptions options;
      options.endpoints = endpoints;
      options.worker_id = static_cast<uint32_t>(w);
      auto client = hetps::PsClient::Connect(options);
      if (!client.ok()) {
        std::fprintf(stderr, "%s\n", client.status().ToString().c_str());
        failed = true;
        return;
      }
      hetps::SplitMix64 rng(1234 + w);
      std::vector<uint64_t> keys(keys_per_step);
      std::vector<float> rows(keys_per_step * dim);
      std::vector<float> grads(keys_per_step * dim, 0.001f);
      // A worker whose time is up keeps stepping (unrecorded) until every
      // worker's is: a move begun at the end waits for all of them to pass
      // its cut, and a worker held at a new owner for it would wait forever.
      bool done = false;
      while (!failed) {
        const bool timed = Seconds(start, Clock::now()) < seconds;
        if (!timed && !done) {
          done = true;
          ++finished;
        }
        if (finished == c.workers) break;
        const uint64_t rotated =
            c.rotate_at > 0 && Seconds(start, Clock::now()) >= c.rotate_at
                ? 1000
                : 0;
        for (uint64_t& k : keys) {
          k = hetps::bench::KeyOf(zipf.Sample(rng), rotated);
        }
        const uint64_t retries = (*client)->pull_stats().moved_retries;
        const Clock::time_point t0 = Clock::now();
        auto s = (*client)->PullSparse("emb", keys, rows);
        const Clock::time_point t1 = Clock::now();
        const bool refused = (*client)->pull_stats().moved_retries > retries;
        const hetps::TableGrad grad[] = {{"emb", keys, grads}};
        if (s.ok()) s = (*client)->Push(grad, 1);
        if (!s.ok()) {
          std::fprintf(stderr, "worker %d: %s\n", w, s.ToString().c_str());
          failed = true;
          return;
        }
        if (!timed) continue;
        pulls[w].push_back(
            {offset + Seconds(start, t0),
             std::chrono::duration<double, std::milli>(t1 - t0).count(),
             refused});
        step_ends[w].push_back(Seconds(start, Clock::now()));
      }
    });
  }
  for (auto& t : threads) t.join();
  over = true;
  poller.join();
  group.StopAll(absl::Seconds(5));
  std::remove(config_path.c_str());
  if (failed) return {{"error", "a worker failed"}};

  // The last third: steady state after the first periods' moves.
  const double from = seconds * 2 / 3;
  uint64_t steps = 0;
  for (const auto& ends : step_ends) {
    steps += std::count_if(ends.begin(), ends.end(),
                           [&](double t) { return t >= from; });
  }
  // `before`: pulls in the half second before a move that overlap none, the
  // baseline at the same phase of the run (the last third's balance is
  // better than the first moves', which are made on an unbalanced cluster).
  std::vector<double> steady, during, before;
  // The pulls during moves that no server refused as "moved", and those
  // that one did.
  std::vector<double> during_unrefused, during_refused;
  std::lock_guard lock(moves_mu);
  // Per move: its pulls against those of the half second before it (the
  // same phase of the run, no move).
  std::vector<std::vector<double>> in_move(moves.size()),
      before_move(moves.size());
  for (const auto& list : pulls) {
    for (const Pull& p : list) {
      bool overlaps = false;
      bool in_window = false;
      for (size_t i = 0; i < moves.size(); ++i) {
        const double begin = moves[i].end_s - moves[i].ms / 1e3;
        const double end = p.start_s + p.ms / 1e3;
        if (p.start_s <= moves[i].end_s && end >= begin) {
          overlaps = true;
          in_move[i].push_back(p.ms);
        } else if (p.start_s >= begin - 0.5 && end < begin) {
          before_move[i].push_back(p.ms);
          in_window = true;
        }
      }
      if (overlaps) {
        during.push_back(p.ms);
        (p.refused ? during_refused : during_unrefused).push_back(p.ms);
      } else {
        if (in_window) before.push_back(p.ms);
        if (p.start_s - offset >= from) steady.push_back(p.ms);
      }
    }
  }
  // The plans: a plan made at coordinator time a was seen at bench time
  // a + offset or later, so the smallest difference is the offset.
  double plan_offset = 1e9;
  for (const Period& p : periods) {
    plan_offset = std::min(plan_offset, p.polled_s - p.at_s);
  }
  std::vector<double> steady_balance;
  nlohmann::json after_rotation = nlohmann::json::array();
  int periods_over = 0;
  bool back_under = false;
  for (const Period& p : periods) {
    const double ended = p.at_s + plan_offset;  // in the run's seconds
    if (ended >= from) steady_balance.push_back(p.max_over_mean);
    if (c.rotate_at <= 0 || ended <= c.rotate_at) continue;
    after_rotation.push_back(
        {{"s", ended - c.rotate_at}, {"max_over_mean", p.max_over_mean}});
    // Whole periods only (one control period, 1 s, after the rotation).
    if (ended < c.rotate_at + 1 || back_under) continue;
    if (p.max_over_mean <= 1.25) {
      back_under = true;
    } else {
      ++periods_over;
    }
  }
  nlohmann::json per_move = nlohmann::json::array();
  for (size_t i = 0; i < moves.size(); ++i) {
    per_move.push_back(
        {{"pulls", in_move[i].size()},
         {"p50_ms", hetps::Percentile(in_move[i], 0.5)},
         {"p90_ms", hetps::Percentile(in_move[i], 0.9)},
         {"max_ms", hetps::Percentile(in_move[i], 1.0)},
         {"before_p50_ms", hetps::Percentile(before_move[i], 0.5)},
         {"before_p99_ms", hetps::Percentile(before_move[i], 0.99)}});
  }
  return {{"servers", c.servers},
          {"workers", c.workers},
          {"zipf", c.zipf},
          {"slow_server_speed", c.slow_speed},
          {"base_speed", c.base_speed},
          {"placement", c.migrate ? "dynamic" : "static hash"},
          {"steps_per_s", steps / (seconds - from)},
          {"pull_p50_ms", hetps::Percentile(steady, 0.5)},
          {"pull_p99_ms", hetps::Percentile(steady, 0.99)},
          {"pulls_during_moves", during.size()},
          {"pull_p50_during_moves_ms", hetps::Percentile(during, 0.5)},
          {"pull_p99_during_moves_ms", hetps::Percentile(during, 0.99)},
          {"pulls_refused_during_moves", during_refused.size()},
          {"pull_p99_during_moves_unrefused_ms",
           hetps::Percentile(during_unrefused, 0.99)},
          {"refused_pull_p50_ms", hetps::Percentile(during_refused, 0.5)},
          {"refused_pull_max_ms", hetps::Percentile(during_refused, 1.0)},
          {"pulls_before_moves", before.size()},
          {"pull_p99_before_moves_ms", hetps::Percentile(before, 0.99)},
          {"moves", moves.size()},
          {"moved_buckets", moved_buckets},
          {"moved_rows", moved_rows},
          {"moved_bytes", moved_bytes},
          {"max_over_mean_steady", hetps::Percentile(steady_balance, 0.5)},
          {"rotate_at_s", c.rotate_at},
          {"periods_over_1_25_after_rotation",
           back_under ? nlohmann::json(periods_over) : nlohmann::json()},
          {"after_rotation", after_rotation},
          {"per_move", per_move}};
}

}  // namespace

int main(int argc, char** argv) {
  hetps::TuneProcess();
  CLI::App app{"hetps live migration benchmark"};
  std::string servers_list = "2";
  std::string zipf_list = "0,1.1";
  std::string speeds_list = "0.5,1";
  double base_speed = 1;
  double rotate_at = 0;
  std::string placements = "static,dynamic";
  int workers = 4;
  uint64_t keys = 1024;
  uint64_t dim = 32;
  double seconds = 20;
  std::string out_path;
  app.add_option("--servers", servers_list, "server counts");
  app.add_option("--zipf", zipf_list,
                 "Zipf exponents of the keys (0: uniform)");
  app.add_option("--speeds", speeds_list,
                 "speeds of server 1 relative to the others (1: as fast)");
  app.add_option("--base-speed", base_speed,
                 "every server's emulated speed (below 1: servers, not the "
                 "shared cores, limit the run)")
      ->check(CLI::Range(0.001, 1.0));
  app.add_option("--workers", workers, "worker threads");
  app.add_option("--keys", keys, "keys per pull and push");
  app.add_option("--dim", dim, "row width");
  app.add_option("--seconds", seconds, "length of each run");
  app.add_option("--rotate-at", rotate_at,
                 "second of the run at which the hottest 1,000 ids take new "
                 "keys (0: never)");
  app.add_option("--placements", placements,
                 "which runs of each case, in this order (static, dynamic)");
  app.add_option("--out", out_path, "also write the JSON here");
  CLI11_PARSE(app, argc, argv);

  nlohmann::json results = nlohmann::json::array();
  for (auto servers : absl::StrSplit(servers_list, ',')) {
    for (auto zipf : absl::StrSplit(zipf_list, ',')) {
      for (auto speed : absl::StrSplit(speeds_list, ',')) {
        for (auto placement : absl::StrSplit(placements, ',')) {
          if (placement != "static" && placement != "dynamic") {
            std::fprintf(stderr, "--placements: static or dynamic, not %s\n",
                         std::string(placement).c_str());
            return 2;
          }
          const bool migrate = placement == "dynamic";
          const Case c{std::stoi(std::string(servers)),
                       workers,
                       std::stod(std::string(zipf)),
                       std::stod(std::string(speed)),
                       base_speed,
                       rotate_at,
                       migrate};
          nlohmann::json row = Run(c, keys, dim, seconds);
          std::fprintf(stderr, "%s\n", row.dump().c_str());
          if (row.contains("error")) return 1;
          results.push_back(std::move(row));
        }
      }
    }
  }
  nlohmann::json doc = {{"bench", "migration"},  {"rows", kRows},
                        {"keys_per_step", keys}, {"dim", dim},
                        {"seconds", seconds},    {"results", results}};
  std::printf("%s\n", doc.dump(2).c_str());
  if (!out_path.empty()) std::ofstream(out_path) << doc.dump(2) << "\n";
  return 0;
}
