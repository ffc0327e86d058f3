#include "coord/coordinator.h"

#include <algorithm>
#include <chrono>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/channel.h"
#include "common/logging.h"
#include "common/status.h"
#include "config/table_schema.h"
#include "hetps/version.h"

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

constexpr uint32_t kTailSplit = 4;

uint32_t TrainChunks(const JobConfig& config) {
  return static_cast<uint32_t>(config.train.data.chunks > 0
                                   ? config.train.data.chunks
                                   : 16 * config.num_workers());
}

Coordinator::Coordinator(const JobConfig& config, uint64_t bytes_per_sample)
    : config_(config),
      shard_map_(
          ShardMap::Uniform(config.num_servers(), config.server.num_buckets)),
      started_(absl::Now()),
      chunks_(TrainChunks(config)),
      window_(config.semi_async,
              InitialWindow(config, ProfiledThroughputs(config))),
      planner_(config_, bytes_per_sample) {
  for (const std::string& endpoint : config_.cluster.ps_endpoints) {
    servers_.push_back(rpc::ParameterServer::NewStub(MakeChannel(
        endpoint, config_.server.max_message_bytes, config_.credentials)));
  }
  workers_.resize(config_.num_workers());
  for (WorkerState& w : workers_) w.last_seen = started_;
  std::lock_guard<std::mutex> lock(mu_);
  Replan();
}

Coordinator::~Coordinator() { Stop(); }

void Coordinator::Start() {
  watcher_ = std::thread([this] { WatchLiveness(); });
  control_ = std::thread([this] { Control(); });
}

void Coordinator::Stop() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  changed_.notify_all();
  if (watcher_.joinable()) watcher_.join();
  if (control_.joinable()) control_.join();
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
      ++w.incarnation;
      response->set_incarnation(w.incarnation);
      if (w.lease) {
        // Registering again: the process restarted before it was found
        // dead, and the chunk it held is not finished.
        spdlog::info(
            "chunk {} of {} (epoch {}) that worker {} held when it restarted "
            "goes back to the queue",
            w.lease->chunk(), w.lease->chunks(), w.lease->epoch() + 1,
            request->rank());
        tail_.push_front(*w.lease);
        w.lease.reset();
        ++requeued_chunks_;
      }
      if (!w.live) {
        w.live = true;
        w.left_reason.clear();
        ++epoch_;
        rejoined = true;
      }
      spdlog::info(
          "worker {} registered{}", request->rank(),
          w.incarnation > 1
              ? absl::StrCat(" again (incarnation ", w.incarnation,
                             rejoined ? ", rejoined the live set)" : ")")
              : "");
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
    w.clock = request->clock();
    w.batch_size = request->batch_size();
    w.push_freq = request->push_freq();
    w.busy_fraction = request->busy_fraction();
    w.compute_samples_per_s = request->compute_samples_per_s();
    w.emulated = request->emulated();
    w.memory_mb = request->memory_mb();
    w.raw_bytes = request->raw_bytes();
    w.sent_bytes = request->sent_bytes();
    w.codec = request->codec();
    w.codec_reason = request->codec_reason();
    const WorkerPlan& plan = planner_.plan()[request->rank()];
    rpc::BatchPlan* out = response->mutable_plan();
    out->set_version(planner_.version());
    out->set_batch_size(plan.batch_size);
    out->set_push_freq(plan.push_freq);
    out->set_reason(plan.reason);
  }
  response->set_epoch(epoch_);
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
  std::lock_guard<std::mutex> lock(mu_);
  if (request->rank() >= workers_.size()) {
    return grpc::Status(
        grpc::StatusCode::INVALID_ARGUMENT,
        absl::StrCat("worker rank ", request->rank(), " out of range"));
  }
  WorkerState& worker = workers_[request->rank()];
  if (worker.lease) {  // asking again: the last chunk is done
    ++finished_chunks_;
    finished_samples_ += request->finished_samples();
    worker.lease.reset();
  }
  if (!tail_.empty()) {
    *response = tail_.front();
    tail_.pop_front();
    worker.lease = *response;
    ++worker.chunks_done;
    return grpc::Status::OK;
  }
  const uint64_t total = uint64_t{chunks_} * config_.train.epochs;
  if (chunks_given_ >= total) {
    response->set_done(true);
    return grpc::Status::OK;
  }
  ++worker.chunks_done;
  const uint32_t chunk = static_cast<uint32_t>(chunks_given_ % chunks_);
  const uint32_t epoch = static_cast<uint32_t>(chunks_given_ / chunks_);
  ++chunks_given_;
  response->set_chunk(chunk);
  response->set_chunks(chunks_);
  response->set_epoch(epoch);
  // The job's last chunks go out in quarters: whoever draws the very last
  // one then holds the others up for a quarter of a chunk's time at most.
  if (total - chunks_given_ < 2 * workers_.size()) {
    response->set_chunks(chunks_ * kTailSplit);
    for (uint32_t k = 1; k < kTailSplit; ++k) {
      rpc::ChunkResponse part = *response;
      part.set_chunk(chunk + chunks_ * k);
      tail_.push_back(part);
    }
  }
  worker.lease = *response;
  return grpc::Status::OK;
}

