// BucketMover: moves buckets between the servers of a running job, while
// workers pull and push, losing no update and applying none twice in any
// mode (docs/ARCHITECTURE.md, "Live bucket migration"). One move, in the
// calls of the ParameterServer service:
//   1. PrepareMove(hold) on every server: each reports the newest clock of
//      every worker it has seen and holds its requests past it. In sync
//      and semi_async, not before every live worker has sent a request
//      (UNAVAILABLE until then): a worker the cut does not name is past it
//      at once, and its first reads would wait at the new owner for rows
//      that move only once the others, waiting for it (its pushes; its
//      clock within the window), pass the cut.
//   2. The cut: per worker, one clock past the newest any server saw, and
//      as many more as the fastest worker starts while the hold lasts
//      (HoldAhead: then a request is seldom held) (in
//      sync and semi_async, the newest of those for all: a round is never
//      split, and no worker's cut lies beyond the window of one waiting at
//      a new owner); the map's next version hands each bucket over at the
//      cut.
//      AdoptShardMap on every server: requests before the cut go to the
//      old owner, from it to the new owner, which answers pushes at once
//      and applies them when the rows arrive, and holds reads until then
//      (the old owner serves them until it gives the rows up, as the mode
//      allows); a request split by the older map past the cut is refused
//      ("moved"), the client re-splits it.
//   3. PrepareMove(report) until every live worker has been seen past its
//      cut: its requests before the cut are done (a PsClient starts a
//      clock's requests after the last clock's are answered).
//   4. HandOver on each old owner (after its queued gradients are applied;
//      in sync, after the rounds before the cut): a copy of the rows, which
//      it goes on reading from; TakeOver on the new owners, which install
//      them, apply the pushes kept for them, and serve reads of them.
//   5. AdoptShardMap(settled) on the new owners that give none of the
//      buckets up themselves: the clients learn the settled map from
//      their answers, and ask them for the rows.
//   6. Once every live worker has split a request by the settled map (or
//      after learn_timeout): HandOver(give_up) on each old owner: reads of
//      the buckets are refused there from now on (a client that still
//      splits by an older map asks the new owner). After 5 and the wait,
//      so that few clients do.
//   7. AdoptShardMap(settled) on every server: the old owners drop the
//      rows, and a new owner restarted since 5 takes it again.
//   A read waits at a new owner only between 2 and 4, and only one its old
//   owner refused (in sync past the cut, in semi_async a window past it).
// Moves run one at a time (Move is serialized). Calls that fail for a
// while (UNAVAILABLE, DEADLINE_EXCEEDED) are made again; a failure that
// lasts leaves the handover as far as it got and says where.
//
// Thread-safety: thread-safe.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/channel.h"
#include "hetps.grpc.pb.h"
#include "hetps/config.h"
#include "shard/shard_map.h"

namespace hetps {

struct MoveReport {
  size_t buckets = 0;                   // buckets moved
  uint64_t rows = 0;                    // rows handed over, all tables
  uint64_t bytes = 0;                   // their weights, state and keys
  std::shared_ptr<const ShardMap> map;  // the settled map
  uint32_t hold_ahead = 0;  // clocks the cut lay past the newest seen
  absl::Duration wait;  // from the handover until the workers passed it
  // Then the copies (HandOver, TakeOver), the give-ups and the settled map.
  absl::Duration transfer;
  // From the settled map at the new owners until every live worker had
  // split a request by it (at most the mover's learn_timeout).
  absl::Duration learn;
  // From the handover until every new owner had the rows: at most what a
  // read refused by its old owner waited at a new owner.
  absl::Duration held;
  absl::Duration total;
};

// How many clocks past the newest seen a move's cut goes (hold_ahead):
// those the fastest worker (`clocks_per_s`) starts while a hold lasts,
// rounded up, at most kMaxHoldAhead; 0 when that is under a tenth of a
// clock. A hold is taken to last as long as the median of the last
// `holds` (the lower middle of an even count; none: 0 s), so that one slow
// hold (a connection made, a stall) does not move the next cuts far ahead.
uint32_t HoldAheadClocks(double clocks_per_s,
                         std::span<const absl::Duration> holds);

class BucketMover {
 public:
  // `endpoints`: the servers, by rank. Calls time out after `rpc_timeout`;
  // the wait for the workers to pass the cut gives up after `pass_timeout`
  // (the move fails); the wait for them to learn the settled map ends
  // after `learn_timeout` and the move goes on (that wait only spares
  // reads split by an older map a refusal).
  BucketMover(std::vector<std::string> endpoints, ConsistencyMode mode,
              ParameterServerStubs stubs,
              absl::Duration rpc_timeout = absl::Seconds(30),
              absl::Duration pass_timeout = absl::Seconds(120),
              absl::Duration learn_timeout = absl::Milliseconds(250));

