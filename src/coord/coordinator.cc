#include "coord/coordinator.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/logging.h"
#include "common/status.h"
#include "config/table_schema.h"
#include "hetps/version.h"

namespace hetps {
namespace {

const char* KindName(rpc::TableKind kind) {
  return kind == rpc::TABLE_KIND_SPARSE ? "sparse" : "dense";
}

// How often the watcher looks for silent workers and a barrier for a stop.
constexpr absl::Duration kWatchEvery = absl::Milliseconds(200);
constexpr absl::Duration kBarrierPoll = absl::Milliseconds(100);

}  // namespace

uint32_t TrainChunks(const JobConfig& config) {
  return static_cast<uint32_t>(config.train.data.chunks > 0
                                   ? config.train.data.chunks
                                   : 16 * config.num_workers());
}

Coordinator::Coordinator(const JobConfig& config, uint64_t bytes_per_sample,
                         Clock& clock, ParameterServerStubs servers)
    : config_(config),
      clock_(clock),
      started_(clock.Now()),
      make_stub_(servers
                     ? std::move(servers)
                     : GrpcParameterServerStubs(config.server.max_message_bytes,
                                                config.credentials)),
      membership_(config.num_workers(), started_,
                  absl::Seconds(config.server.heartbeat_timeout_s),
                  absl::Seconds(config.server.heartbeat_timeout_s +
                                config.client.connect_deadline_s)),
      chunks_(TrainChunks(config), config.train.epochs, config.num_workers()),
      progress_(config.num_workers()),
      staleness_(config.num_workers(), 0),
      window_(config.semi_async,
              InitialWindow(config, ProfiledThroughputs(config))),
      planner_(config_, bytes_per_sample),
      rebalancer_(config.sharding),
      shard_map_(
          ShardMap::Uniform(config.num_servers(), config.server.num_buckets)) {
  absl::MutexLock lock(&mu_);
  // Servers are known from the endpoint list, or, at a rendezvous, only
  // this one (server 0) until the others register.
  servers_.resize(config_.num_servers());
  for (uint32_t s = 0; s < servers_.size(); ++s) {
    const std::string& endpoint =
        config_.cluster.ps_endpoints.empty()
            ? (s == 0 ? config_.cluster.rendezvous : std::string())
            : config_.cluster.ps_endpoints[s];
    if (endpoint.empty()) continue;
    servers_[s] = {endpoint, make_stub_(endpoint)};
  }
  Replan();
}

Coordinator::~Coordinator() { Stop(); }

void Coordinator::Start() {
  watcher_ = std::thread([this] { WatchLiveness(); });
  control_ = std::thread([this] { Control(); });
}

void Coordinator::Stop() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
    changed_.SignalAll();
  }
  if (watcher_.joinable()) watcher_.join();
  if (control_.joinable()) control_.join();
  if (mover_ != nullptr) mover_->Cancel();
  if (mover_thread_.joinable()) mover_thread_.join();
}

std::vector<uint32_t> Coordinator::LiveWorkers() const {
  absl::MutexLock lock(&mu_);
  return membership_.Live();
}

uint64_t Coordinator::epoch() const {
  absl::MutexLock lock(&mu_);
  return membership_.epoch();
}

grpc::Status Coordinator::CheckRank(uint32_t rank) const {
  if (rank < static_cast<uint32_t>(config_.num_workers())) {
    return grpc::Status::OK;
  }
  return grpc::Status(
      grpc::StatusCode::INVALID_ARGUMENT,
      absl::StrCat("worker rank ", rank, " out of range: the job has ",
                   config_.num_workers(), " workers"));
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
  if (request->role() == rpc::ROLE_SERVER) {
    if (grpc::Status s = RegisterServer(*request); !s.ok()) return s;
  }
  bool rejoined = false;
  {
    absl::MutexLock lock(&mu_);
    if (request->role() == rpc::ROLE_WORKER) {
      const uint32_t rank = request->rank();
      if (grpc::Status s = CheckRank(rank); !s.ok()) return s;
      // Registering again: the process restarted before it was found
      // dead, and the chunk it held is not finished.
      if (auto chunk = chunks_.Requeue(rank)) {
        spdlog::info(
            "chunk {} of {} (epoch {}) that worker {} held when it restarted "
            "goes back to the queue",
            chunk->chunk(), chunk->chunks(), chunk->epoch() + 1, rank);
      }
      const Membership::Registration r =
          membership_.Register(rank, clock_.Now());
      rejoined = r.rejoined;
      response->set_incarnation(r.incarnation);
      spdlog::info(
          "worker {} registered{}", rank,
          r.incarnation > 1
              ? absl::StrCat(" again (incarnation ", r.incarnation,
                             rejoined ? ", rejoined the live set)" : ")")
              : "");
      changed_.SignalAll();
    }
    response->set_epoch(membership_.epoch());
    for (const KnownServer& s : servers_)
      response->add_ps_endpoints(s.endpoint);
  }
  if (rejoined || request->role() == rpc::ROLE_SERVER) BroadcastMembership();
  {
    absl::MutexLock lock(&mu_);
    shard_map_.ToProto(response->mutable_shard_map());
  }
  response->set_num_workers(config_.num_workers());
  response->set_mode(ConsistencyModeName(config_.mode));
  return grpc::Status::OK;
}

