// Coordinator: the job's membership and status authority. Runs inside server
// rank 0 (no extra process), reachable at ps_endpoints[0] (or at
// cluster.rendezvous). It composes
// units that are tested alone: Membership (the live set and its epochs),
// ChunkQueue (the train split's chunks), BatchPlanner and WindowController
// (with the signal summation in window_controller.h).
//
//  - Register checks the protocol version and the table schema a node
//    expects against the job's, and refuses a mismatch with
//    FAILED_PRECONDITION naming what differs, before any tensor moves.
//  - Rendezvous (cluster.rendezvous, no ps_endpoints): servers register
//    with their endpoint; Rendezvous answers the list once all have.
//  - Membership: a watcher thread expires silent workers; every change of
//    the live set is sent to every server (UpdateMembership), so no mode
//    waits for a gone worker, and the chunk a gone worker held goes back to
//    the queue.
//  - Barrier: blocks until every live worker reached the named barrier.
//  - NextChunk: ChunkQueue::Next.
//  - Control: a thread re-plans batches from the throughputs the workers
//    report and, every semi_async.adapt_every_s, reads the servers'
//    statistics, lets the WindowController adjust the window (semi_async;
//    sent with the live set) and the Diagnostics judge the period (every
//    mode); workers get their plan and the window in heartbeat replies.
//  - GetStatus: each worker's latest progress with its liveness, staleness
//    and chunks; each server's tables and aggregator statistics; the window
//    and its changes, and the diagnostics' warnings.
//
// Time comes from a Clock, the servers are reached through
// ParameterServerStubs: tests drive both.
//
// Thread-safety: handlers run concurrently; one mutex guards the state, and
// no RPC is made while holding it.
#pragma once

#include <grpcpp/grpcpp.h>

#include <atomic>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "common/channel.h"
#include "common/clock.h"
#include "coord/batch_planner.h"
#include "coord/chunk_queue.h"
#include "coord/diagnostics.h"
#include "coord/membership.h"
#include "coord/window_controller.h"
#include "hetps.grpc.pb.h"
#include "hetps/config.h"
#include "shard/bucket_mover.h"
#include "shard/rebalancer.h"
#include "shard/shard_map.h"

namespace hetps {

// The number of chunks the train split is cut into (train.data.chunks, or
// 16 per worker): the same on every node.
uint32_t TrainChunks(const JobConfig& config);

// The barrier a worker started by `hetps run` passes last, after its report
// (rank 0: after the final evaluation); GetStatus shows who reached it.
inline constexpr char kDoneBarrier[] = "done";
// The reason a worker gives when it leaves having trained all its chunks.
inline constexpr char kFinishedItsData[] = "finished its data";

// A server's status line from what it answered (GetTableInfo) at `endpoint`.
rpc::ServerStatus ServerStatusOf(const rpc::TableInfoResponse& info,
                                 const std::string& endpoint);

class Coordinator final : public rpc::Coordinator::Service {
 public:
  // `config` validated, with ps_endpoints filled in. `bytes_per_sample`:
  // JobShape::bytes_per_sample, what the planner caps batches by (0: no
  // memory caps). Servers are called through `servers` (default: gRPC with
  // the job's limits and credentials).
  Coordinator(const JobConfig& config, uint64_t bytes_per_sample = 0,
              Clock& clock = Clock::Real(), ParameterServerStubs servers = {});
  ~Coordinator() override;

  // Starts the liveness watcher and the control loop.
  void Start();
  // Stops both and wakes every waiting Barrier (ABORTED: the job is
  // ending).
  void Stop();

  // The data progress a checkpoint keeps (ChunkQueue::Save).
  rpc::JobProgress SaveProgress() const;
  void RestoreProgress(const rpc::JobProgress& progress);
  // The shard map of a resumed job (ResumedShardMap): where its checkpoints
  // left the buckets.
  void RestoreShardMap(const ShardMap& map);
  // What GetStatus answers: the job's window and data, every worker's
  // latest progress and every server's tables, queue and latencies (asked
  // from the servers now; without `ask_servers`, the job's part only).
  rpc::StatusResponse Status(bool ask_servers = true);

  grpc::Status Register(grpc::ServerContext* context,
                        const rpc::RegisterRequest* request,
                        rpc::RegisterResponse* response) override;
  grpc::Status Heartbeat(grpc::ServerContext* context,
                         const rpc::HeartbeatRequest* request,
                         rpc::HeartbeatResponse* response) override;
  grpc::Status Leave(grpc::ServerContext* context,
                     const rpc::LeaveRequest* request,
                     rpc::LeaveResponse* response) override;
  grpc::Status Barrier(grpc::ServerContext* context,
                       const rpc::BarrierRequest* request,
                       rpc::BarrierResponse* response) override;
  grpc::Status GetStatus(grpc::ServerContext* context,
                         const rpc::StatusRequest* request,
                         rpc::StatusResponse* response) override;
  grpc::Status GetShardMap(grpc::ServerContext* context,
                           const rpc::ShardMapRequest* request,
                           rpc::ShardMapProto* response) override;
  grpc::Status NextChunk(grpc::ServerContext* context,
                         const rpc::ChunkRequest* request,
                         rpc::ChunkResponse* response) override;
  grpc::Status Rendezvous(grpc::ServerContext* context,
                          const rpc::RendezvousRequest* request,
                          rpc::RendezvousResponse* response) override;

