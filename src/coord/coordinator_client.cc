#include "coord/coordinator_client.h"

#include <algorithm>
#include <functional>

#include "absl/strings/str_cat.h"
#include "common/logging.h"
#include "common/proto_json.h"
#include "common/status.h"
#include "config/table_schema.h"
#include "hetps/version.h"
#include "shard/access_stats.h"

namespace hetps {
namespace {

// The job's coordinator, through `stubs` (unset: gRPC with the job's
// message limit and credentials).
std::unique_ptr<rpc::Coordinator::StubInterface> CoordinatorStub(
    const JobConfig& config, const CoordinatorStubs& stubs) {
  return (stubs ? stubs
                : GrpcCoordinatorStubs(config.server.max_message_bytes,
                                       config.credentials))(
      config.coordinator_address());
}

}  // namespace

CoordinatorClient::CoordinatorClient(const JobConfig& config, uint32_t rank,
                                     Clock& clock, CoordinatorStubs stubs)
    : config_(config),
      rank_(rank),
      clock_(clock),
      stub_(CoordinatorStub(config, stubs)) {}

CoordinatorClient::~CoordinatorClient() { StopHeartbeats(); }

void CoordinatorClient::StopHeartbeats() {
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
    stop_cv_.SignalAll();
  }
  if (heartbeat_.joinable()) heartbeat_.join();
}

namespace {

// Calls `call` until it answers anything but UNAVAILABLE, with back-off,
// for at most client.connect_deadline_s; then UNAVAILABLE naming the
// coordinator, what it stayed (`state`) and the last error.
grpc::Status CallUntilAvailable(const JobConfig& config, Clock& clock,
                                const std::function<grpc::Status()>& call,
                                const char* state = "unreachable") {
  const absl::Time start = clock.Now();
  const absl::Duration limit = absl::Seconds(config.client.connect_deadline_s);
  absl::Duration backoff = absl::Seconds(config.client.initial_backoff_s);
  while (true) {
    grpc::Status st = call();
    if (st.error_code() != grpc::StatusCode::UNAVAILABLE) return st;
    const absl::Duration waited = clock.Now() - start;
    if (waited >= limit) {
      return grpc::Status(
          grpc::StatusCode::UNAVAILABLE,
          absl::StrCat("coordinator at ", config.coordinator_address(), " ",
                       state, " for ", absl::FormatDuration(waited),
                       " (client.connect_deadline_s = ",
                       config.client.connect_deadline_s,
                       "); last error: ", st.error_message()));
    }
    clock.SleepFor(std::min(backoff, limit - waited));
    backoff = std::min(backoff * 2, absl::Seconds(config.client.max_backoff_s));
  }
}

rpc::RegisterRequest RegisterRequestOf(const JobConfig& config, rpc::Role role,
                                       uint32_t rank) {
  rpc::RegisterRequest request;
  request.set_protocol_version(kProtocolVersion);
  request.set_role(role);
  request.set_rank(rank);
  for (const TableConfig& t : config.tables) {
    ToSchemaProto(t, request.add_tables());
  }
  return request;
}

}  // namespace

absl::StatusOr<rpc::RegisterResponse> CoordinatorClient::Register() {
  const rpc::RegisterRequest request =
      RegisterRequestOf(config_, rpc::ROLE_WORKER, rank_);
  rpc::RegisterResponse response;
  grpc::Status st = CallUntilAvailable(config_, clock_, [&] {
    grpc::ClientContext ctx;
    ctx.set_deadline(RpcDeadline(clock_, config_.client.rpc_timeout_s));
    return stub_->Register(&ctx, request, &response);
  });
  if (!st.ok()) return FromGrpcStatus(st);
  absl::MutexLock lock(&mu_);
  registered_epoch_ = response.epoch();
  dropped_ = false;
  return response;
}

absl::Status RegisterServerAtRendezvous(const JobConfig& config, uint32_t rank,
                                        const std::string& endpoint,
                                        CoordinatorStubs stubs, Clock& clock) {
  auto stub = CoordinatorStub(config, stubs);
  rpc::RegisterRequest request =
      RegisterRequestOf(config, rpc::ROLE_SERVER, rank);
  request.set_endpoint(endpoint);
  grpc::Status st = CallUntilAvailable(config, clock, [&] {
    grpc::ClientContext ctx;
    ctx.set_deadline(RpcDeadline(clock, config.client.rpc_timeout_s));
    rpc::RegisterResponse response;
    return stub->Register(&ctx, request, &response);
  });
  return FromGrpcStatus(st);
}

absl::StatusOr<ShardMap> FetchShardMap(const JobConfig& config,
                                       CoordinatorStubs stubs, Clock& clock) {
  auto stub = CoordinatorStub(config, stubs);
  rpc::ShardMapRequest request;
  request.set_protocol_version(kProtocolVersion);
  rpc::ShardMapProto response;
  grpc::Status st = CallUntilAvailable(config, clock, [&] {
    grpc::ClientContext ctx;
    ctx.set_deadline(RpcDeadline(clock, config.client.rpc_timeout_s));
    // Server 0 may still be starting: wait for it to listen.
    ctx.set_wait_for_ready(true);
    return stub->GetShardMap(&ctx, request, &response);
  });
  if (!st.ok()) {
    return absl::Status(static_cast<absl::StatusCode>(st.error_code()),
                        absl::StrCat("shard map from the coordinator at ",
                                     config.coordinator_address(), ": ",
                                     st.error_message()));
  }
  return ShardMap::FromProto(response);
}