grpc::Status Coordinator::Heartbeat(grpc::ServerContext*,
                                    const rpc::HeartbeatRequest* request,
                                    rpc::HeartbeatResponse* response) {
  if (auto s = CheckProtocolVersion(request->protocol_version(), "heartbeat");
      !s.ok()) {
    return ToGrpcStatus(s);
  }
  absl::MutexLock lock(&mu_);
  if (request->role() == rpc::ROLE_WORKER) {
    const uint32_t rank = request->rank();
    if (grpc::Status s = CheckRank(rank); !s.ok()) return s;
    membership_.Heartbeat(rank, clock_.Now());
    progress_[rank] = request->progress();
    diagnostics_.Reported(rank, progress_[rank],
                          absl::ToDoubleSeconds(clock_.Now() - started_));
    const WorkerPlan& plan = planner_.plan()[rank];
    rpc::BatchPlan* out = response->mutable_plan();
    out->set_version(planner_.version());
    out->set_batch_size(plan.batch_size);
    out->set_push_freq(plan.push_freq);
    out->set_reason(plan.reason);
    response->set_live(membership_.live(rank));
  }
  response->set_epoch(membership_.epoch());
  response->set_window(window_.window());
  return grpc::Status::OK;
}

grpc::Status Coordinator::NextChunk(grpc::ServerContext*,
                                    const rpc::ChunkRequest* request,
                                    rpc::ChunkResponse* response) {
  if (auto s = CheckProtocolVersion(request->protocol_version(), "chunk");
      !s.ok()) {
    return ToGrpcStatus(s);
  }
  if (grpc::Status s = CheckRank(request->rank()); !s.ok()) return s;
  absl::MutexLock lock(&mu_);
  *response = chunks_.Next(request->rank(), request->finished_samples(),
                           request->chunks_received());
  return grpc::Status::OK;
}

rpc::JobProgress Coordinator::SaveProgress() const {
  absl::MutexLock lock(&mu_);
  return chunks_.Save();
}

void Coordinator::RestoreProgress(const rpc::JobProgress& progress) {
  absl::MutexLock lock(&mu_);
  chunks_.Restore(progress);
  spdlog::info(
      "data progress restored: {} of {} chunks handed out, {} to hand out "
      "again",
      chunks_.given(), chunks_.total(), chunks_.pending());
}

void Coordinator::Replan() {
  std::vector<WorkerCapability> caps(progress_.size());
  for (uint32_t r = 0; r < caps.size(); ++r) {
    const rpc::WorkerProgress& p = progress_[r];
    const DeviceProfileConfig* profile = config_.ProfileOf(r);
    caps[r].live = membership_.live(r);
    caps[r].throughput = p.compute_samples_per_s() > 0
                             ? p.compute_samples_per_s()
                         : profile != nullptr ? profile->throughput
                                              : 0;
    caps[r].memory_mb = p.memory_mb() > 0    ? p.memory_mb()
                        : profile != nullptr ? profile->memory_mb
                                             : 0;
  }
  if (!planner_.Update(caps)) return;
  for (uint32_t r = 0; r < caps.size(); ++r) {
    if (!caps[r].live) continue;
    const WorkerPlan& p = planner_.plan()[r];
    spdlog::info("plan {}: worker {} batch {} push_freq {} ({})",
                 planner_.version(), r, p.batch_size, p.push_freq, p.reason);
  }
}

