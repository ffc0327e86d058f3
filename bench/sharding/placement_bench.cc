// Placement of sparse rows by load (issue 14), as a model in process: how
// evenly each placement spreads the servers' service time for Zipf-keyed
// requests, and what the Rebalancer's plans make of it period by period.
//
// A request is `batch` keys drawn from Zipf(s) over `rows` ids (s = 0:
// uniform), deduplicated as the client does; a server's load is the rows of
// its buckets over all requests times its cost per row (1, or 1 / speed for
// the one emulated slower server). Placements:
//   hash     today's: a key's bucket (4096) owned by bucket % servers;
//   range    ps-lite-style contiguous id ranges, ids numbered by frequency
//            (the worst case ranges meet: the hottest ids share a server);
//   dynamic  hash, then each period the Rebalancer's plan from the period's
//            access record, applied before the next (what live migration
//            will do; not built yet, so this is the plan's effect as the
//            cost model predicts it, not a measurement of moving rows).
// Throughput is the capacity bound when the servers are the bottleneck:
// work / the busiest server's load, relative to hash. After `periods`, the
// hottest 1,000 ids get new keys (the hot set rotates) and the bench counts
// the periods until max/mean is back under 1.25.
//
// build/bench/placement_bench --out docs/sharding-placement.json
#include <algorithm>
#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include "CLI/CLI.hpp"
#include "common/hash.h"
#include "common/zipf.h"
#include "hetps/config.h"
#include "hot_set.h"
#include "nlohmann/json.hpp"
#include "shard/rebalancer.h"
#include "shard/shard_map.h"

namespace hetps {
namespace {

struct Options {
  uint64_t rows = 1 << 20;
  uint64_t dim = 32;
  std::vector<uint32_t> servers = {2, 4};
  std::vector<uint32_t> batches = {64, 1024};
  std::vector<double> zipf = {0, 0.99, 1.1, 1.2};
  double slow_speed = 0.5;   // server 0's speed in the "slow" cases
  uint32_t requests = 2000;  // per period
  uint32_t periods = 8;      // before the rotation, and at most after it
  uint32_t buckets = 4096;
  uint64_t seed = 1;
  std::string out;
};

using Rng = SplitMix64;

using bench::KeyOf;

struct Period {
  std::vector<uint64_t> bucket_rows;  // by bucket
  std::vector<uint64_t> range_rows;   // by server, range placement
};

// `requests` requests of `batch` distinct keys.
Period Draw(const Options& o, const ZipfTable& zipf, uint32_t batch,
            uint32_t servers, uint64_t rotated, Rng& rng) {
  Period p;
  p.bucket_rows.assign(o.buckets, 0);
  p.range_rows.assign(servers, 0);
  std::vector<uint32_t> ids(batch);
  for (uint32_t r = 0; r < o.requests; ++r) {
    for (uint32_t& id : ids) id = zipf.Sample(rng);
    std::sort(ids.begin(), ids.end());
    const auto end = std::unique(ids.begin(), ids.end());
    for (auto it = ids.begin(); it != end; ++it) {
      ++p.bucket_rows[BucketOfKey(KeyOf(*it, rotated), o.buckets)];
      ++p.range_rows[static_cast<uint64_t>(*it) * servers / o.rows];
    }
  }
  return p;
}

std::vector<double> Loads(const ShardMap& map, const Period& p,
                          const std::vector<double>& cost) {
  std::vector<double> load(map.num_servers(), 0);
  for (uint32_t b = 0; b < map.num_buckets(); ++b) {
    load[map.owner(b)] +=
        static_cast<double>(p.bucket_rows[b]) * cost[map.owner(b)];
  }
  return load;
}

double MaxOverMean(const std::vector<double>& load) {
  double sum = 0, max = 0;
  for (double l : load) {
    sum += l;
    max = std::max(max, l);
  }
  return sum > 0 ? max * static_cast<double>(load.size()) / sum : 1;
}

double MaxOf(const std::vector<double>& load) {
  return *std::max_element(load.begin(), load.end());
}

// The servers' access record of a period under `map` (1 µs a row at full
// speed), as the coordinator builds it.
std::vector<ServerPeriod> Record(const ShardMap& map, const Period& p,
                                 const std::vector<double>& cost,
                                 uint64_t stored_bytes) {
  std::vector<ServerPeriod> out(map.num_servers());
  std::vector<uint32_t> owned(map.num_servers(), 0);
  for (ServerPeriod& s : out) {
    s.known = true;
    s.bucket_rows.assign(map.num_buckets(), 0);
  }
  for (uint32_t b = 0; b < map.num_buckets(); ++b) {
    const uint32_t s = map.owner(b);
    out[s].bucket_rows[b] = p.bucket_rows[b];
    out[s].rows_service_s += p.bucket_rows[b] * cost[s] * 1e-6;
    ++owned[s];
  }
  for (uint32_t s = 0; s < map.num_servers(); ++s) {
    out[s].stored_bytes = stored_bytes * owned[s] / map.num_buckets();
  }
  return out;
}

nlohmann::json Cell(const Options& o, uint32_t servers, uint32_t batch,
                    double s, bool slow) {
  std::vector<double> cost(servers, 1.0);
  if (slow) cost[0] = 1 / o.slow_speed;
  const ZipfTable zipf(o.rows, s);
  Rng rng(o.seed);
  // Every row stored with adagrad's state: key, weights, accumulator.
  const uint64_t stored = o.rows * (8 + 4 * 2 * o.dim);
  const ShardMap hash = ShardMap::Uniform(servers, o.buckets);
  ShardMap map = hash;
  Rebalancer rebalancer{ShardingConfig{}};
  nlohmann::json periods = nlohmann::json::array();
  uint64_t moved = 0, moved_bytes = 0;
  double hash_mm = 0, range_mm = 0, dynamic_mm = 0, hash_max = 0, range_max = 0,
         dynamic_max = 0;
  int back_under = -1;
  for (uint32_t t = 0; t < 2 * o.periods; ++t) {
    const bool rotated_now = t >= o.periods;
    const Period p = Draw(o, zipf, batch, servers, rotated_now ? 1000 : 0, rng);
    const std::vector<double> now = Loads(map, p, cost);
    std::vector<double> range(servers);
    for (uint32_t k = 0; k < servers; ++k) range[k] = p.range_rows[k] * cost[k];
    const RebalancePlan plan =
        rebalancer.Plan(map, Record(map, p, cost, stored));
    periods.push_back({{"period", t},
                       {"rotated", rotated_now},
                       {"max_over_mean", MaxOverMean(now)},
                       {"moves", plan.moves.size()},
                       {"reason", plan.reason}});
    if (t == o.periods - 1) {
      hash_mm = MaxOverMean(Loads(hash, p, cost));
      hash_max = MaxOf(Loads(hash, p, cost));
      range_mm = MaxOverMean(range);
      range_max = MaxOf(range);
      dynamic_mm = MaxOverMean(now);
      dynamic_max = MaxOf(now);
    }
    if (rotated_now && back_under < 0 && MaxOverMean(now) < 1.25) {
      back_under = static_cast<int>(t - o.periods);
    }
    std::vector<std::pair<uint32_t, uint32_t>> owners;
    for (const BucketMove& m : plan.moves) owners.emplace_back(m.bucket, m.to);
    moved += plan.moves.size();
    moved_bytes += plan.bytes;
    if (!owners.empty()) map = map.WithOwners(owners);
    if (rotated_now && back_under >= 0) break;
  }
  return {{"servers", servers},
          {"batch", batch},
          {"zipf_s", s},
          {"slow_server_speed", slow ? o.slow_speed : 1.0},
          {"hash_max_over_mean", hash_mm},
          {"range_max_over_mean", range_mm},
          {"dynamic_max_over_mean", dynamic_mm},
          {"dynamic_throughput_vs_hash", hash_max / dynamic_max},
          {"range_throughput_vs_hash", hash_max / range_max},
          {"buckets_moved", moved},
          {"bytes_moved", moved_bytes},
          {"periods_back_under_1_25_after_rotation", back_under},
          {"periods", periods}};
}

}  // namespace
}  // namespace hetps

