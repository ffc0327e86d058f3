#include "coord/coordinator.h"

#include <chrono>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/channel.h"
#include "common/logging.h"
#include "common/status.h"
#include "hetps/version.h"
#include "server/ps_server.h"

namespace hetps {
namespace {

const char* KindName(rpc::TableKind kind) {
  return kind == rpc::TABLE_KIND_SPARSE ? "sparse" : "dense";
}

std::chrono::system_clock::time_point DeadlineIn(double seconds) {
  return std::chrono::system_clock::now() +
         std::chrono::milliseconds(static_cast<int64_t>(seconds * 1000));
}

}  // namespace

Coordinator::Coordinator(const JobConfig& config)
    : config_(config),
      shard_map_(
          ShardMap::Uniform(config.num_servers(), config.server.num_buckets)),
      started_(absl::Now()) {
  for (const std::string& endpoint : config_.cluster.ps_endpoints) {
    servers_.push_back(rpc::ParameterServer::NewStub(
        MakeChannel(endpoint, config_.server.max_message_bytes)));
  }
  workers_.resize(config_.num_workers());
  for (WorkerState& w : workers_) w.last_seen = started_;
}

Coordinator::~Coordinator() { Stop(); }

void Coordinator::Start() {
  watcher_ = std::thread([this] { WatchLiveness(); });
}

void Coordinator::Stop() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  changed_.notify_all();
  if (watcher_.joinable()) watcher_.join();
}

std::vector<uint32_t> Coordinator::LiveWorkers() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<uint32_t> live;
  for (uint32_t r = 0; r < workers_.size(); ++r) {
    if (workers_[r].live) live.push_back(r);
  }
  return live;
}

uint64_t Coordinator::epoch() const {
  std::lock_guard<std::mutex> lock(mu_);
  return epoch_;
}

absl::Status Coordinator::CheckSchema(
    const rpc::RegisterRequest& request) const {
  for (const rpc::TableSchema& theirs : request.tables()) {
    const TableConfig* ours = nullptr;
    for (const TableConfig& t : config_.tables) {
      if (t.name == theirs.name()) ours = &t;
    }
    if (ours == nullptr) {
      return absl::FailedPreconditionError(
          absl::StrCat("table schema mismatch: table '", theirs.name(),
                       "' is not part of this job"));
    }
    rpc::TableSchema expected;
    ToSchemaProto(*ours, &expected);
    if (expected.kind() != theirs.kind() || expected.dim() != theirs.dim() ||
        expected.optimizer() != theirs.optimizer()) {
      return absl::FailedPreconditionError(absl::StrCat(
          "table schema mismatch for '", theirs.name(), "': job has ",
          KindName(expected.kind()), " dim ", expected.dim(), " optimizer ",
          expected.optimizer(), ", node has ", KindName(theirs.kind()), " dim ",
          theirs.dim(), " optimizer ", theirs.optimizer()));
    }
  }
  if (request.tables_size() != static_cast<int>(config_.tables.size())) {
    return absl::FailedPreconditionError(absl::StrCat(
        "table schema mismatch: node declares ", request.tables_size(),
        " tables, the job has ", config_.tables.size()));
  }
  return absl::OkStatus();
}

grpc::Status Coordinator::Register(grpc::ServerContext*,
                                   const rpc::RegisterRequest* request,
                                   rpc::RegisterResponse* response) {
  if (auto s = CheckProtocolVersion(request->protocol_version(), "register");
      !s.ok()) {
    spdlog::warn("refused registration of rank {}: {}", request->rank(),
                 std::string(s.message()));
    return ToGrpcStatus(s);
  }
  if (auto s = CheckSchema(*request); !s.ok()) {
    spdlog::warn("refused registration of rank {}: {}", request->rank(),
                 std::string(s.message()));
    return ToGrpcStatus(s);
  }
  bool rejoined = false;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (request->role() == rpc::ROLE_WORKER) {
      if (request->rank() >= workers_.size()) {
        return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                            absl::StrCat("worker rank ", request->rank(),
                                         " out of range: the job has ",
                                         workers_.size(), " workers"));
      }
      WorkerState& w = workers_[request->rank()];
      w.registered = true;
      w.last_seen = absl::Now();
      if (!w.live) {
        w.live = true;
        w.left_reason.clear();
        ++epoch_;
        rejoined = true;
      }
      spdlog::info("worker {} registered{}", request->rank(),
                   rejoined ? " (rejoined the live set)" : "");
    }
    response->set_epoch(epoch_);
  }
  if (rejoined) BroadcastMembership();
  for (const std::string& e : config_.cluster.ps_endpoints) {
    response->add_ps_endpoints(e);
  }
  shard_map_.ToProto(response->mutable_shard_map());
  response->set_num_workers(config_.num_workers());
  response->set_mode(ConsistencyModeName(config_.mode));
  changed_.notify_all();
  return grpc::Status::OK;
}