grpc::Status Coordinator::RegisterServer(const rpc::RegisterRequest& request) {
  const uint32_t rank = request.rank();
  if (rank >= static_cast<uint32_t>(config_.num_servers())) {
    return ToGrpcStatus(absl::InvalidArgumentError(
        absl::StrCat("server rank ", rank, " out of range: the job has ",
                     config_.num_servers(), " servers")));
  }
  if (!config_.cluster.ps_endpoints.empty()) {
    // Endpoints are the job's, fixed: nothing to learn.
    return grpc::Status::OK;
  }
  if (rank == 0) {
    return ToGrpcStatus(absl::InvalidArgumentError(
        "server 0 is the rendezvous itself; it does not register"));
  }
  if (absl::Status s = ValidateEndpoint(request.endpoint()); !s.ok()) {
    return ToGrpcStatus(absl::InvalidArgumentError(absl::StrCat(
        "server ", rank, " registered a bad endpoint: ", s.message())));
  }
  absl::MutexLock lock(&mu_);
  KnownServer& known = servers_[rank];
  if (known.endpoint != request.endpoint()) {
    known = {request.endpoint(), make_stub_(request.endpoint())};
  }
  spdlog::info("server {} registered at {}", rank, request.endpoint());
  return grpc::Status::OK;
}

grpc::Status Coordinator::Rendezvous(grpc::ServerContext*,
                                     const rpc::RendezvousRequest* request,
                                     rpc::RendezvousResponse* response) {
  if (auto s = CheckProtocolVersion(request->protocol_version(), "rendezvous");
      !s.ok()) {
    return ToGrpcStatus(s);
  }
  absl::MutexLock lock(&mu_);
  std::vector<uint32_t> missing;
  for (uint32_t s = 0; s < servers_.size(); ++s) {
    if (servers_[s].endpoint.empty()) missing.push_back(s);
  }
  if (!missing.empty()) {
    return ToGrpcStatus(absl::UnavailableError(
        absl::StrCat("servers [", absl::StrJoin(missing, ","),
                     "] have not registered at the rendezvous yet")));
  }
  for (const KnownServer& s : servers_) response->add_ps_endpoints(s.endpoint);
  return grpc::Status::OK;
}

std::vector<Coordinator::KnownServer> Coordinator::Servers() const {
  absl::MutexLock lock(&mu_);
  return servers_;
}

std::vector<std::optional<rpc::TableInfoResponse>> Coordinator::PollServers(
    const std::vector<KnownServer>& servers) {
  std::vector<std::optional<rpc::TableInfoResponse>> out(servers.size());
  for (uint32_t s = 0; s < servers.size(); ++s) {
    if (!servers[s].stub) continue;
    grpc::ClientContext ctx;
    ctx.set_deadline(RpcDeadline(clock_, 2.0));
    rpc::TableInfoRequest req;
    req.set_protocol_version(kProtocolVersion);
    rpc::TableInfoResponse info;
    if (servers[s].stub->GetTableInfo(&ctx, req, &info).ok()) out[s] = info;
  }
  return out;
}

void Coordinator::Control() {
  const absl::Duration every = absl::Seconds(config_.semi_async.adapt_every_s);
  const absl::Duration replan_every = std::min(every, absl::Seconds(1));
  absl::Time last_period = clock_.Now();
  FinishOpenMoves();
  absl::MutexLock lock(&mu_);
  while (!stopping_) {
    clock_.WaitUntil(changed_, mu_, clock_.Now() + replan_every);
    if (stopping_) break;
    Replan();
    if (clock_.Now() - last_period < every) continue;
    last_period = clock_.Now();
    mu_.Unlock();
    ControlPeriod();
    mu_.Lock();
  }
}

