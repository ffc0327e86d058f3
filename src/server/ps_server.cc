#include "server/ps_server.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/bytes.h"
#include "common/cpu_limit.h"
#include "common/finite.h"
#include "common/logging.h"
#include "common/status.h"
#include "compress/codec.h"
#include "config/table_schema.h"
#include "hetps/ps_client.h"
#include "hetps/version.h"

namespace hetps {
namespace {

std::vector<std::string> SparseTableNames(const JobConfig& config) {
  std::vector<std::string> names;
  for (const TableConfig& table : config.tables) {
    if (table.kind == TableKind::kSparse) names.push_back(table.name);
  }
  return names;
}

}  // namespace

absl::StatusOr<std::unique_ptr<PsServer>> PsServer::Create(
    const JobConfig& config, uint32_t rank, uint32_t semi_async_window,
    Clock& clock) {
  const uint32_t servers = static_cast<uint32_t>(config.num_servers());
  if (rank >= servers) {
    return absl::InvalidArgumentError(
        absl::StrCat("server rank ", rank, " out of range: the job has ",
                     servers, " servers"));
  }
  AggregatorOptions options;
  options.job_batch = static_cast<uint64_t>(config.train.batch_size) *
                      static_cast<uint64_t>(config.num_workers());
  options.warmup_rounds = static_cast<uint32_t>(config.train.warmup_rounds);
  options.window = semi_async_window;
  options.semi_async = config.semi_async;
  auto aggregator = Aggregator::Create(
      config.mode, static_cast<uint32_t>(config.num_workers()),
      std::move(options), clock);
  if (!aggregator.ok()) return aggregator.status();
  std::unique_ptr<PsServer> server(new PsServer(
      config, rank, ShardMap::Uniform(servers, config.server.num_buckets),
      std::move(*aggregator), clock));
  for (const TableConfig& table : config.tables) {
    auto optimizer = Optimizer::Create(table.optimizer);
    if (!optimizer.ok()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "table '", table.name, "': ", optimizer.status().message()));
    }
    if (table.kind == TableKind::kSparse) {
      server->sparse_[table.name] = std::make_unique<SparseTable>(
          table, std::move(*optimizer), config.server.table_stripes);
    } else {
      auto [offset, length] = ShardMap::DenseSlice(table.dim, rank, servers);
      server->dense_[table.name] = std::make_unique<DenseTable>(
          table, offset, length, std::move(*optimizer));
    }
  }
  return server;
}

PsServer::PsServer(const JobConfig& config, uint32_t rank, ShardMap shard_map,
                   std::unique_ptr<Aggregator> aggregator, Clock& clock)
    : config_(config),
      rank_(rank),
      clock_(clock),
      map_num_buckets_(shard_map.num_buckets()),
      map_(std::make_shared<const ShardMap>(shard_map)),
      aggregator_(std::move(aggregator)),
      access_(shard_map.num_buckets(), SparseTableNames(config), clock),
      pace_(config_.ServerProfileOf(rank), clock, clock.Now()),
      paced_(config_.ServerProfileOf(rank) != nullptr),
      readers_("ps-reader", paced_ ? TaskPool::kUnbounded
                                   : static_cast<size_t>(std::max(
                                         1.0, std::ceil(ReadCpuLimit().cpus)))),
      seen_(config.num_workers()),
      seen_maps_(config.num_workers()) {
  for (int w = 0; w < config_.num_workers(); ++w) {
    live_.push_back(static_cast<uint32_t>(w));
  }
  if (config_.ServerProfileOf(rank) != nullptr) {
    spdlog::info("server {}: {}", rank, pace_.Describe());
  }
}

SparseTable* PsServer::sparse_table(const std::string& name) const {
  auto it = sparse_.find(name);
  return it == sparse_.end() ? nullptr : it->second.get();
}

DenseTable* PsServer::dense_table(const std::string& name) const {
  auto it = dense_.find(name);
  return it == dense_.end() ? nullptr : it->second.get();
}

