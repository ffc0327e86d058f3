// A worker's side of the coordinator: registration (retried with back-off
// until the coordinator is up, within client.connect_deadline_s), a heartbeat
// thread carrying the worker's progress, its plan and the window back,
// chunks, barriers and leaving. And QueryStatus, for `hetps status` and the
// launcher.
//
// Thread-safety: all methods may be called from any thread.
#pragma once

#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "common/channel.h"
#include "common/clock.h"
#include "hetps.grpc.pb.h"
#include "hetps/config.h"
#include "nlohmann/json.hpp"
#include "shard/shard_map.h"

namespace hetps {

class CoordinatorClient {
 public:
  // The coordinator at config.coordinator_address(), over `stubs` (default:
  // gRPC with the job's limits and credentials); waits and back-off on `clock`.
  CoordinatorClient(const JobConfig& config, uint32_t rank,
                    Clock& clock = Clock::Real(), CoordinatorStubs stubs = {});
  ~CoordinatorClient();

  // Registers with the job's table schema; UNAVAILABLE naming the endpoint
  // when the coordinator stays unreachable, FAILED_PRECONDITION on a
  // version or schema mismatch.
  absl::StatusOr<rpc::RegisterResponse> Register();
  // Starts heartbeating every client.heartbeat_interval_s with the progress
  // last given to ReportProgress.
  void StartHeartbeats();
  void ReportProgress(const rpc::WorkerProgress& progress);
  // The latest plan from the coordinator (version 0 until the first reply).
  rpc::BatchPlan plan() const;
  // Sends one heartbeat now (the first plan arrives before training). With
  // `until_answered`, again while the coordinator is unreachable (a link
  // that just came back), within client.connect_deadline_s.
  absl::Status HeartbeatNow(bool until_answered = false);
  // Whether a heartbeat answered, since the last Register, that this worker
  // is not in the live set: the coordinator dropped it (it was silent for
  // longer than server.heartbeat_timeout_s) and it has to Register again.
  bool dropped() const;
  // The next chunk of the train split (`done` when there is none left);
  // `finished_samples` were trained from the chunk held until now. Asked
  // again while the coordinator is unavailable (client.connect_deadline_s).
  // One caller at a time.
  absl::StatusOr<rpc::ChunkResponse> NextChunk(uint64_t finished_samples);
  // Waits until every live worker reached barrier `name`. Asked again while
  // the coordinator is unavailable, as NextChunk; ABORTED when it shuts
  // down for good.
  absl::Status Barrier(const std::string& name);
  // Stops heartbeats and leaves the live set (asked again as Barrier).
  absl::Status Leave(const std::string& reason);

 private:
  void StopHeartbeats();

  const JobConfig config_;
  const uint32_t rank_;
  Clock& clock_;
  const std::unique_ptr<rpc::Coordinator::StubInterface> stub_;
  mutable absl::Mutex mu_;
  absl::CondVar stop_cv_;
  rpc::WorkerProgress progress_ ABSL_GUARDED_BY(mu_);
  rpc::BatchPlan plan_ ABSL_GUARDED_BY(mu_);
  // The membership epoch of the last registration: a reply to a heartbeat
  // sent before it (an older epoch) does not say anything about it.
  uint64_t registered_epoch_ ABSL_GUARDED_BY(mu_) = 0;
  bool dropped_ ABSL_GUARDED_BY(mu_) = false;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::thread heartbeat_;
  // Chunks NextChunk has returned (its caller's only).
  uint64_t chunks_received_ = 0;
};

// cluster.rendezvous: server `rank` (> 0) tells the coordinator where it
// listens; retried while the coordinator is unreachable (within
// client.connect_deadline_s), then UNAVAILABLE naming the rendezvous.
absl::Status RegisterServerAtRendezvous(const JobConfig& config, uint32_t rank,
                                        const std::string& endpoint,
                                        CoordinatorStubs stubs = {},
                                        Clock& clock = Clock::Real());
// cluster.rendezvous: every server's endpoint, by rank, once all registered;
// retried meanwhile (the error names the rendezvous and who is missing).
absl::StatusOr<std::vector<std::string>> ServersAtRendezvous(
    const JobConfig& config, CoordinatorStubs stubs = {},
    Clock& clock = Clock::Real());

// The job's shard map now (Coordinator.GetShardMap), retried while the
// coordinator is unavailable (client.connect_deadline_s).
absl::StatusOr<ShardMap> FetchShardMap(const JobConfig& config,
                                       CoordinatorStubs stubs = {},
                                       Clock& clock = Clock::Real());

// Reads the status of a running job from its coordinator, connecting with
// the job's `credentials`.
absl::StatusOr<rpc::StatusResponse> QueryStatus(const std::string& endpoint,
                                                double timeout_s,
                                                const Credentials& credentials);

// The status as JSON (`hetps status --json`, the Python module's
// get_ps_status): every field of rpc::StatusResponse by its proto name
// (ProtoToJson), each worker's progress and each server's aggregator
// statistics lifted into the worker's or server's own object, values
// derived for reading (compression_ratio, table_rows, cpu_fraction), and
// the job at a glance under the names of SPEC §6: window_size,
// worker_throughput (samples/s of each live worker, by rank),
// grad_queue_length (pushes queued on all servers), max_staleness; and of
// SPEC §4's placement: each server's `load` (rows pulled and pushed, bytes,
// buckets served, seconds spent serving, its share of all rows and of all
// service time), server_load_max_over_mean (of the service time), and the
// ten hottest keys of all servers (hot_keys).
nlohmann::json StatusToJson(const rpc::StatusResponse& status);

}  // namespace hetps