void Coordinator::ControlPeriod() {
  const bool semi_async = config_.mode == ConsistencyMode::kSemiAsync;
  const bool adapt = semi_async && config_.semi_async.adapt_window;
  const auto infos = PollServers(Servers());
  PlanPlacement(infos);
  WindowSignals total = SumSignals(infos);
  FillLead(
      infos,
      [&] {
        absl::MutexLock lock(&mu_);
        return membership_.Live();
      }(),
      total);
  WindowSignals period = SignalsSince(total, last_signals_);
  last_signals_ = total;
  std::optional<WindowChange> change;
  {
    absl::MutexLock lock(&mu_);
    period.period_s = config_.semi_async.adapt_every_s;
    period.worker_s =
        period.period_s * static_cast<double>(membership_.Live().size());
    for (const auto& [w, st] : LatestStaleness(infos)) {
      if (w < staleness_.size()) staleness_[w] = st;
    }
    DiagnosticsPeriod view;
    view.now_s = absl::ToDoubleSeconds(clock_.Now() - started_);
    view.window = window_.window();
    if (semi_async) {
      view.window_verdict = JudgeWindow(period, view.window);
      if (view.window_verdict) {
        const bool grow = view.window_verdict->grow;
        view.window_can_move =
            adapt &&
            (grow ? view.window <
                        static_cast<uint32_t>(config_.semi_async.window_max)
                  : view.window >
                        static_cast<uint32_t>(config_.semi_async.window_min));
      }
    }
    for (const auto& info : infos) {
      if (!info) {
        view.servers.emplace_back();
        continue;
      }
      view.servers.push_back(
          DiagnosticsPeriod::Server{.cpu_s = info->stats().cpu_s(),
                                    .cpus = info->stats().allowed_cpus()});
    }
    for (uint32_t r = 0; r < progress_.size(); ++r) {
      const DeviceProfileConfig* profile = config_.ProfileOf(r);
      view.workers.push_back(DiagnosticsPeriod::Worker{
          .rank = r,
          .live = membership_.live(r),
          .expected_samples_per_s = profile ? profile->throughput : 0.0,
          .progress = progress_[r]});
    }
    const size_t before = diagnostics_.raised();
    diagnostics_.Observe(view);
    const std::vector<rpc::Diagnostic> now =
        before < diagnostics_.raised() ? diagnostics_.List()
                                       : std::vector<rpc::Diagnostic>{};
    for (size_t i = before; i < now.size(); ++i) {
      spdlog::warn("diagnostic {} ({}): {}", now[i].kind(), now[i].subject(),
                   now[i].message());
    }
    if (!adapt) return;
    change = window_.Adjust(period);
    if (!change) return;
    const std::string line =
        absl::StrFormat("%.1f s: window %d -> %d, %s",
                        absl::ToDoubleSeconds(clock_.Now() - started_),
                        change->from, change->to, change->reason);
    spdlog::info("{}", line);
    window_changes_.push_back(line);
    if (window_changes_.size() > 50) {
      window_changes_.erase(window_changes_.begin());
    }
  }
  BroadcastMembership();
}

void Coordinator::PlanPlacement(
    const std::vector<std::optional<rpc::TableInfoResponse>>& infos) {
  const ShardMap map = [&] {
    absl::MutexLock lock(&mu_);
    return shard_map_;
  }();
  const uint32_t buckets = map.num_buckets();
  last_access_.resize(infos.size());
  std::vector<ServerPeriod> periods(infos.size());
  for (size_t s = 0; s < infos.size(); ++s) {
    if (!infos[s]) continue;
    uint64_t stored = 0;
    for (const rpc::TableInfo& t : infos[s]->tables()) {
      stored += t.rows() * t.row_bytes();
    }
    periods[s] =
        AccessPeriod(infos[s]->access(), last_access_[s], buckets, stored);
    last_access_[s] = infos[s]->access();
  }
  // A period a move ran in is used up but not planned from: its loads
  // straddle two placements.
  if (moving_) return;
  const RebalancePlan plan = rebalancer_.Plan(map, periods);
  rpc::PlacementPlan proto;
  proto.set_at_s(absl::ToDoubleSeconds(clock_.Now() - started_));
  proto.set_max_over_mean(plan.before);
  proto.set_planned_max_over_mean(plan.after);
  proto.set_moves(static_cast<uint32_t>(plan.moves.size()));
  proto.set_bytes(plan.bytes);
  proto.set_reason(plan.reason);
  std::map<std::pair<uint32_t, uint32_t>, uint32_t> flows;
  for (const BucketMove& m : plan.moves) ++flows[{m.from, m.to}];
  for (const auto& [pair, n] : flows) {
    rpc::BucketFlow* flow = proto.add_flows();
    flow->set_from(pair.first);
    flow->set_to(pair.second);
    flow->set_buckets(n);
  }
  proto.set_migrate(config_.sharding.migrate);
  {
    absl::MutexLock lock(&mu_);
    if (!plan.moves.empty() && (placement_.moves() == 0 || proto.migrate())) {
      spdlog::info(
          "placement: servers' load max/mean {:.2f}; moving {} buckets {} "
          "make it {:.2f} ({})",
          plan.before, plan.moves.size(), proto.migrate() ? "to" : "would",
          plan.after, plan.reason);
    }
    proto.set_moved_buckets(moved_buckets_);
    proto.set_last_move(last_move_);
    placement_ = std::move(proto);
  }
  if (!config_.sharding.migrate || plan.moves.empty()) return;
  if (mover_thread_.joinable()) mover_thread_.join();
  Mover();
  moving_ = true;
  mover_thread_ = std::thread([this, moves = plan.moves] {
    CarryOut(moves);
    moving_ = false;
  });
}