ShardMap PsServer::shard_map() const {
  absl::MutexLock lock(&map_mu_);
  return *map_;
}

uint64_t PsServer::map_version() const {
  absl::MutexLock lock(&map_mu_);
  return map_->version();
}

absl::Status PsServer::CheckKeys(const std::string& table,
                                 std::span<const uint64_t> keys,
                                 const ShardMap::RequestClock& at,
                                 uint64_t split_version,
                                 ReadCheck* read) const {
  if (keys.size() > config_.server.max_keys_per_request) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "table '", table, "': request has ", keys.size(),
        " keys, the limit is ", config_.server.max_keys_per_request,
        " (server.max_keys_per_request); split the request"));
  }
  std::shared_ptr<const ShardMap> map;
  std::shared_ptr<const absl::flat_hash_set<uint32_t>> handed;
  {
    absl::MutexLock lock(&map_mu_);
    map = map_;
    handed = handed_;
  }
  // 0: a request that does not say, split by the first map.
  split_version = std::max<uint64_t>(split_version, 1);
  if (read == nullptr && !map->SplitHolds(split_version, at)) {
    return absl::AbortedError(absl::StrCat(
        kMovedPrefix, "table '", table, "': keys split by shard map version ",
        split_version, ", but version ", map->version(),
        " moves buckets at worker ", at.worker, "'s clock ", at.clock,
        "; refresh the shard map and split again"));
  }
  if (map->num_servers() == 1) return absl::OkStatus();
  for (uint64_t key : keys) {
    const uint32_t owner = map->ServerAt(key, at);
    if (owner != rank_ && read != nullptr) {
      const uint32_t bucket = map->BucketOf(key);
      const auto pending = map->pending().find(bucket);
      if (pending != map->pending().end() && pending->second.from == rank_) {
        if (auto s = CheckLeavingRead(table, key, *map, pending->second,
                                      handed.get(), at, read->clock);
            !s.ok()) {
          return s;
        }
        read->leaving.push_back(bucket);
        continue;
      }
    }
    if (owner != rank_ && split_version < map->version()) {
      // Split by an older map for a bucket whose handover has since
      // settled: the client's map is out of date.
      return absl::AbortedError(absl::StrCat(
          kMovedPrefix, "table '", table, "': key ", key, " is server ", owner,
          "'s in shard map version ", map->version(),
          " (the request was split by version ", split_version,
          "); refresh the shard map and split again"));
    }
    if (owner == rank_ && handed != nullptr &&
        handed->contains(map->BucketOf(key))) {
      // Before the cut, but the rows have left: only a request that broke
      // PsClient's order (a clock's requests after the next clock's) gets
      // here; once the move settles its new owner serves it.
      return absl::AbortedError(absl::StrCat(
          kMovedPrefix, "table '", table, "': key ", key,
          " was handed over to server ", map->owner(map->BucketOf(key)),
          "; refresh the shard map and split again"));
    }
    if (owner != rank_) {
      return absl::FailedPreconditionError(
          absl::StrCat("table '", table, "': key ", key, " belongs to server ",
                       owner, ", not ", rank_, " (shard map version ",
                       map->version(), "); refresh the shard map"));
    }
  }
  if (read != nullptr) {
    std::sort(read->leaving.begin(), read->leaving.end());
    read->leaving.erase(std::unique(read->leaving.begin(), read->leaving.end()),
                        read->leaving.end());
  }
  return absl::OkStatus();
}

