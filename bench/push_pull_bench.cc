// Raw push/pull through the whole stack: `hetps server` processes on
// 127.0.0.1 and worker threads (one PsClient each) in this process.
//
//   push_pull_bench [--topologies 1x1,2x2] [--keys 10000,100000,1000000]
//                   [--dims 1,16] [--reps 20] [--new-order]
//                   [--out results.json]
//
// For every servers×workers topology, key count and row width: each worker
// pushes (sgd, async mode) and pulls its own N distinct keys `reps` times,
// all workers at once; the JSON reports the median and p90 per request and
// the aggregate keys/s (workers × N / median). Rows exist before timing.
// With --new-order each rep's push and pull ask for the keys in another
// order (a rotation; they repeat after as many reps as keys), as a training
// step's batch would: without it the same request comes again, and a
// server finds the keys grouped as it left them (SparseTable's KeyPlan).
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
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "cli/process_group.h"
#include "cli/roles.h"
#include "common/process_tuning.h"
#include "common/median.h"
#include "common/ports.h"
#include "hetps/ps_client.h"
#include "nlohmann/json.hpp"
#include "server_processes.h"

namespace {

using Clock = std::chrono::steady_clock;

struct Timing {
  std::vector<double> push_ms, pull_ms;
};


}  // namespace