BucketMover& Coordinator::Mover() {
  if (mover_ == nullptr) {
    std::vector<std::string> endpoints;
    for (const KnownServer& s : Servers()) endpoints.push_back(s.endpoint);
    mover_ = std::make_unique<BucketMover>(std::move(endpoints), config_.mode,
                                           make_stub_);
  }
  return *mover_;
}

void Coordinator::FinishOpenMoves() {
  const ShardMap map = [&] {
    absl::MutexLock lock(&mu_);
    return shard_map_;
  }();
  // Version 1 is the job's first map: nothing was moved.
  if (map.version() <= 1) return;
  const bool open = !map.pending().empty();
  if (open) {
    spdlog::info(
        "placement: shard map version {} holds {} buckets' handover open "
        "(the previous server 0 stopped in the middle of a move); finishing "
        "it",
        map.version(), map.pending().size());
  }
  // On the mover's thread, as a plan is: Stop cancels it there. Also
  // without a handover open: a server the previous mover did not reach
  // may hold an older map (BucketMover::FinishOpen).
  Mover();
  moving_ = true;
  mover_thread_ = std::thread([this, map, open] {
    auto report = mover_->FinishOpen(map);
    if (!report.ok()) {
      spdlog::warn("placement: {} failed: {}",
                   open ? "finishing the open handover"
                        : absl::StrCat("giving every server shard map version ",
                                       map.version()),
                   report.status().ToString());
    } else if (open) {
      const std::string line = absl::StrFormat(
          "finished the open handover: %d buckets, %d rows (%.1f MB); map "
          "version %d",
          report->buckets, report->rows, report->bytes / 1e6,
          report->map->version());
      spdlog::info("placement: {}", line);
      absl::MutexLock lock(&mu_);
      shard_map_ = *report->map;
      moved_buckets_ += static_cast<uint32_t>(report->buckets);
      last_move_ = line;
    }
    moving_ = false;
  });
}

void Coordinator::CarryOut(const std::vector<BucketMove>& moves) {
  // In steps of about kMoveStepBytes: a bucket's requests wait at its new
  // owner while its step's rows travel, so smaller steps wait less.
  const absl::Time began = absl::Now();
  MoveReport total;
  size_t steps = 0;
  absl::Duration longest, longest_held;
  for (size_t i = 0; i < moves.size();) {
    std::vector<std::pair<uint32_t, uint32_t>> step;
    uint64_t bytes = 0;
    while (i < moves.size() && (step.empty() || bytes < kMoveStepBytes)) {
      step.emplace_back(moves[i].bucket, moves[i].to);
      bytes += moves[i].bytes;
      ++i;
    }
    auto report = mover_->Move(step);
    if (!report.ok()) {
      spdlog::warn("placement: moving {} buckets failed: {}", step.size(),
                   report.status().ToString());
      break;
    }
    ++steps;
    total.buckets += report->buckets;
    total.rows += report->rows;
    total.bytes += report->bytes;
    total.wait += report->wait;
    total.transfer += report->transfer;
    total.learn += report->learn;
    total.hold_ahead = std::max(total.hold_ahead, report->hold_ahead);
    longest_held = std::max(longest_held, report->held);
    total.map = report->map;
    longest = std::max(longest, report->total);
    absl::MutexLock lock(&mu_);
    shard_map_ = *report->map;
    moved_buckets_ += static_cast<uint32_t>(report->buckets);
  }
  if (steps == 0) return;
  const std::string line = absl::StrFormat(
      "%d buckets, %d rows (%.1f MB) in %.0f ms (%d steps, the longest %.0f "
      "ms; in all %.0f ms waiting for the workers to pass the cuts, %.0f "
      "ms handing rows over and %.0f ms for the workers to learn the new "
      "map; a read its old owner refused waited at most %.0f ms; cuts up to "
      "%d clocks ahead); map version %d",
      total.buckets, total.rows, total.bytes / 1e6,
      absl::ToDoubleMilliseconds(absl::Now() - began), steps,
      absl::ToDoubleMilliseconds(longest),
      absl::ToDoubleMilliseconds(total.wait),
      absl::ToDoubleMilliseconds(total.transfer),
      absl::ToDoubleMilliseconds(total.learn),
      absl::ToDoubleMilliseconds(longest_held), total.hold_ahead,
      total.map->version());
  spdlog::info("placement: moved {}", line);
  absl::MutexLock lock(&mu_);
  last_move_ = line;
}