grpc::Status Coordinator::Heartbeat(grpc::ServerContext*,
                                    const rpc::HeartbeatRequest* request,
                                    rpc::HeartbeatResponse* response) {
  if (auto s = CheckProtocolVersion(request->protocol_version(), "heartbeat");
      !s.ok()) {
    return ToGrpcStatus(s);
  }
  std::lock_guard<std::mutex> lock(mu_);
  if (request->role() == rpc::ROLE_WORKER) {
    if (request->rank() >= workers_.size()) {
      return grpc::Status(
          grpc::StatusCode::INVALID_ARGUMENT,
          absl::StrCat("worker rank ", request->rank(), " out of range"));
    }
    WorkerState& w = workers_[request->rank()];
    w.last_seen = absl::Now();
    w.step = request->step();
    w.samples = request->samples();
    w.samples_per_s = request->samples_per_s();
  }
  response->set_epoch(epoch_);
  return grpc::Status::OK;
}

bool Coordinator::RemoveWorker(uint32_t rank, const std::string& reason) {
  WorkerState& w = workers_[rank];
  if (!w.live) return false;
  w.live = false;
  w.left_reason = reason;
  ++epoch_;
  spdlog::info("worker {} left the live set (epoch {}): {}", rank, epoch_,
               reason);
  return true;
}

grpc::Status Coordinator::Leave(grpc::ServerContext*,
                                const rpc::LeaveRequest* request,
                                rpc::LeaveResponse* response) {
  if (auto s = CheckProtocolVersion(request->protocol_version(), "leave");
      !s.ok()) {
    return ToGrpcStatus(s);
  }
  bool changed;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (request->rank() >= workers_.size()) {
      return grpc::Status(
          grpc::StatusCode::INVALID_ARGUMENT,
          absl::StrCat("worker rank ", request->rank(), " out of range"));
    }
    changed = RemoveWorker(request->rank(), request->reason());
    response->set_epoch(epoch_);
  }
  changed_.notify_all();
  if (changed) BroadcastMembership();
  return grpc::Status::OK;
}

grpc::Status Coordinator::Barrier(grpc::ServerContext* context,
                                  const rpc::BarrierRequest* request,
                                  rpc::BarrierResponse* response) {
  if (auto s = CheckProtocolVersion(request->protocol_version(), "barrier");
      !s.ok()) {
    return ToGrpcStatus(s);
  }
  std::unique_lock<std::mutex> lock(mu_);
  if (request->rank() >= workers_.size()) {
    return grpc::Status(
        grpc::StatusCode::INVALID_ARGUMENT,
        absl::StrCat("worker rank ", request->rank(), " out of range"));
  }
  std::set<uint32_t>& arrived = barriers_[request->name()];
  arrived.insert(request->rank());
  changed_.notify_all();
  const auto all_arrived = [&] {
    for (uint32_t r = 0; r < workers_.size(); ++r) {
      if (workers_[r].live && !arrived.contains(r)) return false;
    }
    return true;
  };
  while (!all_arrived()) {
    if (stopping_) {
      return grpc::Status(grpc::StatusCode::UNAVAILABLE,
                          "coordinator shutting down");
    }
    if (context->IsCancelled()) {
      return grpc::Status(grpc::StatusCode::CANCELLED, "barrier cancelled");
    }
    changed_.wait_for(lock, std::chrono::milliseconds(100));
  }
  response->set_epoch(epoch_);
  return grpc::Status::OK;
}

