#include "node/server_node.h"

#include <algorithm>
#include <chrono>
#include <map>
#include <optional>

#include "absl/strings/str_cat.h"
#include "common/channel.h"
#include "common/logging.h"
#include "common/proto_json.h"
#include "coord/coordinator_client.h"
#include "coord/window_controller.h"
#include "hetps/version.h"
#include "metrics/families.h"
#include "metrics/web_assets.h"
#include "nlohmann/json.hpp"

namespace hetps {
namespace {

// How long a server joining a running job waits for another server's map.
constexpr auto kPeerMapDeadline = std::chrono::seconds(2);

// The newest shard map among the servers other than `rank` that answer in
// time; none when no other server answers (a whole job starting or
// resuming: they serve only once they have a map).
std::optional<ShardMap> NewestPeerShardMap(const JobConfig& config,
                                           uint32_t rank) {
  std::optional<ShardMap> newest;
  auto stubs = GrpcParameterServerStubs(config.server.max_message_bytes,
                                        config.credentials);
  for (size_t s = 0; s < config.cluster.ps_endpoints.size(); ++s) {
    if (s == rank) continue;
    auto stub = stubs(config.cluster.ps_endpoints[s]);
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + kPeerMapDeadline);
    rpc::TableInfoRequest request;
    request.set_protocol_version(kProtocolVersion);
    rpc::TableInfoResponse info;
    if (!stub->GetTableInfo(&context, request, &info).ok()) continue;
    auto map = ShardMap::FromProto(info.shard_map());
    if (map.ok() && (!newest || map->version() > newest->version())) {
      newest = *map;
    }
  }
  return newest;
}

// The shard map a server joining the job (rank `rank`, not 0) keeps its
// rows by: the newest of the coordinator's and those of the other servers
// that answer in time. The servers adopt a move's maps before the
// coordinator hears of them, so a server restarted in the middle of a move
// learns of it from them.
absl::StatusOr<ShardMap> JoiningShardMap(const JobConfig& config,
                                         uint32_t rank) {
  auto newest = FetchShardMap(config);
  if (!newest.ok()) return newest.status();
  const std::optional<ShardMap> peers = NewestPeerShardMap(config, rank);
  if (peers && peers->version() > newest->version()) return *peers;
  return newest;
}

// The shard map server 0 (the coordinator) resumes with: where the
// checkpoints left the buckets when the whole job resumes, but the running
// job's map when it alone restarts while the others serve (moves made
// after its checkpoint are in theirs, not in its checkpoints). A handover
// the previous process left open in it is finished by the coordinator
// (Coordinator::FinishOpenMoves) before it plans anything.
absl::StatusOr<ShardMap> CoordinatorShardMap(const JobConfig& config) {
  if (std::optional<ShardMap> running = NewestPeerShardMap(config, 0)) {
    spdlog::info(
        "server 0: the other servers are running; taking their shard map "
        "(version {}, {} buckets' handover open)",
        running->version(), running->pending().size());
    return *running;
  }
  return ResumedShardMap(config.checkpoint.dir, config.num_servers(),
                         config.server.num_buckets);
}

}  // namespace