int main(int argc, char** argv) {
  hetps::Options o;
  CLI::App app{
      "placement by load: static hash, static range and the "
      "Rebalancer's plans, by the servers' cost model"};
  app.add_option("--rows", o.rows, "ids (rows of the table)");
  app.add_option("--dim", o.dim, "floats per row (bytes moved)");
  app.add_option("--servers", o.servers, "server counts");
  app.add_option("--batches", o.batches, "keys per request");
  app.add_option("--zipf", o.zipf, "Zipf exponents (0: uniform)");
  app.add_option("--slow-speed", o.slow_speed,
                 "server 0's speed in the slow-server cases");
  app.add_option("--requests", o.requests, "requests per control period");
  app.add_option("--periods", o.periods, "periods before the rotation");
  app.add_option("--seed", o.seed, "random seed");
  app.add_option("--out", o.out, "write the JSON here too");
  CLI11_PARSE(app, argc, argv);
  nlohmann::json cells = nlohmann::json::array();
  for (uint32_t servers : o.servers) {
    for (uint32_t batch : o.batches) {
      for (double s : o.zipf) {
        for (bool slow : {false, true}) {
          nlohmann::json cell = hetps::Cell(o, servers, batch, s, slow);
          std::printf(
              "servers %u batch %4u zipf %.2f speed %.1f: max/mean hash %.3f "
              "range %.3f dynamic %.3f; dynamic %.2fx hash; %llu buckets "
              "moved; back under 1.25 after %d periods\n",
              servers, batch, s, cell["slow_server_speed"].get<double>(),
              cell["hash_max_over_mean"].get<double>(),
              cell["range_max_over_mean"].get<double>(),
              cell["dynamic_max_over_mean"].get<double>(),
              cell["dynamic_throughput_vs_hash"].get<double>(),
              static_cast<unsigned long long>(
                  cell["buckets_moved"].get<uint64_t>()),
              cell["periods_back_under_1_25_after_rotation"].get<int>());
          std::fflush(stdout);
          cells.push_back(std::move(cell));
        }
      }
    }
  }
  const nlohmann::json out = {{"bench", "placement"}, {"cells", cells}};
  std::printf("%s\n", out.dump().c_str());
  if (!o.out.empty()) std::ofstream(o.out) << out.dump(1) << "\n";
  return 0;
}