void Coordinator::Departed(uint32_t rank, const std::string& reason) {
  spdlog::info("worker {} left the live set (epoch {}): {}", rank,
               membership_.epoch(), reason);
  if (auto chunk = chunks_.Requeue(rank)) {
    spdlog::info(
        "chunk {} of {} (epoch {}) that worker {} was training goes back to "
        "the queue",
        chunk->chunk(), chunk->chunks(), chunk->epoch() + 1, rank);
  }
  changed_.SignalAll();
}

grpc::Status Coordinator::Leave(grpc::ServerContext*,
                                const rpc::LeaveRequest* request,
                                rpc::LeaveResponse* response) {
  if (auto s = CheckProtocolVersion(request->protocol_version(), "leave");
      !s.ok()) {
    return ToGrpcStatus(s);
  }
  if (grpc::Status s = CheckRank(request->rank()); !s.ok()) return s;
  bool changed;
  {
    absl::MutexLock lock(&mu_);
    changed = membership_.Leave(request->rank(), request->reason());
    if (changed) Departed(request->rank(), request->reason());
    response->set_epoch(membership_.epoch());
  }
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
  if (grpc::Status s = CheckRank(request->rank()); !s.ok()) return s;
  absl::MutexLock lock(&mu_);
  std::set<uint32_t>& arrived = barriers_[request->name()];
  arrived.insert(request->rank());
  changed_.SignalAll();
  const auto all_arrived = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    for (uint32_t r : membership_.Live()) {
      if (!arrived.contains(r)) return false;
    }
    return true;
  };
  while (!all_arrived()) {
    if (stopping_) {
      // Not UNAVAILABLE: a worker asks again while the coordinator is
      // unreachable (restarted), but this one is going for good.
      return grpc::Status(grpc::StatusCode::ABORTED,
                          "coordinator shutting down: the job is ending");
    }
    if (context != nullptr && context->IsCancelled()) {
      return grpc::Status(grpc::StatusCode::CANCELLED, "barrier cancelled");
    }
    clock_.WaitUntil(changed_, mu_, clock_.Now() + kBarrierPoll);
  }
  response->set_epoch(membership_.epoch());
  return grpc::Status::OK;
}

grpc::Status Coordinator::GetStatus(grpc::ServerContext*,
                                    const rpc::StatusRequest* request,
                                    rpc::StatusResponse* response) {
  if (auto s = CheckProtocolVersion(request->protocol_version(), "status");
      !s.ok()) {
    return ToGrpcStatus(s);
  }
  *response = Status();
  return grpc::Status::OK;
}

grpc::Status Coordinator::GetShardMap(grpc::ServerContext*,
                                      const rpc::ShardMapRequest* request,
                                      rpc::ShardMapProto* response) {
  if (auto s = CheckProtocolVersion(request->protocol_version(), "shard map");
      !s.ok()) {
    return ToGrpcStatus(s);
  }
  absl::MutexLock lock(&mu_);
  shard_map_.ToProto(response);
  return grpc::Status::OK;
}

void Coordinator::RestoreShardMap(const ShardMap& map) {
  absl::MutexLock lock(&mu_);
  shard_map_ = map;
}

rpc::ServerStatus ServerStatusOf(const rpc::TableInfoResponse& info,
                                 const std::string& endpoint) {
  rpc::ServerStatus status;
  status.set_rank(info.server_rank());
  status.set_endpoint(endpoint);
  status.set_reachable(true);
  status.set_applied_rounds(info.applied_rounds());
  *status.mutable_tables() = info.tables();
  *status.mutable_stats() = info.stats();
  *status.mutable_pull_latency() = info.pull_latency();
  *status.mutable_push_latency() = info.push_latency();
  status.set_metrics_endpoint(info.metrics_endpoint());
  *status.mutable_access() = info.access();
  return status;
}