grpc::Status Coordinator::GetStatus(grpc::ServerContext*,
                                    const rpc::StatusRequest* request,
                                    rpc::StatusResponse* response) {
  if (auto s = CheckProtocolVersion(request->protocol_version(), "status");
      !s.ok()) {
    return ToGrpcStatus(s);
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    response->set_epoch(epoch_);
    response->set_mode(ConsistencyModeName(config_.mode));
    response->set_window(config_.window);
    const absl::Time now = absl::Now();
    for (uint32_t r = 0; r < workers_.size(); ++r) {
      const WorkerState& w = workers_[r];
      rpc::WorkerStatus* ws = response->add_workers();
      ws->set_rank(r);
      ws->set_live(w.live);
      ws->set_step(w.step);
      ws->set_samples(w.samples);
      ws->set_samples_per_s(w.samples_per_s);
      ws->set_last_heartbeat_age_s(absl::ToDoubleSeconds(now - w.last_seen));
      ws->set_left_reason(w.left_reason);
    }
  }
  // Ask every server for its tables, outside the lock.
  for (uint32_t s = 0; s < servers_.size(); ++s) {
    rpc::ServerStatus* ss = response->add_servers();
    ss->set_rank(s);
    ss->set_endpoint(config_.cluster.ps_endpoints[s]);
    grpc::ClientContext ctx;
    ctx.set_deadline(DeadlineIn(2.0));
    rpc::TableInfoRequest req;
    req.set_protocol_version(kProtocolVersion);
    rpc::TableInfoResponse info;
    grpc::Status st = servers_[s]->GetTableInfo(&ctx, req, &info);
    ss->set_reachable(st.ok());
    if (!st.ok()) continue;
    ss->set_applied_rounds(info.applied_rounds());
    *ss->mutable_tables() = info.tables();
  }
  return grpc::Status::OK;
}

void Coordinator::BroadcastMembership() {
  std::lock_guard<std::mutex> order(broadcast_mu_);
  rpc::MembershipUpdate update;
  update.set_protocol_version(kProtocolVersion);
  {
    std::lock_guard<std::mutex> lock(mu_);
    update.set_epoch(epoch_);
    for (uint32_t r = 0; r < workers_.size(); ++r) {
      if (workers_[r].live) update.add_live_workers(r);
    }
  }
  for (uint32_t s = 0; s < servers_.size(); ++s) {
    // A server that is down now learns the live set from the next change;
    // servers drop updates older than the epoch they hold.
    grpc::ClientContext ctx;
    ctx.set_deadline(DeadlineIn(config_.client.connect_deadline_s));
    ctx.set_wait_for_ready(true);
    rpc::MembershipAck ack;
    grpc::Status st = servers_[s]->UpdateMembership(&ctx, update, &ack);
    if (!st.ok()) {
      spdlog::warn("membership epoch {} not delivered to server {} ({}): {}",
                   update.epoch(), s, config_.cluster.ps_endpoints[s],
                   st.error_message());
    }
  }
}

void Coordinator::WatchLiveness() {
  const absl::Duration timeout =
      absl::Seconds(config_.server.heartbeat_timeout_s);
  const absl::Duration first_contact =
      timeout + absl::Seconds(config_.client.connect_deadline_s);
  std::unique_lock<std::mutex> lock(mu_);
  while (!stopping_) {
    changed_.wait_for(lock, std::chrono::milliseconds(200));
    if (stopping_) break;
    const absl::Time now = absl::Now();
    bool removed = false;
    for (uint32_t r = 0; r < workers_.size(); ++r) {
      WorkerState& w = workers_[r];
      if (!w.live) continue;
      const absl::Duration silent = now - w.last_seen;
      if (w.registered && silent > timeout) {
        removed |= RemoveWorker(
            r, absl::StrCat("no heartbeat for ", absl::FormatDuration(silent)));
      } else if (!w.registered && silent > first_contact) {
        removed |=
            RemoveWorker(r, absl::StrCat("never registered within ",
                                         absl::FormatDuration(first_contact)));
      }
    }
    if (removed) {
      changed_.notify_all();
      lock.unlock();
      BroadcastMembership();
      lock.lock();
    }
  }
}

// ---------------------------------------------------------------------------

CoordinatorClient::CoordinatorClient(const JobConfig& config, uint32_t rank)
    : config_(config),
      rank_(rank),
      stub_(rpc::Coordinator::NewStub(
          MakeChannel(config.cluster.ps_endpoints.at(0),
                      config.server.max_message_bytes))) {}