  std::vector<uint32_t> LiveWorkers() const;
  uint64_t epoch() const;

  // One pass of the liveness watcher at the clock's current time: expires
  // silent workers and broadcasts the change. Returns the ranks removed.
  std::vector<uint32_t> ExpireSilentWorkers();

 private:
  absl::Status CheckSchema(const rpc::RegisterRequest& request) const;
  // `rank` is out of the live set: its chunk goes back. REQUIRES: mu_.
  void Departed(uint32_t rank, const std::string& reason)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Sends the current live set and window to every server (outside mu_).
  void BroadcastMembership() ABSL_LOCKS_EXCLUDED(mu_);
  void WatchLiveness();
  void Control();
  // Every semi_async.adapt_every_s: reads the servers' statistics, adapts
  // the window (semi_async) and runs the diagnostics (outside mu_).
  void ControlPeriod() ABSL_LOCKS_EXCLUDED(mu_);
  // A server as known now: its stub is null until it registered (a
  // rendezvous job); stubs stay alive while a copy is in use.
  struct KnownServer {
    std::string endpoint;
    std::shared_ptr<rpc::ParameterServer::StubInterface> stub;
  };
  // A copy, for RPCs made outside mu_.
  std::vector<KnownServer> Servers() const ABSL_LOCKS_EXCLUDED(mu_);
  // Each server's statistics (nullopt: unreachable or not registered),
  // outside the lock.
  std::vector<std::optional<rpc::TableInfoResponse>> PollServers(
      const std::vector<KnownServer>& servers) ABSL_LOCKS_EXCLUDED(mu_);
  void Replan() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The Rebalancer's plan for the period the servers' `infos` close.
  void PlanPlacement(
      const std::vector<std::optional<rpc::TableInfoResponse>>& infos)
      ABSL_LOCKS_EXCLUDED(mu_);
  // Rank check for handlers: INVALID_ARGUMENT when out of range.
  grpc::Status CheckRank(uint32_t rank) const;
  // A server's registration (rendezvous): its endpoint, and a stub to it.
  grpc::Status RegisterServer(const rpc::RegisterRequest& request)
      ABSL_LOCKS_EXCLUDED(mu_);

  // Constant after construction.
  const JobConfig config_;
  Clock& clock_;
  const absl::Time started_;
  const ParameterServerStubs make_stub_;

  mutable absl::Mutex mu_;
  std::vector<KnownServer> servers_ ABSL_GUARDED_BY(mu_);  // by rank
  absl::CondVar changed_;  // membership, barriers or stopping_ changed
  Membership membership_ ABSL_GUARDED_BY(mu_);
  ChunkQueue chunks_ ABSL_GUARDED_BY(mu_);
  std::vector<rpc::WorkerProgress> progress_ ABSL_GUARDED_BY(mu_);
  std::vector<uint64_t> staleness_ ABSL_GUARDED_BY(mu_);  // servers' view
  // barrier name → ranks arrived
  std::map<std::string, std::set<uint32_t>> barriers_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  WindowController window_ ABSL_GUARDED_BY(mu_);
  std::vector<std::string> window_changes_ ABSL_GUARDED_BY(mu_);
  BatchPlanner planner_ ABSL_GUARDED_BY(mu_);
  Diagnostics diagnostics_ ABSL_GUARDED_BY(mu_);
  WindowSignals last_signals_;  // control thread only: counters last seen
  // Placement (control thread only): the Rebalancer and each server's
  // access record of the last period; its latest plan for status.
  Rebalancer rebalancer_;
  std::vector<rpc::AccessStats> last_access_;
  rpc::PlacementPlan placement_ ABSL_GUARDED_BY(mu_);
  // The shard map in force: the first, then each move's settled map.
  ShardMap shard_map_ ABSL_GUARDED_BY(mu_);
  // sharding.migrate: the plans carried out, one move at a time, on
  // `mover_thread_` (while `moving_`); the buckets moved so far and the
  // latest move in words.
  std::unique_ptr<BucketMover> mover_;  // control thread only
  std::thread mover_thread_;            // control thread only
  std::atomic<bool> moving_{false};
  uint32_t moved_buckets_ ABSL_GUARDED_BY(mu_) = 0;
  std::string last_move_ ABSL_GUARDED_BY(mu_);
  void CarryOut(const std::vector<BucketMove>& moves) ABSL_LOCKS_EXCLUDED(mu_);
  // `mover_`, made on first use (control thread only).
  BucketMover& Mover();
  // A shard map taken from the running servers at a restart may hold a
  // handover the previous coordinator left open, or be one some servers
  // did not adopt yet: every server adopts it and the handover is
  // finished first, on `mover_thread_` (no plan is made meanwhile:
  // `moving_`).
  void FinishOpenMoves() ABSL_LOCKS_EXCLUDED(mu_);
  static constexpr uint64_t kMoveStepBytes = 512 << 10;

  absl::Mutex broadcast_mu_;  // serialises broadcasts: epochs arrive in order
  std::thread watcher_;
  std::thread control_;
};

}  // namespace hetps
