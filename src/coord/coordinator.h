// Coordinator: the job's membership and status authority. Runs inside server
// rank 0 (no extra process), reachable at ps_endpoints[0].
//
//  - Register checks the protocol version and the table schema a node
//    expects against the job's, and refuses a mismatch with
//    FAILED_PRECONDITION naming what differs, before any tensor moves.
//  - Membership: every worker of the job starts live. A worker leaves the
//    live set when it says so (Leave, e.g. when its data is done) or when no
//    heartbeat arrived for server.heartbeat_timeout_s (a worker that never
//    registered gets client.connect_deadline_s on top). Each change bumps the
//    epoch and is sent to every server, so no mode waits for a gone worker.
//  - Barrier: blocks until every live worker reached the named barrier.
//  - Data: the train split is cut into chunks (train.data.chunks); NextChunk
//    hands them out in order, epoch after epoch, to whichever worker asks,
//    so faster workers train on more of them. The job's last 2 × workers
//    chunks are handed out in quarters, so the job does not wait at the end
//    for a slow worker's whole chunk. A worker holds its chunk until it asks
//    for the next; one that dies with a chunk gives it back to the queue
//    (the part it already trained is trained again).
//  - Control (semi_async and planned batches): a thread reads the servers'
//    queue statistics every semi_async.adapt_every_s, lets the
//    WindowController adjust the window (sent to the servers with the live
//    set) and the BatchPlanner re-plan from the throughputs the workers
//    report; workers get their plan and the window in heartbeat replies.
//  - GetStatus: workers' progress, throughput, plan, clock and staleness,
//    servers' queues, CPU and tables, the window and its changes.
//
// Thread-safety: handlers run concurrently; one mutex guards the state, and
// no RPC is made while holding it.
#pragma once

#include <grpcpp/grpcpp.h>

#include <atomic>
#include <condition_variable>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "coord/batch_planner.h"
#include "coord/window_controller.h"
#include "hetps.grpc.pb.h"
#include "hetps/config.h"
#include "shard/shard_map.h"

namespace hetps {

// The number of chunks the train split is cut into (train.data.chunks, or
// 16 per worker): the same on every node.
uint32_t TrainChunks(const JobConfig& config);

class Coordinator final : public rpc::Coordinator::Service {
 public:
  // `config` validated, with ps_endpoints filled in. `bytes_per_sample`:
  // JobShape::bytes_per_sample, what the planner caps batches by (0: no
  // memory caps).
  explicit Coordinator(const JobConfig& config, uint64_t bytes_per_sample = 0);
  ~Coordinator() override;

  // Starts the liveness watcher.
  void Start();
  // Stops the watcher and wakes every waiting Barrier (UNAVAILABLE).
  void Stop();

  // The data progress a checkpoint keeps (rpc::JobProgress): chunks held by
  // workers count as not handed out, so a resumed job trains them again.
  rpc::JobProgress SaveProgress() const;
  void RestoreProgress(const rpc::JobProgress& progress);

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
  grpc::Status NextChunk(grpc::ServerContext* context,
                         const rpc::ChunkRequest* request,
                         rpc::ChunkResponse* response) override;

  std::vector<uint32_t> LiveWorkers() const;
  uint64_t epoch() const;

 private:
  struct WorkerState {
    bool live = true;
    bool registered = false;
    uint32_t incarnation = 0;  // registrations so far
    absl::Time last_seen;
    uint64_t step = 0;
    uint64_t samples = 0;
    double samples_per_s = 0;
    std::string left_reason;
    uint64_t clock = 0;
    uint32_t batch_size = 0;
    uint32_t push_freq = 0;
    double busy_fraction = 0;
    double compute_samples_per_s = 0;
    double memory_mb = 0;
    bool emulated = false;
    uint64_t chunks_done = 0;
    // The chunk it is training (handed out, not yet followed by another
    // request): back to the queue if the worker dies.
    std::optional<rpc::ChunkResponse> lease;
    uint64_t staleness = 0;  // from the servers' last statistics
    uint64_t raw_bytes = 0;
    uint64_t sent_bytes = 0;
    std::string codec;
    std::string codec_reason;
  };