absl::StatusOr<uint64_t> PsServer::JobClock(uint32_t worker,
                                            uint32_t incarnation,
                                            uint64_t clock) {
  // Ids index per-worker state here and in the aggregator: a peer must not
  // grow it at will.
  const uint64_t workers = static_cast<uint64_t>(config_.num_workers());
  if (worker >= workers && worker != kReaderId) {
    return absl::InvalidArgumentError(
        absl::StrCat("worker_id ", worker, " out of range: the job has ",
                     workers, " workers"));
  }
  absl::MutexLock lock(&incarnations_mu_);
  auto [it, first] = incarnations_.try_emplace(worker);
  Incarnation& known = it->second;
  if (first) {
    known.number = incarnation;
  } else if (incarnation < known.number) {
    return absl::FailedPreconditionError(
        absl::StrCat("worker ", worker, ": incarnation ", incarnation,
                     " was replaced by incarnation ", known.number,
                     " (a newer process of this rank registered)"));
  } else if (incarnation > known.number) {
    const uint64_t rejoin = aggregator_->RejoinClock(worker);
    known.number = incarnation;
    known.offset = rejoin > clock ? rejoin - clock : 0;
    spdlog::info(
        "worker {} restarted (incarnation {}): its clock {} continues as {}",
        worker, incarnation, clock, clock + known.offset);
  }
  return clock + known.offset;
}

void PsServer::AdmitThenRead(grpc::ServerContextBase* context,
                             uint32_t worker_id, uint64_t clock, uint32_t ahead,
                             Read read,
                             std::function<void(absl::Status)> done) {
  // Shared: AdmitPull drops its callback when it decides at once.
  auto then =
      std::make_shared<std::pair<Read, std::function<void(absl::Status)>>>(
          std::move(read), std::move(done));
  // The caller's own deadline cancels the call (IsCancelled), so only the
  // server's bound needs a time here.
  std::optional<absl::Status> now = aggregator_->AdmitPull(
      {.worker_id = worker_id,
       .clock = clock,
       .ahead = ahead,
       .deadline =
           clock_.Now() + absl::Seconds(config_.server.sync_wait_timeout_s),
       .cancelled = [context] { return context->IsCancelled(); }},
      [this, then](absl::Status admitted) {
        readers_.Run([then, admitted = std::move(admitted)] {
          then->second(admitted.ok() ? then->first() : admitted);
        });
      });
  if (now) then->second(now->ok() ? then->first() : *now);
}

std::function<void(absl::Status)> PsServer::TimedPull(Done done) {
  return [this, start = clock_.Now(),
          done = std::move(done)](absl::Status status) {
    pull_latency_.Observe(clock_.Now() - start);
    done(ToGrpcStatus(status));
  };
}