rpc::JobProgress Coordinator::SaveProgress() const {
  std::lock_guard<std::mutex> lock(mu_);
  rpc::JobProgress progress;
  progress.set_chunks_given(chunks_given_);
  progress.set_finished_chunks(finished_chunks_);
  progress.set_finished_samples(finished_samples_);
  for (const WorkerState& w : workers_) {
    if (w.lease) *progress.add_pending() = *w.lease;
  }
  for (const rpc::ChunkResponse& c : tail_) *progress.add_pending() = c;
  return progress;
}

void Coordinator::RestoreProgress(const rpc::JobProgress& progress) {
  std::lock_guard<std::mutex> lock(mu_);
  chunks_given_ = progress.chunks_given();
  finished_chunks_ = progress.finished_chunks();
  finished_samples_ = progress.finished_samples();
  tail_.assign(progress.pending().begin(), progress.pending().end());
  spdlog::info(
      "data progress restored: {} of {} chunks handed out, {} to hand out "
      "again",
      chunks_given_, uint64_t{chunks_} * config_.train.epochs, tail_.size());
}

void Coordinator::Replan() {
  std::vector<WorkerCapability> caps(workers_.size());
  for (uint32_t r = 0; r < workers_.size(); ++r) {
    const WorkerState& w = workers_[r];
    const DeviceProfileConfig* profile = config_.ProfileOf(r);
    caps[r].live = w.live;
    caps[r].throughput = w.compute_samples_per_s > 0 ? w.compute_samples_per_s
                         : profile != nullptr        ? profile->throughput
                                                     : 0;
    caps[r].memory_mb = w.memory_mb > 0      ? w.memory_mb
                        : profile != nullptr ? profile->memory_mb
                                             : 0;
  }
  if (!planner_.Update(caps)) return;
  for (uint32_t r = 0; r < workers_.size(); ++r) {
    if (!workers_[r].live) continue;
    const WorkerPlan& p = planner_.plan()[r];
    spdlog::info("plan {}: worker {} batch {} push_freq {} ({})",
                 planner_.version(), r, p.batch_size, p.push_freq, p.reason);
  }
}

std::vector<std::optional<rpc::TableInfoResponse>> Coordinator::PollServers() {
  std::vector<std::optional<rpc::TableInfoResponse>> out(servers_.size());
  for (uint32_t s = 0; s < servers_.size(); ++s) {
    grpc::ClientContext ctx;
    ctx.set_deadline(DeadlineIn(2.0));
    rpc::TableInfoRequest req;
    req.set_protocol_version(kProtocolVersion);
    rpc::TableInfoResponse info;
    if (servers_[s]->GetTableInfo(&ctx, req, &info).ok()) out[s] = info;
  }
  return out;
}

