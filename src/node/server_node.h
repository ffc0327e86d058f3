// ServerNode: one running server process — the ParameterServer service of
// its rank, the Coordinator on rank 0, the Checkpointer, behind one gRPC
// endpoint. It sits above server/ and coord/, which do not know each other:
// it gives the PsServer the coordinator's initial window and the
// Checkpointer the coordinator's data progress.
#pragma once

#include <grpcpp/grpcpp.h>

#include <memory>
#include <string>
#include <thread>

#include "absl/status/statusor.h"
#include "coord/coordinator.h"
#include "hetps/config.h"
#include "metrics/http_endpoint.h"
#include "model/job_shape.h"
#include "server/checkpoint.h"
#include "server/ps_server.h"
#include "server/ps_service.h"

namespace hetps {

class ServerNode {
 public:
  // Builds rank `rank`'s tables and listens on `listen_address`
  // ("host:port"; port 0 picks a free one). `config` is validated and has
  // cluster.ps_endpoints filled in (the coordinator needs them).
  // UNAVAILABLE when the address cannot be bound. With checkpoint.resume
  // the tables (and rank 0's data progress) come from the newest checkpoint
  // that verifies; its error when none does (docs/CHECKPOINTS.md).
  // `shape` (ResolveJob) sizes the planner's memory caps; the default caps
  // nothing.
  static absl::StatusOr<std::unique_ptr<ServerNode>> Start(
      const JobConfig& config, uint32_t rank, const std::string& listen_address,
      const JobShape& shape = {});
  ~ServerNode();

  int port() const { return port_; }
  // The port of /metrics (metrics.enabled); 0 when it serves none.
  int metrics_port() const { return metrics_ ? metrics_->port() : 0; }
  PsServer& ps() { return *ps_; }
  Coordinator* coordinator() { return coordinator_.get(); }

  // Stops accepting calls, lets running ones finish until `grace` passes,
  // then cancels the rest. Idempotent.
  void Shutdown(absl::Duration grace);

 private:
  ServerNode() = default;

  // A restarted server learns which workers are still live (and the
  // semi_async window) from the coordinator once it serves.
  void FetchMembership(const JobConfig& config);
  // Serves /metrics (and on rank 0 the job's JSON for the dashboard and
  // Prometheus' service discovery) per config.metrics.
  absl::Status StartMetrics(const JobConfig& config,
                            const std::string& listen_address);

  std::unique_ptr<PsServer> ps_;
  std::unique_ptr<PsService> service_;  // gRPC's face of ps_
  std::unique_ptr<Coordinator> coordinator_;
  std::unique_ptr<Checkpointer> checkpointer_;  // null without checkpoint.dir
  std::unique_ptr<grpc::Server> server_;
  std::unique_ptr<HttpEndpoint> metrics_;  // null when metrics are off
  std::thread membership_;
  int port_ = 0;
  bool shut_down_ = false;
};

}  // namespace hetps