void PsServer::PullSparse(grpc::ServerContextBase* context,
                          const rpc::PullSparseRequest* request_ptr,
                          PullSparseReply* reply, Done done) {
  auto finish = TimedPull(std::move(done));
  const rpc::PullSparseRequest& request = *request_ptr;
  if (auto s = CheckProtocolVersion(request.protocol_version(), "pull");
      !s.ok()) {
    return finish(s);
  }
  SparseTable* table = sparse_table(request.table());
  if (table == nullptr) {
    return finish(absl::NotFoundError(
        absl::StrCat("unknown sparse table '", request.table(), "'")));
  }
  if (request.dim() != table->dim()) {
    return finish(absl::InvalidArgumentError(
        absl::StrCat("table '", request.table(), "' has dim ", table->dim(),
                     ", request says ", request.dim())));
  }
  if (request.keys().size() % sizeof(uint64_t) != 0) {
    return finish(absl::InvalidArgumentError(
        absl::StrCat("table '", request.table(), "': keys field has ",
                     request.keys().size(), " bytes, not a multiple of 8")));
  }
  if (request.ahead() > 1) {
    return finish(absl::InvalidArgumentError(
        absl::StrCat("pull: ahead ", request.ahead(),
                     ": a pull reads at most one step ahead (0 or 1)")));
  }
  // A dense slice asked for along (PullSparseRequest.dense_table).
  DenseTable* dense = nullptr;
  if (!request.dense_table().empty()) {
    dense = dense_table(request.dense_table());
    if (dense == nullptr) {
      return finish(absl::NotFoundError(
          absl::StrCat("unknown dense table '", request.dense_table(), "'")));
    }
    if (request.dense_size() != dense->config().dim) {
      return finish(absl::InvalidArgumentError(absl::StrCat(
          "table '", request.dense_table(), "' has size ", dense->config().dim,
          ", request says ", request.dense_size())));
    }
  }
  // The keys, viewed in place (copied when misaligned): shared with the
  // read, which may run later.
  auto scratch = std::make_shared<std::vector<uint64_t>>();
  std::span<const uint64_t> keys = ViewAs<uint64_t>(request.keys(), *scratch);
  const ShardMap::RequestClock at = AtOf(request);
  NoteRequest(at, request.map_version());
  // An async read may be served by whoever holds the rows, before the
  // cut and past it alike (CheckLeavingRead): a move being prepared holds
  // it in the other modes only.
  if (auto s = AwaitMoves(context, at, {},
                          /*hold=*/config_.mode != ConsistencyMode::kAsync);
      !s.ok()) {
    return finish(s);
  }
  ReadCheck check;
  check.clock = at.clock + request.ahead();
  if (auto s =
          CheckKeys(request.table(), keys, at, request.map_version(), &check);
      !s.ok()) {
    return finish(s);
  }
  if (auto s = AwaitMoves(context, at, keys, /*hold=*/false); !s.ok()) {
    return finish(s);
  }
  auto clock =
      JobClock(request.worker_id(), request.incarnation(), request.clock());
  if (!clock.ok()) return finish(clock.status());
  // The push these rows serve: a pull ahead reads for the next one.
  Read read = [this, &request, reply, table, dense, keys, scratch,
               leaving = std::move(check.leaving),
               serves = *clock + request.ahead()] {
    return ReadWhileHere(leaving, [&] {
      rpc::PullSparseResponse* response = &reply->message;
      TellMap(request.map_version(), response);
      reply->rows = TensorSlice<float>(keys.size() * table->dim());
      const std::span<float> out = reply->rows.data;
      if (config_.client.hot_rows.enabled) {
        // The rows' version, taken before they are read: an apply during the
        // read can only make them newer than it says.
        const uint64_t applies = aggregator_->applied_rounds();
        response->set_applied_rounds(applies);
        response->set_max_read_lag(ReadLagBound());
        RecordRead(request.worker_id(), serves, applies);
      }
      const ServerPace::Work work = pace_.Begin();
      aggregator_->PullSparse(request.worker_id(), table, keys, out);
      access_.Record(Access::kPull, table->config().name, keys,
                     table->dim() * sizeof(float), pace_.Pace(work));
      if (dense != nullptr) {
        ReadDense(request.worker_id(), dense, response->mutable_dense());
      }
      return absl::OkStatus();
    });
  };
  AdmitThenRead(context, request.worker_id(), *clock, request.ahead(),
                std::move(read), std::move(finish));
}

void PsServer::ReadDense(uint32_t worker_id, DenseTable* table,
                         rpc::PullDenseResponse* response) {
  response->set_offset(table->offset());
  const ServerPace::Work work = pace_.Begin();
  aggregator_->PullDense(
      worker_id, table,
      ResizeAs<float>(response->mutable_values(), table->length()));
  access_.RecordOther(pace_.Pace(work));
}

void PsServer::PullDense(grpc::ServerContextBase* context,
                         const rpc::PullDenseRequest* request_ptr,
                         rpc::PullDenseResponse* response, Done done) {
  auto finish = TimedPull(std::move(done));
  const rpc::PullDenseRequest& request = *request_ptr;
  if (auto s = CheckProtocolVersion(request.protocol_version(), "pull");
      !s.ok()) {
    return finish(s);
  }
  DenseTable* table = dense_table(request.table());
  if (table == nullptr) {
    return finish(absl::NotFoundError(
        absl::StrCat("unknown dense table '", request.table(), "'")));
  }
  if (request.size() != table->config().dim) {
    return finish(absl::InvalidArgumentError(
        absl::StrCat("table '", request.table(), "' has size ",
                     table->config().dim, ", request says ", request.size())));
  }
  auto clock =
      JobClock(request.worker_id(), request.incarnation(), request.clock());
  if (!clock.ok()) return finish(clock.status());
  Read read = [this, &request, response, table] {
    ReadDense(request.worker_id(), table, response);
    return absl::OkStatus();
  };
  AdmitThenRead(context, request.worker_id(), *clock, /*ahead=*/0,
                std::move(read), std::move(finish));
}