void Coordinator::Control() {
  const bool adapt = config_.mode == ConsistencyMode::kSemiAsync &&
                     config_.semi_async.adapt_window;
  const auto period = std::chrono::milliseconds(static_cast<int64_t>(
      std::min(config_.semi_async.adapt_every_s, 1.0) * 1000));
  auto last_adapt = std::chrono::steady_clock::now();
  std::unique_lock<std::mutex> lock(mu_);
  while (!stopping_) {
    changed_.wait_for(lock, period);
    if (stopping_) break;
    Replan();
    const auto now = std::chrono::steady_clock::now();
    if (!adapt || std::chrono::duration<double>(now - last_adapt).count() <
                      config_.semi_async.adapt_every_s) {
      continue;
    }
    last_adapt = now;
    lock.unlock();
    const auto infos = PollServers();
    WindowSignals total;
    std::map<uint32_t, uint64_t> staleness;
    for (const auto& info : infos) {
      if (!info) continue;
      const rpc::AggregatorStats& st = info->stats();
      total.pushes += st.pushes();
      total.pushes_into_empty += st.pushes_into_empty();
      total.pulls += st.pulls();
      total.ssp_waits += st.ssp_waits();
      total.ssp_wait_s += st.ssp_wait_seconds();
      total.applies += st.applies();
      total.applies_by_time += st.applies_by_time();
      for (const rpc::WorkerClock& c : st.clocks()) {
        staleness[c.worker()] =
            std::max(staleness[c.worker()], c.last_staleness());
      }
    }
    WindowSignals period_signals{
        .pushes = total.pushes - last_signals_.pushes,
        .pushes_into_empty =
            total.pushes_into_empty - last_signals_.pushes_into_empty,
        .pulls = total.pulls - last_signals_.pulls,
        .ssp_waits = total.ssp_waits - last_signals_.ssp_waits,
        .ssp_wait_s = total.ssp_wait_s - last_signals_.ssp_wait_s,
        .applies = total.applies - last_signals_.applies,
        .applies_by_time =
            total.applies_by_time - last_signals_.applies_by_time};
    // A restarted server's counters start again from zero.
    if (total.pushes < last_signals_.pushes) period_signals = total;
    last_signals_ = total;
    lock.lock();
    // Pulls wait on every server at once: one worker-second held shows up
    // once per server.
    period_signals.ssp_wait_s /= std::max<size_t>(1, servers_.size());
    period_signals.worker_s =
        config_.semi_async.adapt_every_s *
        std::count_if(workers_.begin(), workers_.end(),
                      [](const WorkerState& w) { return w.live; });
    for (const auto& [w, st] : staleness) {
      if (w < workers_.size()) workers_[w].staleness = st;
    }
    std::optional<WindowChange> change = window_.Adjust(period_signals);
    if (!change) continue;
    const std::string line =
        absl::StrFormat("%.1f s: window %d -> %d, %s",
                        absl::ToDoubleSeconds(absl::Now() - started_),
                        change->from, change->to, change->reason);
    spdlog::info("{}", line);
    window_changes_.push_back(line);
    if (window_changes_.size() > 50) {
      window_changes_.erase(window_changes_.begin());
    }
    lock.unlock();
    BroadcastMembership();
    lock.lock();
  }
}

bool Coordinator::RemoveWorker(uint32_t rank, const std::string& reason) {
  WorkerState& w = workers_[rank];
  if (!w.live) return false;
  w.live = false;
  w.left_reason = reason;
  ++epoch_;
  spdlog::info("worker {} left the live set (epoch {}): {}", rank, epoch_,
               reason);
  if (w.lease) {
    spdlog::info(
        "chunk {} of {} (epoch {}) that worker {} was training goes back to "
        "the queue",
        w.lease->chunk(), w.lease->chunks(), w.lease->epoch() + 1, rank);
    tail_.push_front(*w.lease);
    w.lease.reset();
    ++requeued_chunks_;
  }
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
    response->set_window(window_.window());
    for (const std::string& line : window_changes_) {
      response->add_window_changes(line);
    }
    const absl::Time now = absl::Now();
    response->set_elapsed_s(absl::ToDoubleSeconds(now - started_));
    response->set_finished_chunks(finished_chunks_);
    response->set_finished_samples(finished_samples_);
    response->set_requeued_chunks(requeued_chunks_);
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
      ws->set_clock(w.clock);
      ws->set_batch_size(w.batch_size);
      ws->set_push_freq(w.push_freq);
      ws->set_busy_fraction(w.busy_fraction);
      ws->set_compute_samples_per_s(w.compute_samples_per_s);
      ws->set_staleness(w.staleness);
      ws->set_emulated(w.emulated);
      ws->set_chunks_done(w.chunks_done);
      ws->set_raw_bytes(w.raw_bytes);
      ws->set_sent_bytes(w.sent_bytes);
      ws->set_codec(w.codec);
      ws->set_codec_reason(w.codec_reason);
    }
  }
  // Ask every server for its tables and queue, outside the lock.
  const auto infos = PollServers();
  for (uint32_t s = 0; s < servers_.size(); ++s) {
    rpc::ServerStatus* ss = response->add_servers();
    ss->set_rank(s);
    ss->set_endpoint(config_.cluster.ps_endpoints[s]);
    ss->set_reachable(infos[s].has_value());
    if (!infos[s]) continue;
    ss->set_applied_rounds(infos[s]->applied_rounds());
    *ss->mutable_tables() = infos[s]->tables();
    *ss->mutable_stats() = infos[s]->stats();
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
    update.set_window(window_.window());
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
                      config.server.max_message_bytes, config.credentials))) {}

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