absl::StatusOr<std::vector<std::string>> ServersAtRendezvous(
    const JobConfig& config, CoordinatorStubs stubs, Clock& clock) {
  auto stub = CoordinatorStub(config, stubs);
  rpc::RendezvousRequest request;
  request.set_protocol_version(kProtocolVersion);
  rpc::RendezvousResponse response;
  grpc::Status st = CallUntilAvailable(
      config, clock,
      [&] {
        grpc::ClientContext ctx;
        ctx.set_deadline(RpcDeadline(clock, config.client.rpc_timeout_s));
        return stub->Rendezvous(&ctx, request, &response);
      },
      "unreachable or without every server");
  if (!st.ok()) return FromGrpcStatus(st);
  return std::vector<std::string>(response.ps_endpoints().begin(),
                                  response.ps_endpoints().end());
}

void CoordinatorClient::ReportProgress(const rpc::WorkerProgress& progress) {
  absl::MutexLock lock(&mu_);
  progress_ = progress;
}

rpc::BatchPlan CoordinatorClient::plan() const {
  absl::MutexLock lock(&mu_);
  return plan_;
}

absl::Status CoordinatorClient::HeartbeatNow(bool until_answered) {
  rpc::HeartbeatRequest request;
  request.set_protocol_version(kProtocolVersion);
  request.set_role(rpc::ROLE_WORKER);
  request.set_rank(rank_);
  {
    absl::MutexLock lock(&mu_);
    *request.mutable_progress() = progress_;
  }
  rpc::HeartbeatResponse response;
  const auto beat = [&] {
    grpc::ClientContext ctx;
    ctx.set_deadline(
        RpcDeadline(clock_, config_.client.heartbeat_interval_s * 2));
    grpc::Status st = stub_->Heartbeat(&ctx, request, &response);
    // A reply that does not come in time counts as no reply: asked again.
    if (st.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED) {
      return grpc::Status(grpc::StatusCode::UNAVAILABLE, st.error_message());
    }
    return st;
  };
  grpc::Status st =
      until_answered ? CallUntilAvailable(config_, clock_, beat) : beat();
  if (!st.ok()) return FromGrpcStatus(st);
  absl::MutexLock lock(&mu_);
  if (response.plan().version() != plan_.version()) plan_ = response.plan();
  if (!response.live() && response.epoch() > registered_epoch_) {
    dropped_ = true;
  }
  return absl::OkStatus();
}

bool CoordinatorClient::dropped() const {
  absl::MutexLock lock(&mu_);
  return dropped_;
}

absl::StatusOr<rpc::ChunkResponse> CoordinatorClient::NextChunk(
    uint64_t finished_samples) {
  rpc::ChunkRequest request;
  request.set_protocol_version(kProtocolVersion);
  request.set_rank(rank_);
  request.set_finished_samples(finished_samples);
  request.set_chunks_received(chunks_received_);
  rpc::ChunkResponse response;
  // Asked again when the connection breaks (a coordinator killed while the
  // call was on the wire, then restarted): the coordinator tells a lost
  // reply by chunks_received and answers it again.
  grpc::Status st = CallUntilAvailable(config_, clock_, [&] {
    grpc::ClientContext ctx;
    ctx.set_deadline(RpcDeadline(clock_, config_.client.rpc_timeout_s));
    ctx.set_wait_for_ready(true);
    return stub_->NextChunk(&ctx, request, &response);
  });
  if (!st.ok()) return FromGrpcStatus(st);
  if (!response.done()) ++chunks_received_;
  return response;
}

void CoordinatorClient::StartHeartbeats() {
  heartbeat_ = std::thread([this] {
    const absl::Duration interval =
        absl::Seconds(config_.client.heartbeat_interval_s);
    absl::MutexLock lock(&mu_);
    while (!stop_) {
      const absl::Time next = clock_.Now() + interval;
      while (!stop_ && !clock_.WaitUntil(stop_cv_, mu_, next)) {
      }
      if (stop_) break;
      mu_.Unlock();
      if (absl::Status s = HeartbeatNow(); !s.ok()) {
        spdlog::debug("heartbeat failed: {}", s.message());
      }
      mu_.Lock();
    }
  });
}

absl::Status CoordinatorClient::Barrier(const std::string& name) {
  rpc::BarrierRequest request;
  request.set_protocol_version(kProtocolVersion);
  request.set_name(name);
  request.set_rank(rank_);
  rpc::BarrierResponse response;
  // Asked again when the connection breaks (a coordinator killed while a
  // worker waits here, then restarted): arriving twice counts once, and a
  // restarted coordinator waits for the live workers that have not left.
  return FromGrpcStatus(CallUntilAvailable(config_, clock_, [&] {
    grpc::ClientContext ctx;
    ctx.set_deadline(RpcDeadline(clock_, config_.client.rpc_timeout_s));
    return stub_->Barrier(&ctx, request, &response);
  }));
}