absl::Status PsServer::DoPush(grpc::ServerContextBase* context,
                              const rpc::PushRequest& request,
                              std::span<const PushedGradient> gradients,
                              const std::function<void()>& accepted) {
  if (auto s = CheckProtocolVersion(request.protocol_version(), "push");
      !s.ok()) {
    return s;
  }
  if (request.batch_size() == 0) {
    return absl::InvalidArgumentError("push: batch_size must be >= 1");
  }
  if (request.worker_id() == kReaderId) {
    return absl::InvalidArgumentError(
        "push: worker_id is the read-only client's (kReaderId)");
  }
  const ShardMap::RequestClock at = AtOf(request);
  NoteRequest(at, request.map_version());
  if (auto s = AwaitMoves(context, at, {}, /*hold=*/true); !s.ok()) return s;
  PushView view;
  view.worker_id = request.worker_id();

  view.batch_size = request.batch_size();
  // Scratch copies for payloads that arrive misaligned; they must outlive
  // the views, hence one per gradient, reserved so they never move.
  std::vector<std::vector<uint64_t>> key_scratch(gradients.size());
  std::vector<std::vector<float>> value_scratch(gradients.size());
  for (size_t g = 0; g < gradients.size(); ++g) {
    const rpc::TableGradient& grad = *gradients[g].message;
    const std::string_view grad_keys = gradients[g].keys;
    const std::string_view grad_values = gradients[g].values;
    const bool encoded = grad.codec() != 0;
    if (encoded && !grad_keys.empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat("table '", grad.table(),
                       "': an encoded gradient carries its keys in "
                       "its payload, but the keys field is set"));
    }
    if (!encoded && grad_values.size() % sizeof(float) != 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("table '", grad.table(), "': values field has ",
                       grad_values.size(), " bytes, not a multiple of 4"));
    }
    std::span<const float> values;
    if (!encoded) values = ViewAs<float>(grad_values, value_scratch[g]);
    // (Encoded values are decoded, then checked.)
    const bool checked = !encoded && gradients[g].finite;
    // A decode failure names the table; nothing of the push is applied.
    auto refused = [&](const absl::Status& s) {
      return absl::InvalidArgumentError(
          absl::StrCat("table '", grad.table(), "': codec ", grad.codec(),
                       " payload: ", s.message()));
    };
    if (SparseTable* table = sparse_table(grad.table())) {
      if (grad.dim() != table->dim()) {
        return absl::InvalidArgumentError(
            absl::StrCat("table '", grad.table(), "' has dim ", table->dim(),
                         ", push says ", grad.dim()));
      }
      std::span<const uint64_t> keys;
      if (encoded) {
        if (auto s =
                DecodeRows(grad_values, static_cast<uint32_t>(table->dim()),
                           config_.server.max_keys_per_request, &key_scratch[g],
                           &value_scratch[g]);
            !s.ok()) {
          return refused(s);
        }
        keys = key_scratch[g];
        values = value_scratch[g];
      } else {
        if (grad_keys.size() % sizeof(uint64_t) != 0) {
          return absl::InvalidArgumentError(
              absl::StrCat("table '", grad.table(), "': keys field has ",
                           grad_keys.size(), " bytes, not a multiple of 8"));
        }
        keys = ViewAs<uint64_t>(grad_keys, key_scratch[g]);
      }
      if (values.size() != keys.size() * table->dim()) {
        return absl::InvalidArgumentError(absl::StrCat(
            "table '", grad.table(), "': ", keys.size(), " keys × dim ",
            table->dim(), " need ", keys.size() * table->dim(),
            " values, push has ", values.size()));
      }
      if (auto s = CheckKeys(grad.table(), keys, at, request.map_version());
          !s.ok()) {
        return s;
      }
      if (!checked) {
        if (auto s = CheckFinite(grad.table(), values); !s.ok()) return s;
      }
      view.sparse.push_back({table, keys, values});
    } else if (DenseTable* table = dense_table(grad.table())) {
      if (!grad_keys.empty()) {
        return absl::InvalidArgumentError(absl::StrCat(
            "table '", grad.table(), "' is dense; push carries keys"));
      }
      if (encoded) {
        value_scratch[g].resize(table->length());
        if (auto s = DecodeDense(grad_values, value_scratch[g]); !s.ok()) {
          return refused(s);
        }
        values = value_scratch[g];
      }
      if (values.size() != table->length()) {
        return absl::InvalidArgumentError(absl::StrCat(
            "table '", grad.table(), "': this server holds ", table->length(),
            " values [", table->offset(), ", ",
            table->offset() + table->length(), "), push has ", values.size()));
      }
      if (!checked) {
        if (auto s = CheckFinite(grad.table(), values); !s.ok()) return s;
      }
      view.dense.push_back({table, values});
    } else {
      return absl::NotFoundError(
          absl::StrCat("unknown table '", grad.table(), "'"));
    }
  }
  // A bucket moving here whose rows are not in yet takes the push all the
  // same: its table sets those rows' gradients aside until they arrive
  // (HoldPushesOfRowsNotHere).
  auto clock =
      JobClock(request.worker_id(), request.incarnation(), request.clock());
  if (!clock.ok()) return clock.status();
  view.clock = *clock;
  const ServerPace::Work work = pace_.Begin();
  // The record of a push's kept rows is made before its answer, early or
  // not: what the worker learns from the answer includes it.
  bool recorded = false;
  auto record_cached = [&] {
    if (request.has_oldest_read()) {
      RecordCachedPush(request.worker_id(), *clock, request.oldest_read());
    }
    recorded = true;
  };
  std::function<void()> on_accepted;
  if (accepted) {
    on_accepted = [&] {
      record_cached();
      accepted();
    };
  }
  absl::Status pushed = aggregator_->Push(view, on_accepted);
  if (!pushed.ok()) return pushed;
  if (!recorded) record_cached();
  // The push's service time, shared by its sparse rows.
  const absl::Duration service = pace_.Pace(work);
  size_t rows = 0;
  for (const PushView::Sparse& sparse : view.sparse) rows += sparse.keys.size();
  if (rows == 0) access_.RecordOther(service);
  for (const PushView::Sparse& sparse : view.sparse) {
    access_.Record(Access::kPush, sparse.table->config().name, sparse.keys,
                   sparse.table->dim() * sizeof(float),
                   service * (static_cast<double>(sparse.keys.size()) / rows));
  }
  return absl::OkStatus();
}