  absl::Status CheckSchema(const rpc::RegisterRequest& request) const;
  // Marks `rank` gone; returns true if it was live. REQUIRES: mu_ held.
  bool RemoveWorker(uint32_t rank, const std::string& reason)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Sends the current live set and window to every server (outside the
  // lock).
  void BroadcastMembership();
  void WatchLiveness();
  // The control loop: window adaptation and batch planning.
  void Control();
  // Each server's statistics (nullopt: unreachable), outside the lock.
  std::vector<std::optional<rpc::TableInfoResponse>> PollServers();
  void Replan() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // Constant after construction.
  const JobConfig config_;
  const ShardMap shard_map_;
  const absl::Time started_;
  std::vector<std::unique_ptr<rpc::ParameterServer::Stub>> servers_;

  mutable std::mutex mu_;
  std::condition_variable changed_;
  uint64_t epoch_ ABSL_GUARDED_BY(mu_) = 1;
  std::vector<WorkerState> workers_ ABSL_GUARDED_BY(mu_);
  // barrier name → ranks arrived
  std::map<std::string, std::set<uint32_t>> barriers_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  const uint32_t chunks_;
  uint64_t chunks_given_ ABSL_GUARDED_BY(mu_) = 0;  // over all epochs
  // Chunks to hand out before the next new one: quarters of the job's last
  // chunks and chunks given back by dead workers.
  std::deque<rpc::ChunkResponse> tail_ ABSL_GUARDED_BY(mu_);
  uint64_t finished_chunks_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t finished_samples_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t requeued_chunks_ ABSL_GUARDED_BY(mu_) = 0;
  WindowController window_ ABSL_GUARDED_BY(mu_);
  std::vector<std::string> window_changes_ ABSL_GUARDED_BY(mu_);
  BatchPlanner planner_ ABSL_GUARDED_BY(mu_);
  WindowSignals last_signals_;  // control thread only: counters last seen

  std::mutex broadcast_mu_;  // serialises broadcasts so epochs arrive in order
  std::thread watcher_;
  std::thread control_;
};

// A worker's side of the coordinator: registration (retried until the
// coordinator is up, within client.connect_deadline_s), a heartbeat thread,
// barriers and leaving.
class CoordinatorClient {
 public:
  CoordinatorClient(const JobConfig& config, uint32_t rank);
  ~CoordinatorClient();

  // Registers with the job's table schema; UNAVAILABLE naming the endpoint
  // when the coordinator stays unreachable, FAILED_PRECONDITION on a
  // version or schema mismatch.
  absl::StatusOr<rpc::RegisterResponse> Register();
  // Starts heartbeating every client.heartbeat_interval_s with the progress
  // last given to ReportProgress.
  void StartHeartbeats();
  struct Progress {
    uint64_t step = 0;
    uint64_t samples = 0;
    double samples_per_s = 0;
    uint64_t clock = 0;
    uint32_t batch_size = 0;
    uint32_t push_freq = 0;
    double busy_fraction = 0;
    double compute_samples_per_s = 0;
    bool emulated = false;
    double memory_mb = 0;
    uint64_t raw_bytes = 0;
    uint64_t sent_bytes = 0;
    std::string codec;
    std::string codec_reason;
  };
  void ReportProgress(const Progress& progress);
  // The latest plan from the coordinator (version 0 until the first reply).
  rpc::BatchPlan plan() const;
  // Sends one heartbeat now (the first plan arrives before training).
  absl::Status HeartbeatNow();
  // The next chunk of the train split (`done` when there is none left);
  // `finished_samples` were trained from the chunk held until now.
  absl::StatusOr<rpc::ChunkResponse> NextChunk(uint64_t finished_samples);
  absl::Status Barrier(const std::string& name);
  // Stops heartbeats and leaves the live set.
  absl::Status Leave(const std::string& reason);

 private:
  const JobConfig config_;
  const uint32_t rank_;
  std::unique_ptr<rpc::Coordinator::Stub> stub_;
  mutable std::mutex mu_;
  Progress progress_;    // guarded by mu_
  rpc::BatchPlan plan_;  // guarded by mu_
  std::condition_variable stop_cv_;
  bool stop_ = false;  // guarded by mu_
  std::thread heartbeat_;
};

// Reads the status of a running job from its coordinator, connecting with
// the job's `credentials`.
absl::StatusOr<rpc::StatusResponse> QueryStatus(const std::string& endpoint,
                                                double timeout_s,
                                                const Credentials& credentials);

}  // namespace hetps