int main(int argc, char** argv) {
  hetps::TuneProcess();
  CLI::App app{"hetps push/pull benchmark"};
  std::string topologies = "1x1,2x2";
  std::string keys_list = "10000,100000,1000000";
  std::string dims_list = "1,16";
  int reps = 20;
  std::string out_path;
  app.add_option("--topologies", topologies,
                 "servers x workers, comma-separated");
  app.add_option("--keys", keys_list, "distinct keys per request");
  app.add_option("--dims", dims_list, "row widths");
  app.add_option("--reps", reps, "timed requests per case");
  bool new_order = false;
  app.add_flag("--new-order", new_order,
               "each rep's keys in an order no earlier rep used");
  app.add_option("--out", out_path, "also write the JSON here");
  CLI11_PARSE(app, argc, argv);

  std::vector<uint64_t> key_counts, dims;
  for (auto s : absl::StrSplit(keys_list, ','))
    key_counts.push_back(std::stoull(std::string(s)));
  for (auto s : absl::StrSplit(dims_list, ','))
    dims.push_back(std::stoull(std::string(s)));

  nlohmann::json results = nlohmann::json::array();
  for (auto topo : absl::StrSplit(topologies, ',')) {
    std::vector<std::string> parts = absl::StrSplit(topo, 'x');
    const int servers = std::stoi(parts.at(0));
    const int workers = std::stoi(parts.at(1));
    auto ports = hetps::PickFreePorts("127.0.0.1", servers);
    if (!ports.ok()) {
      std::fprintf(stderr, "%s\n", ports.status().ToString().c_str());
      return 1;
    }
    std::vector<std::string> endpoints;
    for (int port : *ports)
      endpoints.push_back(absl::StrCat("127.0.0.1:", port));

    std::string yaml = absl::StrCat(
        "name: bench\nmode: async\nlog_level: warn\ntrain: {model: "
        "none}\ncluster:\n  workers: ",
        workers, "\n  ps_endpoints: [", absl::StrJoin(endpoints, ", "),
        "]\ntables:\n");
    for (uint64_t dim : dims) {
      absl::StrAppend(&yaml, "  - {name: d", dim, ", kind: sparse, dim: ", dim,
                      ", optimizer: {type: sgd, learning_rate: 0.01}}\n");
    }
    const std::string config_path =
        absl::StrCat("/tmp/hetps-bench-", getpid(), ".yaml");
    std::ofstream(config_path) << yaml;

    std::atomic<int> listening{0};
    hetps::ProcessGroup group([&](const std::string&, const std::string& line) {
      if (line.rfind(hetps::kListeningPrefix, 0) == 0) ++listening;
    });
    if (auto s = hetps::bench::StartServers(group, HETPS_BINARY, config_path,
                                            servers, listening);
        !s.ok()) {
      std::fprintf(stderr, "%s\n", s.status().ToString().c_str());
      return 1;
    }

    std::vector<std::unique_ptr<hetps::PsClient>> clients;
    for (int w = 0; w < workers; ++w) {
      hetps::PsClientOptions options;
      options.endpoints = endpoints;
      options.worker_id = w;
      options.push_to_all_servers = false;
      auto client = hetps::PsClient::Connect(options);
      if (!client.ok()) {
        std::fprintf(stderr, "%s\n", client.status().ToString().c_str());
        return 1;
      }
      clients.push_back(std::move(*client));
    }

    for (uint64_t n : key_counts) {
      for (uint64_t dim : dims) {
        const std::string table = absl::StrCat("d", dim);
        std::vector<Timing> timing(workers);
        std::barrier sync(workers);
        std::vector<std::thread> threads;
        for (int w = 0; w < workers; ++w) {
          threads.emplace_back([&, w] {
            std::mt19937_64 rng(1000 + w);
            std::vector<uint64_t> keys(n);
            for (auto& k : keys) k = rng();
            std::vector<float> grads(n * dim, 0.001f), rows(n * dim);
            const hetps::TableGrad grad[] = {{table, keys, grads}};
            // Warm-up: create the rows, open the connections.
            (void)clients[w]->Push(grad, 1, hetps::KeySet::kUnique);
            (void)clients[w]->PullSparse(table, keys, rows,
                                         hetps::KeySet::kUnique);
            for (int r = 0; r < reps; ++r) {
              if (new_order) {
                std::rotate(keys.begin(), keys.begin() + (7919 % n),
                            keys.end());
              }
              sync.arrive_and_wait();
              auto t0 = Clock::now();
              auto s = clients[w]->Push(grad, 1, hetps::KeySet::kUnique);
              auto t1 = Clock::now();
              sync.arrive_and_wait();
              auto t2 = Clock::now();
              auto p = clients[w]->PullSparse(table, keys, rows,
                                              hetps::KeySet::kUnique);
              auto t3 = Clock::now();
              if (!s.ok() || !p.ok()) {
                std::fprintf(stderr, "%s %s\n", s.ToString().c_str(),
                             p.ToString().c_str());
                std::exit(1);
              }
              timing[w].push_ms.push_back(
                  std::chrono::duration<double, std::milli>(t1 - t0).count());
              timing[w].pull_ms.push_back(
                  std::chrono::duration<double, std::milli>(t3 - t2).count());
            }
          });
        }
        for (auto& t : threads) t.join();
        for (const char* op : {"push", "pull"}) {
          std::vector<double> all;
          for (const Timing& t : timing) {
            const auto& v = std::string(op) == "push" ? t.push_ms : t.pull_ms;
            all.insert(all.end(), v.begin(), v.end());
          }
          const double median = hetps::Percentile(all, 0.5);
          nlohmann::json row = {
              {"servers", servers},
              {"workers", workers},
              {"keys", n},
              {"dim", dim},
              {"op", op},
              {"new_order", new_order},
              {"median_ms", median},
              {"p90_ms", hetps::Percentile(all, 0.9)},
              {"keys_per_s", workers * n / (median / 1000.0)}};
          std::fprintf(stderr,
                       "%dx%d keys=%-8llu dim=%-3llu %s median %.3f ms\n",
                       servers, workers, static_cast<unsigned long long>(n),
                       static_cast<unsigned long long>(dim), op, median);
          results.push_back(row);
        }
      }
    }
    clients.clear();
    group.StopAll(absl::Seconds(5));
    std::remove(config_path.c_str());
  }
  nlohmann::json doc = {
      {"benchmark", "push_pull"}, {"reps", reps}, {"results", results}};
  std::printf("%s\n", doc.dump(2).c_str());
  if (!out_path.empty()) std::ofstream(out_path) << doc.dump(2) << "\n";
  return 0;
}