uint64_t PsServer::ReadLagBound() const {
  const HotRowsConfig& hot_rows = config_.client.hot_rows;
  if (hot_rows.max_lag > 0) return hot_rows.max_lag;
  if (config_.mode == ConsistencyMode::kSemiAsync) {
    return aggregator_->window();
  }
  return static_cast<uint64_t>(config_.num_workers());
}

void PsServer::RecordRead(uint32_t worker, uint64_t clock, uint64_t applies) {
  absl::MutexLock lock(&reads_mu_);
  StepRead& read = step_reads_[worker][clock % 2];
  if (read.clock != clock) read = {clock, applies};
}

void PsServer::RecordCachedPush(uint32_t worker, uint64_t clock,
                                uint64_t oldest_read) {
  const uint64_t bound = ReadLagBound();
  absl::MutexLock lock(&reads_mu_);
  auto it = step_reads_.find(worker);
  // A step that pulled nothing here: its reads are judged against the
  // applies now, which only makes the lag larger.
  const uint64_t read_at =
      it != step_reads_.end() && it->second[clock % 2].clock == clock
          ? it->second[clock % 2].applies
          : aggregator_->applied_rounds();
  const uint64_t lag = read_at > oldest_read ? read_at - oldest_read : 0;
  ++cached_pushes_;
  ++read_lag_counts_[std::min<uint64_t>(lag, kReadLagBuckets - 1)];
  max_read_lag_ = std::max(max_read_lag_, lag);
  if (lag > bound) ++read_lag_violations_;
}