  // Moves each (bucket, server); moves to a bucket's owner are skipped.
  // INVALID_ARGUMENT for a bucket or server out of range, FAILED_PRECONDITION
  // for a bucket whose earlier move is unfinished, the failing call's error
  // (naming the server) otherwise.
  absl::StatusOr<MoveReport> Move(
      const std::vector<std::pair<uint32_t, uint32_t>>& moves);

  // Has every server adopt `map` (the newest of the servers' maps; one
  // adopted by some only, when a Move's mover stopped between two of its
  // adoptions), then carries out steps 3-7 for every handover it holds
  // open: those of a Move whose mover stopped before the end — server 0,
  // the coordinator, restarted in the middle of one. Each worker must be
  // past the latest cut any of them names. Errors as Move's.
  absl::StatusOr<MoveReport> FinishOpen(const ShardMap& map);

  // Ends a Move waiting for the workers (CANCELLED; the handover stays
  // open), and every later one: the job is shutting down.
  void Cancel() { cancelled_ = true; }

 private:
  struct Server {
    std::string endpoint;
    std::unique_ptr<rpc::ParameterServer::StubInterface> stub;
  };
  // PrepareMove on every server; with `hold`, holding requests from
  // `ahead` clocks past the newest seen. Notes the workers' clocks
  // (Observe).
  absl::StatusOr<std::vector<rpc::PrepareMoveResponse>> Prepare(
      bool hold, uint32_t ahead = 0) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Notes the newest clock of each worker in `seen` and, from the last
  // note at least kPaceInterval before, the fastest worker's pace.
  void Observe(const std::vector<rpc::PrepareMoveResponse>& seen)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // How many clocks past the newest seen the cut goes (hold_ahead):
  // HoldAheadClocks of the workers' pace and the last moves' holds (from
  // PrepareMove(hold) until the handover map is in force). A request held
  // waits for that whole time; a cut further ahead costs no request
  // anything, but the move waits that many more clocks of the workers.
  uint32_t HoldAhead() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // AdoptShardMap(map) on the servers `on` marks (every server when `on`
  // is empty), in rank order.
  absl::Status Adopt(const ShardMap& map, const std::vector<bool>& on = {})
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Steps 3-7 for `buckets`, handed over by `handover` at `cut`; `began`
  // and `report` carry the move's start and what it counted so far.
  absl::StatusOr<MoveReport> Complete(const ShardMap& handover,
                                      const std::vector<uint32_t>& buckets,
                                      const ShardMap::Cut& cut,
                                      absl::Time began, MoveReport report)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // HandOver of `buckets` on server `source`: a copy of their rows into
  // `rows`, or (give_up) the old owner's refusal of them from then on.
  absl::Status HandOver(uint32_t source, const std::vector<uint32_t>& buckets,
                        bool give_up, rpc::MovedRows* rows)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status ServerError(uint32_t server, const char* call,
                           const grpc::Status& status) const;
  // `call` with a fresh deadline, waiting for a server that is not
  // reachable yet (wait_for_ready: one restarting), made again after
  // UNAVAILABLE or DEADLINE_EXCEEDED (back-off from 10 ms, doubling to
  // 500 ms) for up to rpc_timeout: every call of a move is safe to repeat
  // (HandOver answers a repeat with the same rows, or gives up again;
  // TakeOver does not install rows that arrived already).
  grpc::Status Retried(
      const std::function<grpc::Status(grpc::ClientContext*)>& call) const;
  std::unique_ptr<grpc::ClientContext> Context() const;

  const ConsistencyMode mode_;
  const absl::Duration rpc_timeout_;
  const absl::Duration pass_timeout_;
  const absl::Duration learn_timeout_;
  std::atomic<bool> cancelled_{false};
  absl::Mutex mu_;  // one move at a time
  std::vector<Server> servers_ ABSL_GUARDED_BY(mu_);
  // The workers' pace: the newest clock of each (Observe), when it was
  // noted, the fastest worker's clocks per second, and how long the last
  // kHoldsKept moves' holds lasted, oldest first.
  static constexpr absl::Duration kPaceInterval = absl::Milliseconds(5);
  static constexpr size_t kHoldsKept = 5;
  ShardMap::Cut observed_ ABSL_GUARDED_BY(mu_);
  absl::Time observed_at_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
  double clocks_per_s_ ABSL_GUARDED_BY(mu_) = 0;
  std::vector<absl::Duration> holds_ ABSL_GUARDED_BY(mu_);
  // Whether a PrepareMove has answered on every server: until then a
  // move's hold would include making the connections.
  bool connected_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace hetps