absl::Status CoordinatorClient::Leave(const std::string& reason) {
  StopHeartbeats();
  rpc::LeaveRequest request;
  request.set_protocol_version(kProtocolVersion);
  request.set_rank(rank_);
  request.set_reason(reason);
  rpc::LeaveResponse response;
  // Asked again as Barrier; leaving twice changes nothing.
  return FromGrpcStatus(CallUntilAvailable(config_, clock_, [&] {
    grpc::ClientContext ctx;
    ctx.set_deadline(RpcDeadline(clock_, config_.client.rpc_timeout_s));
    return stub_->Leave(&ctx, request, &response);
  }));
}

absl::StatusOr<rpc::StatusResponse> QueryStatus(
    const std::string& endpoint, double timeout_s,
    const Credentials& credentials) {
  auto stub =
      rpc::Coordinator::NewStub(MakeChannel(endpoint, 64 << 20, credentials));
  grpc::ClientContext ctx;
  ctx.set_deadline(RpcDeadline(Clock::Real(), timeout_s));
  ctx.set_wait_for_ready(true);
  rpc::StatusRequest request;
  request.set_protocol_version(kProtocolVersion);
  rpc::StatusResponse response;
  grpc::Status st = stub->GetStatus(&ctx, request, &response);
  if (!st.ok()) {
    return absl::Status(
        static_cast<absl::StatusCode>(st.error_code()),
        absl::StrCat("coordinator at ", endpoint, ": ", st.error_message()));
  }
  return response;
}

namespace {
constexpr size_t kHotKeysShown = 10;
}  // namespace

nlohmann::json StatusToJson(const rpc::StatusResponse& status) {
  nlohmann::json j = ProtoToJson(status);
  nlohmann::json throughput = nlohmann::json::object();
  uint64_t max_staleness = 0;
  for (nlohmann::json& w : j["workers"]) {
    w.update(w["progress"]);
    w.erase("progress");
    const double sent = w["sent_bytes"].get<double>();
    w["compression_ratio"] =
        sent > 0 ? w["raw_bytes"].get<double>() / sent : 1.0;
    if (w["live"].get<bool>()) {
      throughput[std::to_string(w["rank"].get<uint32_t>())] =
          w["samples_per_s"];
      max_staleness = std::max(max_staleness, w["staleness"].get<uint64_t>());
    }
  }
  // Each server's share of the rows its requests touched and of the time
  // it spent serving them (its load), and the hottest keys (the raw
  // per-bucket totals stay in the proto).
  double total_rows = 0, total_service = 0, max_service = 0;
  std::vector<AccessTotals> totals_of;
  std::vector<const rpc::AccessStats*> access;
  for (const rpc::ServerStatus& s : status.servers()) {
    totals_of.push_back(SumAccess(s.access()));
    total_rows += totals_of.back().rows();
    total_service += s.access().service_s();
    max_service = std::max(max_service, s.access().service_s());
    access.push_back(&s.access());
  }
  uint64_t queued = 0;
  for (int i = 0; i < status.servers_size(); ++i) {
    nlohmann::json& s = j["servers"][i];
    const rpc::AccessStats& a = status.servers(i).access();
    const AccessTotals& totals = totals_of[i];
    s["load"] = {{"pulled_rows", totals.pulled_rows},
                 {"pushed_rows", totals.pushed_rows},
                 {"bytes", totals.bytes},
                 {"buckets", totals.buckets},
                 {"service_s", a.service_s()},
                 {"share", total_rows > 0 ? totals.rows() / total_rows : 0.0},
                 {"service_share",
                  total_service > 0 ? a.service_s() / total_service : 0.0}};
    s.erase("access");
    nlohmann::json rows = nlohmann::json::object();
    for (const nlohmann::json& t : s["tables"]) {
      rows[t["schema"]["name"].get<std::string>()] = t["rows"];
    }
    s["table_rows"] = std::move(rows);
    s.update(s["stats"]);
    s.erase("stats");
    queued += s["queue_length"].get<uint64_t>();
    const double elapsed = status.elapsed_s();
    s["cpu_fraction"] = elapsed > 0 ? s["cpu_s"].get<double>() / elapsed : 0.0;
  }
  j["window_size"] = status.window();
  j["worker_throughput"] = std::move(throughput);
  j["grad_queue_length"] = queued;
  j["max_staleness"] = max_staleness;
  // Of the service time: what a slower or busier server feels.
  j["server_load_max_over_mean"] =
      total_service > 0 ? max_service * status.servers_size() / total_service
                        : 0.0;
  j["hot_keys"] = nlohmann::json::array();
  for (const ServerHotKey& k : HottestKeys(access, kHotKeysShown)) {
    nlohmann::json key = ProtoToJson(k.key);
    key["server"] = status.servers(k.server).rank();
    j["hot_keys"].push_back(std::move(key));
  }
  return j;
}

}  // namespace hetps