grpc::Status PsServer::Push(grpc::ServerContextBase* context,
                            const ReceivedPush& push,
                            rpc::PushResponse* response,
                            const std::function<void()>& answer_early) {
  const rpc::PushRequest& request = push.message;
  if (push.gradients.size() != static_cast<size_t>(request.gradients_size())) {
    return grpc::Status(grpc::StatusCode::INTERNAL,
                        "push: gradients parsed apart from their tensors");
  }
  std::vector<PushedGradient> gradients;
  gradients.reserve(push.gradients.size());
  for (size_t g = 0; g < push.gradients.size(); ++g) {
    const ReceivedPush::Tensors& t = push.gradients[g];
    gradients.push_back(
        {&request.gradients(static_cast<int>(g)),
         {reinterpret_cast<const char*>(t.keys.begin()), t.keys.size()},
         {reinterpret_cast<const char*>(t.values.begin()), t.values.size()},
         t.finite});
  }
  return Push(context, request, gradients, response, answer_early);
}

grpc::Status PsServer::Push(grpc::ServerContextBase* context,
                            const rpc::PushRequest* request,
                            rpc::PushResponse* response) {
  std::vector<PushedGradient> gradients;
  gradients.reserve(request->gradients_size());
  for (const rpc::TableGradient& g : request->gradients()) {
    gradients.push_back({&g, g.keys(), g.values(), /*finite=*/false});
  }
  return Push(context, *request, gradients, response, {});
}

grpc::Status PsServer::Push(grpc::ServerContextBase* context,
                            const rpc::PushRequest& request,
                            std::span<const PushedGradient> gradients,
                            rpc::PushResponse* response,
                            const std::function<void()>& answer_early) {
  const absl::Time start = clock_.Now();
  std::function<void()> accepted;
  if (answer_early) {
    accepted = [&] {
      // This push counted, as it will be when this worker reads next (its
      // pulls wait for the apply); applies of other pushes that end
      // meanwhile are not, as they would be in an answer after the apply.
      response->set_applied_rounds(aggregator_->applied_rounds() + 1);
      TellMap(request.map_version(), response);
      answer_early();
    };
  }
  // (push_latency_ holds the whole handling, the apply after an early
  // answer included.)
  absl::Status status = DoPush(context, request, gradients, accepted);
  push_latency_.Observe(clock_.Now() - start);
  if (IsMovedError(status)) {
    spdlog::debug("push from worker {} refused: {}", request.worker_id(),
                  status.ToString());
  } else if (!status.ok()) {
    spdlog::warn("push from worker {} refused: {}", request.worker_id(),
                 status.ToString());
  }
  response->set_applied_rounds(aggregator_->applied_rounds());
  TellMap(request.map_version(), response);
  return ToGrpcStatus(status);
}

grpc::Status PsServer::GetTableInfo(grpc::ServerContextBase*,
                                    const rpc::TableInfoRequest* request,
                                    rpc::TableInfoResponse* response) {
  if (auto s = CheckProtocolVersion(request->protocol_version(), "table info");
      !s.ok()) {
    return ToGrpcStatus(s);
  }
  if (!request->table().empty() && sparse_table(request->table()) == nullptr &&
      dense_table(request->table()) == nullptr) {
    return grpc::Status(grpc::StatusCode::NOT_FOUND,
                        absl::StrCat("unknown table '", request->table(), "'"));
  }
  *response = Info();
  if (!request->table().empty()) {
    auto* tables = response->mutable_tables();
    for (int i = tables->size() - 1; i >= 0; --i) {
      if (tables->Get(i).schema().name() != request->table()) {
        tables->DeleteSubrange(i, 1);
      }
    }
  }
  return grpc::Status::OK;
}