void CoordinatorClient::ReportProgress(const Progress& progress) {
  std::lock_guard<std::mutex> lock(mu_);
  progress_ = progress;
}

rpc::BatchPlan CoordinatorClient::plan() const {
  std::lock_guard<std::mutex> lock(mu_);
  return plan_;
}

absl::Status CoordinatorClient::HeartbeatNow() {
  rpc::HeartbeatRequest request;
  request.set_protocol_version(kProtocolVersion);
  request.set_role(rpc::ROLE_WORKER);
  request.set_rank(rank_);
  {
    std::lock_guard<std::mutex> lock(mu_);
    const Progress& p = progress_;
    request.set_step(p.step);
    request.set_samples(p.samples);
    request.set_samples_per_s(p.samples_per_s);
    request.set_clock(p.clock);
    request.set_batch_size(p.batch_size);
    request.set_push_freq(p.push_freq);
    request.set_busy_fraction(p.busy_fraction);
    request.set_compute_samples_per_s(p.compute_samples_per_s);
    request.set_emulated(p.emulated);
    request.set_memory_mb(p.memory_mb);
    request.set_raw_bytes(p.raw_bytes);
    request.set_sent_bytes(p.sent_bytes);
    request.set_codec(p.codec);
    request.set_codec_reason(p.codec_reason);
  }
  grpc::ClientContext ctx;
  ctx.set_deadline(DeadlineIn(config_.client.heartbeat_interval_s * 2));
  rpc::HeartbeatResponse response;
  grpc::Status st = stub_->Heartbeat(&ctx, request, &response);
  if (!st.ok()) return FromGrpcStatus(st);
  std::lock_guard<std::mutex> lock(mu_);
  if (response.plan().version() != plan_.version()) plan_ = response.plan();
  return absl::OkStatus();
}

absl::StatusOr<rpc::ChunkResponse> CoordinatorClient::NextChunk(
    uint64_t finished_samples) {
  rpc::ChunkRequest request;
  request.set_protocol_version(kProtocolVersion);
  request.set_rank(rank_);
  request.set_finished_samples(finished_samples);
  grpc::ClientContext ctx;
  ctx.set_deadline(DeadlineIn(config_.client.rpc_timeout_s));
  ctx.set_wait_for_ready(true);
  rpc::ChunkResponse response;
  grpc::Status st = stub_->NextChunk(&ctx, request, &response);
  if (!st.ok()) return FromGrpcStatus(st);
  return response;
}

void CoordinatorClient::StartHeartbeats() {
  heartbeat_ = std::thread([this] {
    const auto interval = std::chrono::milliseconds(
        static_cast<int64_t>(config_.client.heartbeat_interval_s * 1000));
    std::unique_lock<std::mutex> lock(mu_);
    while (!stop_cv_.wait_for(lock, interval, [this] { return stop_; })) {
      lock.unlock();
      if (absl::Status s = HeartbeatNow(); !s.ok()) {
        spdlog::debug("heartbeat failed: {}", s.message());
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

absl::StatusOr<rpc::StatusResponse> QueryStatus(
    const std::string& endpoint, double timeout_s,
    const Credentials& credentials) {
  auto stub =
      rpc::Coordinator::NewStub(MakeChannel(endpoint, 64 << 20, credentials));
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