rpc::StatusResponse Coordinator::Status(bool ask_servers) {
  rpc::StatusResponse status;
  rpc::StatusResponse* response = &status;
  {
    absl::MutexLock lock(&mu_);
    const absl::Time now = clock_.Now();
    response->set_epoch(membership_.epoch());
    response->set_mode(ConsistencyModeName(config_.mode));
    response->set_window(window_.window());
    for (const std::string& line : window_changes_) {
      response->add_window_changes(line);
    }
    response->set_elapsed_s(absl::ToDoubleSeconds(now - started_));
    response->set_finished_chunks(chunks_.finished_chunks());
    response->set_chunks_given(chunks_.given());
    response->set_chunks_total(chunks_.total());
    response->set_finished_samples(chunks_.finished_samples());
    response->set_requeued_chunks(chunks_.requeued());
    for (rpc::Diagnostic& d : diagnostics_.List()) {
      *response->add_diagnostics() = std::move(d);
    }
    *response->mutable_placement() = placement_;
    for (uint32_t r = 0; r < progress_.size(); ++r) {
      rpc::WorkerStatus* ws = response->add_workers();
      ws->set_rank(r);
      ws->set_live(membership_.live(r));
      ws->set_last_heartbeat_age_s(
          absl::ToDoubleSeconds(membership_.SilentFor(r, now)));
      ws->set_left_reason(membership_.left_reason(r));
      ws->set_staleness(staleness_[r]);
      ws->set_chunks_done(chunks_.chunks_of(r));
      auto done = barriers_.find(kDoneBarrier);
      ws->set_done(done != barriers_.end() && done->second.contains(r));
      *ws->mutable_progress() = progress_[r];
    }
  }
  if (!ask_servers) return status;
  // Ask every server for its tables and queue, outside the lock.
  const std::vector<KnownServer> servers = Servers();
  const auto infos = PollServers(servers);
  for (uint32_t s = 0; s < servers.size(); ++s) {
    rpc::ServerStatus* ss = response->add_servers();
    if (infos[s]) {
      *ss = ServerStatusOf(*infos[s], servers[s].endpoint);
    } else {
      ss->set_rank(s);
      ss->set_endpoint(servers[s].endpoint);
    }
  }
  return status;
}

void Coordinator::BroadcastMembership() {
  absl::MutexLock order(&broadcast_mu_);
  rpc::MembershipUpdate update;
  update.set_protocol_version(kProtocolVersion);
  {
    absl::MutexLock lock(&mu_);
    update.set_epoch(membership_.epoch());
    update.set_window(window_.window());
    for (uint32_t r : membership_.Live()) update.add_live_workers(r);
  }
  const std::vector<KnownServer> servers = Servers();
  for (uint32_t s = 0; s < servers.size(); ++s) {
    // A server that is down now learns the live set from the next change;
    // servers drop updates older than the epoch they hold. One that has not
    // registered yet gets it when it does.
    if (!servers[s].stub) continue;
    grpc::ClientContext ctx;
    ctx.set_deadline(RpcDeadline(clock_, config_.client.connect_deadline_s));
    ctx.set_wait_for_ready(true);
    rpc::MembershipAck ack;
    grpc::Status st = servers[s].stub->UpdateMembership(&ctx, update, &ack);
    if (!st.ok()) {
      spdlog::warn("membership epoch {} not delivered to server {} ({}): {}",
                   update.epoch(), s, servers[s].endpoint, st.error_message());
    }
  }
}

std::vector<uint32_t> Coordinator::ExpireSilentWorkers() {
  std::vector<uint32_t> removed;
  {
    absl::MutexLock lock(&mu_);
    for (const auto& [rank, reason] : membership_.Expire(clock_.Now())) {
      Departed(rank, reason);
      removed.push_back(rank);
    }
  }
  if (!removed.empty()) BroadcastMembership();
  return removed;
}

void Coordinator::WatchLiveness() {
  absl::MutexLock lock(&mu_);
  while (!stopping_) {
    clock_.WaitUntil(changed_, mu_, clock_.Now() + kWatchEvery);
    if (stopping_) break;
    mu_.Unlock();
    ExpireSilentWorkers();
    mu_.Lock();
  }
}

}  // namespace hetps