absl::StatusOr<std::unique_ptr<ServerNode>> ServerNode::Start(
    const JobConfig& config, uint32_t rank, const std::string& listen_address,
    const JobShape& shape) {
  std::unique_ptr<ServerNode> node(new ServerNode());
  auto ps = PsServer::Create(
      config, rank, InitialWindow(config, ProfiledThroughputs(config)));
  if (!ps.ok()) return ps.status();
  node->ps_ = std::move(*ps);
  node->service_ = std::make_unique<PsService>(node->ps_.get());
  grpc::ServerBuilder builder;
  ConfigureServerBuilder(builder, listen_address,
                         config.server.max_message_bytes, config.credentials,
                         &node->port_);
  builder.RegisterService(node->service_.get());
  if (rank == 0) {
    node->coordinator_ =
        std::make_unique<Coordinator>(config, shape.bytes_per_sample);
    builder.RegisterService(node->coordinator_.get());
  }
  if (!config.checkpoint.dir.empty()) {
    JobProgressHooks progress;
    if (Coordinator* c = node->coordinator_.get()) {
      progress.save = [c] { return c->SaveProgress(); };
      progress.restore = [c](const rpc::JobProgress& p) {
        c->RestoreProgress(p);
      };
    }
    node->checkpointer_ = std::make_unique<Checkpointer>(
        config, rank, node->ps_.get(), std::move(progress));
    // Server 0 (the coordinator) finds where the checkpoints left the
    // buckets, or takes the running job's map when only it restarts; the
    // others take the map from it and the servers: the running job's,
    // moves in progress included, when one restarts.
    const std::function<absl::StatusOr<ShardMap>()> job_map = [&config, rank] {
      return rank == 0 ? CoordinatorShardMap(config)
                       : JoiningShardMap(config, rank);
    };
    if (absl::Status s = node->checkpointer_->Restore(job_map); !s.ok()) {
      return absl::Status(
          s.code(),
          absl::StrCat("server ", rank, ": cannot resume: ", s.message()));
    }
    if (node->coordinator_ && config.checkpoint.resume) {
      node->coordinator_->RestoreShardMap(node->ps_->shard_map());
    }
    node->ps_->SetSaveHandler(
        [c = node->checkpointer_.get()] { return c->Save(); });
    node->ps_->SetMovedInRecorder(
        [c = node->checkpointer_.get()](const rpc::MovedRows& rows,
                                        uint64_t map_version) {
          return c->RecordMovedIn(rows, map_version);
        });
  }
  node->server_ = builder.BuildAndStart();
  if (node->server_ == nullptr || node->port_ == 0) {
    return absl::UnavailableError(absl::StrCat(
        "server ", rank, ": cannot listen on ", listen_address,
        " (address in use or not local?",
        config.credentials.ca_pem.empty() ? "" : " TLS certificate or key bad?",
        ")"));
  }
  if (absl::Status s = node->StartMetrics(config, listen_address); !s.ok()) {
    return absl::Status(s.code(),
                        absl::StrCat("server ", rank, ": ", s.message()));
  }
  if (node->coordinator_) node->coordinator_->Start();
  if (node->checkpointer_) node->checkpointer_->Start();
  if (config.checkpoint.resume && rank != 0) {
    node->membership_ =
        std::thread([n = node.get(), config] { n->FetchMembership(config); });
  }
  spdlog::info("server {} serving {} tables in {} mode{}", rank,
               config.tables.size(), ConsistencyModeName(config.mode),
               rank == 0 ? ", coordinator here" : "");
  return node;
}