CoordinatorClient::~CoordinatorClient() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  stop_cv_.notify_all();
  if (heartbeat_.joinable()) heartbeat_.join();
}

absl::StatusOr<rpc::RegisterResponse> CoordinatorClient::Register() {
  rpc::RegisterRequest request;
  request.set_protocol_version(kProtocolVersion);
  request.set_role(rpc::ROLE_WORKER);
  request.set_rank(rank_);
  for (const TableConfig& t : config_.tables) {
    ToSchemaProto(t, request.add_tables());
  }
  const auto start = std::chrono::steady_clock::now();
  double backoff = config_.client.initial_backoff_s;
  while (true) {
    grpc::ClientContext ctx;
    ctx.set_deadline(DeadlineIn(config_.client.rpc_timeout_s));
    rpc::RegisterResponse response;
    grpc::Status st = stub_->Register(&ctx, request, &response);
    if (st.ok()) return response;
    const double waited =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start)
            .count();
    if (st.error_code() != grpc::StatusCode::UNAVAILABLE) {
      return FromGrpcStatus(st);
    }
    if (waited >= config_.client.connect_deadline_s) {
      return absl::UnavailableError(absl::StrCat(
          "coordinator at ", config_.cluster.ps_endpoints[0],
          " unreachable for ", static_cast<int>(waited),
          " s (client.connect_deadline_s = ", config_.client.connect_deadline_s,
          "); last error: ", st.error_message()));
    }
    std::this_thread::sleep_for(std::chrono::duration<double>(
        std::min(backoff, config_.client.connect_deadline_s - waited)));
    backoff = std::min(backoff * 2, config_.client.max_backoff_s);
  }
}

void CoordinatorClient::ReportProgress(uint64_t step, uint64_t samples,
                                       double samples_per_s) {
  step_ = step;
  samples_ = samples;
  samples_per_s_ = samples_per_s;
}

void CoordinatorClient::StartHeartbeats() {
  heartbeat_ = std::thread([this] {
    const auto interval = std::chrono::milliseconds(
        static_cast<int64_t>(config_.client.heartbeat_interval_s * 1000));
    std::unique_lock<std::mutex> lock(mu_);
    while (!stop_cv_.wait_for(lock, interval, [this] { return stop_; })) {
      lock.unlock();
      rpc::HeartbeatRequest request;
      request.set_protocol_version(kProtocolVersion);
      request.set_role(rpc::ROLE_WORKER);
      request.set_rank(rank_);
      request.set_step(step_);
      request.set_samples(samples_);
      request.set_samples_per_s(samples_per_s_);
      grpc::ClientContext ctx;
      ctx.set_deadline(DeadlineIn(config_.client.heartbeat_interval_s * 2));
      rpc::HeartbeatResponse response;
      grpc::Status st = stub_->Heartbeat(&ctx, request, &response);
      if (!st.ok()) {
        spdlog::debug("heartbeat failed: {}", st.error_message());
      }
      lock.lock();
    }
  });
}

absl::Status CoordinatorClient::Barrier(const std::string& name) {
  rpc::BarrierRequest request;
  request.set_protocol_version(kProtocolVersion);
  request.set_name(name);
  request.set_rank(rank_);
  grpc::ClientContext ctx;
  ctx.set_deadline(DeadlineIn(config_.client.rpc_timeout_s));
  rpc::BarrierResponse response;
  return FromGrpcStatus(stub_->Barrier(&ctx, request, &response));
}

absl::Status CoordinatorClient::Leave(const std::string& reason) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  stop_cv_.notify_all();
  if (heartbeat_.joinable()) heartbeat_.join();
  rpc::LeaveRequest request;
  request.set_protocol_version(kProtocolVersion);
  request.set_rank(rank_);
  request.set_reason(reason);
  grpc::ClientContext ctx;
  ctx.set_deadline(DeadlineIn(config_.client.rpc_timeout_s));
  rpc::LeaveResponse response;
  return FromGrpcStatus(stub_->Leave(&ctx, request, &response));
}

absl::StatusOr<rpc::StatusResponse> QueryStatus(const std::string& endpoint,
                                                double timeout_s) {
  auto stub = rpc::Coordinator::NewStub(MakeChannel(endpoint, 64 << 20));
  grpc::ClientContext ctx;
  ctx.set_deadline(DeadlineIn(timeout_s));
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

}  // namespace hetps