rpc::TableInfoResponse PsServer::Info() const {
  rpc::TableInfoResponse response;
  response.set_server_rank(rank_);
  response.set_applied_rounds(aggregator_->applied_rounds());
  response.set_mode(ConsistencyModeName(config_.mode));
  shard_map().ToProto(response.mutable_shard_map());
  for (const TableConfig& config : config_.tables) {
    rpc::TableInfo* info = response.add_tables();
    ToSchemaProto(config, info->mutable_schema());
    if (SparseTable* table = sparse_table(config.name)) {
      info->set_rows(table->size());
      info->set_row_bytes(sizeof(uint64_t) +
                          sizeof(float) *
                              (table->dim() + table->state_width()));
      const SparseTable::PlanCounts plans = table->plan_counts();
      info->set_plans_kept(plans.kept);
      info->set_plans_found(plans.found);
    } else if (DenseTable* table = dense_table(config.name)) {
      info->set_rows(table->length());
      info->set_dense_offset(table->offset());
    }
  }
  *response.mutable_stats() = aggregator_->Stats();
  response.mutable_stats()->set_cpu_s(ProcessCpuSeconds());
  const CpuLimit cpu = ReadCpuLimit();
  response.mutable_stats()->set_allowed_cpus(cpu.cpus);
  response.mutable_stats()->set_quota_periods(cpu.periods);
  response.mutable_stats()->set_throttled_periods(cpu.throttled);
  if (config_.client.hot_rows.enabled) {
    rpc::AggregatorStats* stats = response.mutable_stats();
    stats->set_read_lag_bound(ReadLagBound());
    absl::MutexLock lock(&reads_mu_);
    stats->set_cached_pushes(cached_pushes_);
    *stats->mutable_read_lag_counts() = {read_lag_counts_.begin(),
                                         read_lag_counts_.end()};
    stats->set_max_read_lag(max_read_lag_);
    stats->set_read_lag_violations(read_lag_violations_);
  }
  pull_latency_.ToProto(response.mutable_pull_latency());
  push_latency_.ToProto(response.mutable_push_latency());
  access_.ToProto(response.mutable_access());
  absl::MutexLock lock(&metrics_mu_);
  response.set_metrics_endpoint(metrics_endpoint_);
  return response;
}

grpc::Status PsServer::UpdateMembership(grpc::ServerContextBase*,
                                        const rpc::MembershipUpdate* request,
                                        rpc::MembershipAck*) {
  if (auto s = CheckProtocolVersion(request->protocol_version(), "membership");
      !s.ok()) {
    return ToGrpcStatus(s);
  }
  std::vector<uint32_t> live(request->live_workers().begin(),
                             request->live_workers().end());
  spdlog::info(
      "membership epoch {}: {} live workers{}", request->epoch(), live.size(),
      request->window() > 0 && config_.mode == ConsistencyMode::kSemiAsync
          ? absl::StrCat(", window ", request->window())
          : "");
  aggregator_->UpdateMembership(request->epoch(), live);
  {
    absl::MutexLock lock(&move_mu_);
    if (request->epoch() > live_epoch_) {
      live_epoch_ = request->epoch();
      live_ = live;
    }
  }
  if (request->window() > 0) aggregator_->SetWindow(request->window());
  return grpc::Status::OK;
}

grpc::Status PsServer::Save(grpc::ServerContextBase*,
                            const rpc::SaveRequest* request,
                            rpc::SaveResponse* response) {
  if (auto s = CheckProtocolVersion(request->protocol_version(), "save");
      !s.ok()) {
    return ToGrpcStatus(s);
  }
  if (!save_) {
    return ToGrpcStatus(absl::FailedPreconditionError(
        absl::StrCat("server ", rank_,
                     ": no checkpoint.dir configured, nothing to save to")));
  }
  auto path = save_();
  if (!path.ok()) return ToGrpcStatus(path.status());
  response->set_path(*path);
  return grpc::Status::OK;
}

}  // namespace hetps
