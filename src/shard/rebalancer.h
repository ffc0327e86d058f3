// Rebalancer: which buckets of the ShardMap to move so that the servers'
// measured *service time* evens out (SPEC §4). Rows per server are already
// even under hashing; time is not when the servers differ (an old machine, a
// busy neighbour) or when a few buckets hold the hot rows.
//
// The model, from one control period of the servers' access record
// (AccessStats): bucket b touched r_b rows; server s spent S_s seconds on
// the R_s rows its buckets were touched for, so a row costs it
// c_s = S_s / R_s. Bucket b on server t would cost r_b · c_t, and a server's
// load is the sum over its buckets. The plan moves buckets from the most to
// the least loaded server, each time the one that lowers the larger of the
// two the most, until max/mean load is at `target`, no move helps, or the
// next would pass the period's byte cap. Hysteresis: nothing moves until
// max/mean is above `trigger` in two periods in a row (one period's
// service times are noisy: on a balanced job here single periods reached
// 1.14), a bucket that moved as planned in the
// last `hold_periods` periods stays where it is (one whose move was not
// made is free: a plan nobody carried out holds nothing), and a plan that
// lowers max/mean by less than `min_gain` moves nothing.
//
// Pure: no clocks, no I/O; the coordinator's control loop feeds it.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "hetps/config.h"
#include "shard/shard_map.h"

namespace hetps {

// What one server did in a control period.
struct ServerPeriod {
  bool known = false;                 // false: not polled this period
  std::vector<uint64_t> bucket_rows;  // rows touched, indexed by bucket
  double rows_service_s = 0;          // the service time of those rows
  double other_service_s = 0;  // what does not move with buckets (dense)
  uint64_t stored_bytes = 0;   // its sparse rows with their state
};

struct BucketMove {
  uint32_t bucket = 0;
  uint32_t from = 0;
  uint32_t to = 0;
  uint64_t bytes = 0;  // estimated: the bucket's share of `from`'s rows
};

struct RebalancePlan {
  std::vector<BucketMove> moves;
  double before = 1;  // predicted max/mean service time without the moves
  double after = 1;   // ... and with them
  uint64_t bytes = 0;
  // Why the plan is what it is: "balanced", "hot bucket 17 alone is 1.4×
  // the mean", "byte cap", ...
  std::string reason;
};

// One server's period from two of its access records (`before` empty at
// the first period): rows and service time per bucket are differences;
// `stored_bytes` is what its sparse rows take now.
ServerPeriod AccessPeriod(const rpc::AccessStats& now,
                          const rpc::AccessStats& before, uint32_t num_buckets,
                          uint64_t stored_bytes);

class Rebalancer {
 public:
  explicit Rebalancer(const ShardingConfig& config) : config_(config) {}

  // Plans this period's moves on `map` from `servers` (one per rank). A
  // period without a load on every server (one not polled, no rows) plans
  // nothing. Records the planned buckets for the hold.
  RebalancePlan Plan(const ShardMap& map,
                     const std::vector<ServerPeriod>& servers);

 private:
  // Whether `bucket` moved to where a recent plan sent it.
  bool Held(const ShardMap& map, uint32_t bucket) const;

  static constexpr int kPeriodsOver = 2;

  const ShardingConfig config_;
  uint64_t period_ = 0;
  int periods_over_ = 0;  // periods in a row above the trigger
  struct Planned {
    uint64_t period = 0;  // 0: never planned
    uint32_t to = 0;
  };
  std::vector<Planned> planned_;  // by bucket: its latest planned move
};

}  // namespace hetps
