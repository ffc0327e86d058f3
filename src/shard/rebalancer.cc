#include "shard/rebalancer.h"

#include <algorithm>
#include <numeric>

#include "absl/strings/str_format.h"

namespace hetps {
namespace {

double MaxOverMean(const std::vector<double>& load) {
  const double sum = std::accumulate(load.begin(), load.end(), 0.0);
  if (sum <= 0) return 1;
  return *std::max_element(load.begin(), load.end()) /
         (sum / static_cast<double>(load.size()));
}

// Per bucket: rows touched and service ns, totals since the start.
void AddTotals(const rpc::AccessStats& a, int sign,
               std::vector<int64_t>& rows, std::vector<int64_t>& service_ns,
               int64_t& total_ns) {
  for (int i = 0; i < a.buckets_size(); ++i) {
    const uint32_t b = a.buckets(i);
    if (b >= rows.size()) continue;
    rows[b] += sign * static_cast<int64_t>(a.pulled_rows(i) + a.pushed_rows(i));
    if (i < a.service_ns_size()) {
      service_ns[b] += sign * static_cast<int64_t>(a.service_ns(i));
      total_ns += sign * static_cast<int64_t>(a.service_ns(i));
    }
  }
}

}  // namespace

ServerPeriod AccessPeriod(const rpc::AccessStats& now,
                          const rpc::AccessStats& before, uint32_t num_buckets,
                          uint64_t stored_bytes) {
  std::vector<int64_t> rows(num_buckets, 0), service_ns(num_buckets, 0);
  int64_t rows_ns = 0;
  AddTotals(now, 1, rows, service_ns, rows_ns);
  AddTotals(before, -1, rows, service_ns, rows_ns);
  ServerPeriod period;
  period.known = true;
  period.bucket_rows.resize(num_buckets);
  for (uint32_t b = 0; b < num_buckets; ++b) {
    period.bucket_rows[b] = static_cast<uint64_t>(std::max<int64_t>(0, rows[b]));
  }
  period.rows_service_s = std::max<int64_t>(0, rows_ns) * 1e-9;
  period.other_service_s = std::max(
      0.0, (now.service_s() - before.service_s()) - period.rows_service_s);
  period.stored_bytes = stored_bytes;
  return period;
}

bool Rebalancer::Held(const ShardMap& map, uint32_t bucket) const {
  const Planned& p = planned_[bucket];
  return p.period > 0 && period_ - p.period <= config_.hold_periods &&
         map.owner(bucket) == p.to;
}

RebalancePlan Rebalancer::Plan(const ShardMap& map,
                               const std::vector<ServerPeriod>& servers) {
  ++period_;
  const uint32_t n = map.num_servers();
  const uint32_t buckets = map.num_buckets();
  planned_.resize(buckets);
  RebalancePlan plan;
  if (n < 2) {
    plan.reason = "one server";
    return plan;
  }
  if (servers.size() != n) {
    plan.reason = absl::StrFormat("%d of %d servers reported", servers.size(),
                                  n);
    return plan;
  }
  // Each server's cost per row; one without rows this period is charged the
  // mean cost of the others.
  std::vector<double> cost(n, 0);
  double known_service = 0;
  uint64_t known_rows = 0;
  std::vector<uint64_t> rows(n, 0);
  for (uint32_t s = 0; s < n; ++s) {
    if (!servers[s].known || servers[s].bucket_rows.size() != buckets) {
      plan.reason = absl::StrFormat("server %d has no load record", s);
      return plan;
    }
    for (uint32_t b = 0; b < buckets; ++b) {
      if (map.owner(b) == s) rows[s] += servers[s].bucket_rows[b];
    }
    if (rows[s] > 0) {
      cost[s] = servers[s].rows_service_s / static_cast<double>(rows[s]);
      known_service += servers[s].rows_service_s;
      known_rows += rows[s];
    }
  }
  if (known_rows == 0) {
    plan.reason = "no rows served";
    return plan;
  }
  const double mean_cost = known_service / static_cast<double>(known_rows);
  for (uint32_t s = 0; s < n; ++s) {
    if (rows[s] == 0) cost[s] = mean_cost;
  }
  std::vector<uint32_t> owner(buckets);
  std::vector<uint32_t> owned(n, 0);
  std::vector<uint64_t> bucket_rows(buckets, 0);
  std::vector<double> load(n, 0);
  for (uint32_t b = 0; b < buckets; ++b) {
    owner[b] = map.owner(b);
    ++owned[owner[b]];
    bucket_rows[b] = servers[owner[b]].bucket_rows[b];
  }
  for (uint32_t s = 0; s < n; ++s) {
    load[s] = static_cast<double>(rows[s]) * cost[s] +
              servers[s].other_service_s;
  }
  const double mean =
      std::accumulate(load.begin(), load.end(), 0.0) / static_cast<double>(n);
  plan.before = plan.after = MaxOverMean(load);
  if (plan.before <= config_.trigger) {
    periods_over_ = 0;
    plan.reason = absl::StrFormat("balanced: max/mean %.2f <= %.2f",
                                  plan.before, config_.trigger);
    return plan;
  }
  if (++periods_over_ < kPeriodsOver) {
    plan.reason = absl::StrFormat(
        "max/mean %.2f > %.2f in %d period (moves after %d in a row)",
        plan.before, config_.trigger, periods_over_, kPeriodsOver);
    return plan;
  }
  const uint64_t cap =
      static_cast<uint64_t>(config_.max_moved_mb * 1024 * 1024);
  auto bytes_of = [&](uint32_t b) {
    const uint32_t s = map.owner(b);
    return owned[s] == 0 ? 0 : servers[s].stored_bytes / owned[s];
  };
  while (true) {
    const uint32_t from = static_cast<uint32_t>(
        std::max_element(load.begin(), load.end()) - load.begin());
    const uint32_t to = static_cast<uint32_t>(
        std::min_element(load.begin(), load.end()) - load.begin());
    // The bucket whose move lowers the larger of the pair's loads the most.
    int64_t best = -1;
    double best_max = load[from];
    double heaviest = 0;
    int64_t heaviest_bucket = -1;
    bool capped = false;
    for (uint32_t b = 0; b < buckets; ++b) {
      if (owner[b] != from || bucket_rows[b] == 0) continue;
      const double here = static_cast<double>(bucket_rows[b]) * cost[from];
      if (here > heaviest) {
        heaviest = here;
        heaviest_bucket = b;
      }
      if (Held(map, b) || planned_[b].period == period_) continue;
      if (plan.bytes + bytes_of(b) > cap) {
        capped = true;
        continue;
      }
      const double there = static_cast<double>(bucket_rows[b]) * cost[to];
      const double pair_max = std::max(load[from] - here, load[to] + there);
      if (pair_max < best_max) {
        best_max = pair_max;
        best = b;
      }
    }
    if (best < 0) {
      if (heaviest > mean) {
        plan.reason = absl::StrFormat(
            "bucket %d alone is %.2fx the mean server load (its hot rows: "
            "client.hot_rows)",
            heaviest_bucket, heaviest / mean);
      } else if (capped) {
        plan.reason = absl::StrFormat("byte cap (sharding.max_moved_mb %.0f)",
                                      config_.max_moved_mb);
      } else {
        plan.reason = "no move lowers the largest load further";
      }
      break;
    }
    const uint32_t b = static_cast<uint32_t>(best);
    const double here = static_cast<double>(bucket_rows[b]) * cost[from];
    const double there = static_cast<double>(bucket_rows[b]) * cost[to];
    load[from] -= here;
    load[to] += there;
    owner[b] = to;
    planned_[b] = Planned{.period = period_, .to = to};
    plan.moves.push_back(
        BucketMove{.bucket = b, .from = from, .to = to, .bytes = bytes_of(b)});
    plan.bytes += bytes_of(b);
    plan.after = MaxOverMean(load);
    if (plan.after <= config_.target) {
      plan.reason = absl::StrFormat("max/mean %.2f -> %.2f in %d moves",
                                    plan.before, plan.after,
                                    plan.moves.size());
      break;
    }
  }
  if (plan.before - plan.after < config_.min_gain) {
    plan.reason = absl::StrFormat(
        "%d moves would only make max/mean %.2f of %.2f (sharding.min_gain "
        "%.2f): %s",
        plan.moves.size(), plan.after, plan.before, config_.min_gain,
        plan.reason);
    plan.moves.clear();
    plan.bytes = 0;
    plan.after = plan.before;
  }
  return plan;
}

}  // namespace hetps