absl::Status ServerNode::StartMetrics(const JobConfig& config,
                                      const std::string& listen_address) {
  if (!config.metrics.enabled) return absl::OkStatus();
  const uint32_t rank = ps_->rank();
  std::map<std::string, HttpEndpoint::Route> routes;
  PsServer* ps = ps_.get();
  Coordinator* coordinator = coordinator_.get();
  const std::string self = absl::StrCat("127.0.0.1:", port_);
  routes["/metrics"] = [ps, coordinator, self] {
    MetricFamilies families;
    AddServerFamilies(ServerStatusOf(ps->Info(), self), families);
    // The job's series only: every server exports its own.
    if (coordinator != nullptr) {
      AddJobFamilies(coordinator->Status(/*ask_servers=*/false), families);
    }
    return HttpReply{.content_type = "text/plain; version=0.0.4",
                     .body = Exposition(families)};
  };
  if (coordinator != nullptr) {
    routes["/api/status"] = [coordinator] {
      return HttpReply{.content_type = "application/json",
                       .body = ProtoToJson(coordinator->Status()).dump()};
    };
    // Prometheus' HTTP service discovery (http_sd_configs): every server's
    // /metrics.
    routes["/api/targets"] = [coordinator] {
      nlohmann::json targets = nlohmann::json::array();
      const rpc::StatusResponse status = coordinator->Status();
      for (const rpc::ServerStatus& s : status.servers()) {
        if (s.metrics_endpoint().empty()) continue;
        nlohmann::json group;
        group["targets"] = nlohmann::json::array({s.metrics_endpoint()});
        group["labels"]["hetps_server"] = std::to_string(s.rank());
        targets.push_back(std::move(group));
      }
      return HttpReply{.content_type = "application/json",
                       .body = targets.dump()};
    };
  }
  // The dashboard (web/): its page at "/", the rest by path.
  std::map<std::string, HttpEndpoint::Route> open_routes;
  if (coordinator != nullptr) {
    for (const WebAsset& asset : WebAssets()) {
      HttpEndpoint::Route serve = [asset] {
        return HttpReply{.content_type = std::string(asset.content_type),
                         .body = std::string(asset.body)};
      };
      if (asset.path == "dashboard.html") open_routes["/"] = serve;
      open_routes["/" + std::string(asset.path)] = std::move(serve);
    }
  }
  const int port = config.metrics.port == 0
                       ? 0
                       : config.metrics.port + static_cast<int>(rank);
  auto endpoint = HttpEndpoint::Start(
      config.metrics.address, port, config.credentials.token, std::move(routes),
      std::move(open_routes));
  if (!endpoint.ok()) return endpoint.status();
  metrics_ = std::move(*endpoint);
  // Others reach a wildcard address at the host of the gRPC endpoint.
  std::string host = config.metrics.address;
  if (host == "0.0.0.0" || host == "::" || host == "[::]") {
    host = listen_address.substr(0, listen_address.rfind(':'));
    if (host == "0.0.0.0" || host == "[::]" || host.empty()) host = "127.0.0.1";
  }
  const std::string endpoint_name = absl::StrCat(host, ":", metrics_->port());
  ps_->SetMetricsEndpoint(endpoint_name);
  if (coordinator != nullptr) {
    spdlog::info(
        "server {}: metrics on http://{}/metrics (the job's too), dashboard "
        "on http://{}/",
        rank, endpoint_name, endpoint_name);
  } else {
    spdlog::info("server {}: metrics on http://{}/metrics", rank,
                 endpoint_name);
  }
  return absl::OkStatus();
}

ServerNode::~ServerNode() { Shutdown(absl::Seconds(2)); }

void ServerNode::Shutdown(absl::Duration grace) {
  if (shut_down_) return;
  shut_down_ = true;
  // Wake barriers first so that their handlers can finish.
  if (coordinator_) coordinator_->Stop();
  if (checkpointer_) checkpointer_->Stop();
  if (membership_.joinable()) membership_.join();
  if (service_) service_->CloseStreams();
  if (server_) {
    server_->Shutdown(absl::ToChronoTime(Clock::Real().WallNow() + grace));
    server_->Wait();
  }
}

void ServerNode::FetchMembership(const JobConfig& config) {
  auto status =
      QueryStatus(config.coordinator_address(),
                  config.client.connect_deadline_s, config.credentials);
  if (!status.ok()) {
    spdlog::warn(
        "server {}: no live set from the coordinator ({}); all "
        "workers count as live until the next change",
        ps_->rank(), status.status().message());
    return;
  }
  std::vector<uint32_t> live;
  for (const rpc::WorkerStatus& w : status->workers()) {
    if (w.live()) live.push_back(w.rank());
  }
  rpc::MembershipUpdate update;
  update.set_protocol_version(kProtocolVersion);
  update.set_epoch(status->epoch());
  update.set_window(static_cast<uint32_t>(std::max(0, status->window())));
  for (uint32_t w : live) update.add_live_workers(w);
  rpc::MembershipAck ack;
  ps_->UpdateMembership(nullptr, &update, &ack);
}

}  // namespace hetps
