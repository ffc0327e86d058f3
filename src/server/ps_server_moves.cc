// PsServer's part in live bucket migration (docs/ARCHITECTURE.md, "Live
// bucket migration"): the gates every request passes, and the four calls
// the BucketMover makes.
#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/bytes.h"
#include "common/logging.h"
#include "common/status.h"
#include "server/ps_server.h"

namespace hetps {
namespace {

// The longest a request waits at a gate before it is answered UNAVAILABLE
// (the client retries).
constexpr absl::Duration kMoveWait = absl::Seconds(30);
// The longest RunWithoutMoves waits for the moves involving this server to
// settle (a move step takes milliseconds; a failed one stays open).
constexpr absl::Duration kMoveSettleWait = absl::Seconds(60);

// (incarnation, clock) as one number that grows with both, plus one so that
// 0 means "never seen".
uint64_t PackAt(uint32_t incarnation, uint64_t clock) {
  return ((uint64_t{incarnation} << 40) | clock) + 1;
}
ShardMap::WorkerCut Unpack(uint64_t packed) {
  const uint64_t v = packed - 1;
  return {.incarnation = static_cast<uint32_t>(v >> 40),
          .clock = v & ((uint64_t{1} << 40) - 1)};
}

}  // namespace

namespace {
// Set while a NoBlockingScope lives on this thread.
thread_local bool t_no_blocking = false;
}  // namespace

PsServer::NoBlockingScope::NoBlockingScope() : outer_(t_no_blocking) {
  t_no_blocking = true;
}

PsServer::NoBlockingScope::~NoBlockingScope() { t_no_blocking = outer_; }

void PsServer::NoteRequest(const ShardMap::RequestClock& at,
                           uint64_t map_version) {
  if (at.worker >= seen_.size()) return;  // the reader, or out of range
  auto raise = [](std::atomic<uint64_t>& newest, uint64_t value) {
    uint64_t old = newest.load();
    while (old < value && !newest.compare_exchange_weak(old, value)) {
    }
  };
  raise(seen_[at.worker], PackAt(at.incarnation, at.clock));
  raise(seen_maps_[at.worker], map_version);
}

absl::Status PsServer::AwaitMoves(grpc::ServerContextBase* context,
                                  const ShardMap::RequestClock& at,
                                  std::span<const uint64_t> keys, bool hold) {
  if ((keys.empty() && !hold) || !moving_.load()) return absl::OkStatus();
  absl::MutexLock lock(&move_mu_);
  if (t_no_blocking && MustWait(at, keys, hold)) {
    return absl::UnavailableError(
        absl::StrCat("server ", rank_,
                     ": a bucket move began as this request arrived; "
                     "retry"));
  }
  const absl::Time deadline = absl::Now() + kMoveWait;
  while (MustWait(at, keys, hold)) {
    if (context != nullptr && context->IsCancelled()) {
      return absl::CancelledError("the call was cancelled");
    }
    if (absl::Now() >= deadline) {
      return absl::UnavailableError(absl::StrCat(
          "server ", rank_, ": ",
          keys.empty() ? "a shard map move is being prepared"
                       : "rows of a bucket moving here have not arrived",
          " after ", absl::FormatDuration(kMoveWait), "; retry"));
    }
    move_changed_.WaitWithTimeout(&move_mu_, absl::Milliseconds(50));
  }
  return absl::OkStatus();
}

bool PsServer::MustWait(const ShardMap::RequestClock& at,
                        std::span<const uint64_t> keys, bool hold) const {
  if (keys.empty()) {
    return hold && at.worker < seen_.size() && hold_from_.has_value() &&
           PackAt(at.incarnation, at.clock) >= (*hold_from_)[at.worker];
  }
  if (incoming_.empty()) return false;
  for (uint64_t key : keys) {
    const uint32_t bucket = BucketOfKey(key, map_num_buckets_);
    if (incoming_.contains(bucket) && !arrived_.contains(bucket)) return true;
  }
  return false;
}

absl::Status PsServer::CheckLeavingRead(
    const std::string& table, uint64_t key, const ShardMap& map,
    const ShardMap::Pending& pending,
    const absl::flat_hash_set<uint32_t>* handed,
    const ShardMap::RequestClock& at, uint64_t read_clock) const {
  const uint32_t bucket = map.BucketOf(key);
  const uint32_t to = map.owner(bucket);
  if (handed != nullptr && handed->contains(bucket)) {
    return absl::AbortedError(
        absl::StrCat(kMovedPrefix, "table '", table, "': key ", key,
                     " was handed over to server ", to, "; read it there"));
  }
  if (config_.mode == ConsistencyMode::kAsync || at.worker >= seen_.size()) {
    // Async reads what was applied; the reader is no worker.
    return absl::OkStatus();
  }
  // The pushes past the cut (one clock for every worker) go to the new
  // owner, which applies them once the rows are in. Sync: a read at clock
  // c sees the pushes before c, all made here only while c is at most the
  // cut. Semi_async: a read at c may miss the pushes from c - window on
  // (SemiAsyncAggregator's bound), so it is served here while c is at most
  // the cut plus the window.
  const uint64_t slack =
      config_.mode == ConsistencyMode::kSemiAsync ? aggregator_->window() : 0;
  const auto named = pending.cut.find(at.worker);
  if (named != pending.cut.end() &&
      named->second.incarnation == at.incarnation &&
      read_clock <= named->second.clock + slack) {
    return absl::OkStatus();
  }
  return absl::AbortedError(absl::StrCat(
      kMovedPrefix, "table '", table, "': key ", key, " read at clock ",
      read_clock, " must see pushes that went to server ", to,
      " past its handover's cut; read it there"));
}

absl::Status PsServer::ReadWhileHere(
    const std::vector<uint32_t>& leaving,
    const std::function<absl::Status()>& read) {
  if (leaving.empty()) return read();
  absl::ReaderMutexLock handover_lock(&handover_mu_);
  {
    absl::MutexLock map_lock(&map_mu_);
    for (uint32_t bucket : leaving) {
      const auto pending = map_->pending().find(bucket);
      if (pending == map_->pending().end() || pending->second.from != rank_ ||
          (handed_ != nullptr && handed_->contains(bucket))) {
        return absl::AbortedError(absl::StrCat(
            kMovedPrefix, "bucket ", bucket, " was handed over to server ",
            map_->owner(bucket), " as it was read here; read it there"));
      }
    }
  }
  return read();
}

absl::Status PsServer::RunWithoutMoves(const std::function<void()>& fn) {
  {
    absl::MutexLock lock(&move_mu_);
    const absl::Time deadline = absl::Now() + kMoveSettleWait;
    while (saving_ || MoveInvolvesThisServer()) {
      if (absl::Now() >= deadline) {
        return absl::UnavailableError(
            absl::StrCat("server ", rank_,
                         ": a bucket move to or from it did not settle in ",
                         absl::FormatDuration(kMoveSettleWait)));
      }
      move_changed_.WaitWithTimeout(&move_mu_, absl::Milliseconds(50));
    }
    saving_ = true;
  }
  fn();
  absl::MutexLock lock(&move_mu_);
  saving_ = false;
  move_changed_.SignalAll();
  return absl::OkStatus();
}

bool PsServer::MoveInvolvesThisServer() const {
  if (hold_from_.has_value() || dropping_ > 0) return true;
  absl::MutexLock map_lock(&map_mu_);
  for (const auto& [bucket, pending] : map_->pending()) {
    if (pending.from == rank_ || map_->owner(bucket) == rank_) return true;
  }
  return false;
}

bool PsServer::AdoptMap(ShardMap map,
                        const absl::flat_hash_set<uint32_t>& arrived_here) {
  absl::flat_hash_set<uint32_t> settled_away;  // rows to drop
  if (!AdoptMapLocked(std::move(map), arrived_here, &settled_away)) {
    return false;
  }
  if (settled_away.empty()) return true;
  {
    // A read of these buckets that passed its checks under the older map
    // ends first; one after refuses them (ReadWhileHere: not pending).
    absl::WriterMutexLock handover_lock(&handover_mu_);
  }
  std::vector<bool> drop(map_num_buckets_, false);
  for (uint32_t bucket : settled_away) drop[bucket] = true;
  uint64_t dropped = 0;
  for (const auto& [name, table] : sparse_) {
    dropped += table->ExtractRows(
        [&](std::span<const uint64_t> keys, std::span<bool> take) {
          MarkKeysInBuckets(drop, keys, take);
        },
        [](auto&&...) {});
  }
  spdlog::debug("server {}: {} rows of {} buckets that moved away dropped",
                rank_, dropped, settled_away.size());
  absl::MutexLock lock(&move_mu_);
  --dropping_;
  move_changed_.SignalAll();
  return true;
}

bool PsServer::AdoptMapLocked(ShardMap map,
                              const absl::flat_hash_set<uint32_t>& arrived_here,
                              absl::flat_hash_set<uint32_t>* settled_away) {
  absl::MutexLock lock(&move_mu_);
  {
    absl::MutexLock map_lock(&map_mu_);
    if (map.version() <= map_->version()) return false;
    // Handed over from here and settled: the rows stayed here until now
    // (or came back from a checkpoint, in a process restarted since).
    for (const auto& [bucket, pending] : map_->pending()) {
      if (pending.from == rank_ && !map.pending().contains(bucket) &&
          map.owner(bucket) != rank_) {
        settled_away->insert(bucket);
      }
    }
  }
  arrived_.insert(arrived_here.begin(), arrived_here.end());
  // The buckets that move here: their requests wait from before the map
  // that sends them here is in force until the move settles (the rows
  // arrive in between).
  absl::flat_hash_set<uint32_t> incoming;
  absl::flat_hash_set<uint32_t> arrived;
  for (const auto& [bucket, pending] : map.pending()) {
    if (map.owner(bucket) != rank_) continue;
    incoming.insert(bucket);
    if (arrived_.contains(bucket)) arrived.insert(bucket);
  }
  incoming_ = std::move(incoming);
  arrived_ = std::move(arrived);
  // Before the map is in force: no push of these buckets can meet rows
  // that are not here.
  hold_from_.reset();
  HoldPushesOfRowsNotHere();
  if (!settled_away->empty()) ++dropping_;
  {
    absl::MutexLock map_lock(&map_mu_);
    if (handed_ != nullptr) {
      absl::flat_hash_set<uint32_t> still;
      for (uint32_t bucket : *handed_) {
        const auto it = map.pending().find(bucket);
        if (it != map.pending().end() && it->second.from == rank_) {
          still.insert(bucket);
        }
      }
      handed_ = still.empty()
                    ? nullptr
                    : std::make_shared<const absl::flat_hash_set<uint32_t>>(
                          std::move(still));
    }
    map_ = std::make_shared<const ShardMap>(std::move(map));
  }
  move_changed_.SignalAll();
  return true;
}

grpc::Status PsServer::PrepareMove(grpc::ServerContextBase*,
                                   const rpc::PrepareMoveRequest* request,
                                   rpc::PrepareMoveResponse* response) {
  if (auto s = CheckProtocolVersion(request->protocol_version(), "move");
      !s.ok()) {
    return ToGrpcStatus(s);
  }
  if (request->hold_ahead() > kMaxHoldAhead) {
    return ToGrpcStatus(absl::InvalidArgumentError(
        absl::StrCat("prepare move: hold_ahead ", request->hold_ahead(),
                     " is more than ", kMaxHoldAhead, " clocks")));
  }
  absl::MutexLock lock(&move_mu_);
  if (request->hold()) {
    // A checkpoint being written holds exactly this server's buckets: the
    // move waits for it.
    const absl::Time deadline = absl::Now() + kMoveWait;
    while (saving_) {
      if (absl::Now() >= deadline) {
        return ToGrpcStatus(absl::UnavailableError(absl::StrCat(
            "server ", rank_, ": a checkpoint is still being written after ",
            absl::FormatDuration(kMoveWait))));
      }
      move_changed_.WaitWithTimeout(&move_mu_, absl::Milliseconds(50));
    }
    // Read after the hold is set (under move_mu_, which every request
    // past its notes takes while moving_): a request not held was noted
    // before, so its clock is at most what is read here.
    moving_ = true;
    hold_from_.emplace(seen_.size());
  }
  for (uint32_t w = 0; w < seen_.size(); ++w) {
    const uint64_t seen = seen_[w].load();
    if (request->hold()) {
      // Past the newest seen, and as far ahead as the mover asks (the cut
      // will be there or later); a worker never seen here waits from its
      // first request.
      (*hold_from_)[w] = seen == 0 ? 1 : seen + 1 + request->hold_ahead();
    }
    if (seen == 0) continue;
    const ShardMap::WorkerCut at = Unpack(seen);
    rpc::WorkerCut* out = response->add_seen();
    out->set_worker(w);
    out->set_incarnation(at.incarnation);
    out->set_clock(at.clock);
    out->set_map_version(seen_maps_[w].load());
  }
  for (uint32_t w : live_) response->add_live_workers(w);
  // Only the mover's first call wants the map: the others poll, every
  // millisecond of a move, for the workers' clocks.
  if (request->hold()) shard_map().ToProto(response->mutable_shard_map());
  return grpc::Status::OK;
}

grpc::Status PsServer::AdoptShardMap(grpc::ServerContextBase*,
                                     const rpc::AdoptShardMapRequest* request,
                                     rpc::AdoptShardMapResponse* response) {
  if (auto s = CheckProtocolVersion(request->protocol_version(), "move");
      !s.ok()) {
    return ToGrpcStatus(s);
  }
  auto map = ShardMap::FromProto(request->shard_map());
  if (!map.ok()) return ToGrpcStatus(map.status());
  const ShardMap current = shard_map();
  if (map->num_servers() != current.num_servers() ||
      map->num_buckets() != current.num_buckets()) {
    return ToGrpcStatus(absl::InvalidArgumentError(
        absl::StrCat("shard map of ", map->num_servers(), " servers and ",
                     map->num_buckets(), " buckets; this job has ",
                     current.num_servers(), " and ", current.num_buckets())));
  }
  if (AdoptMap(*std::move(map))) {
    spdlog::debug("server {}: shard map version {}", rank_, map_version());
  }
  response->set_version(map_version());
  return grpc::Status::OK;
}

absl::StatusOr<rpc::MovedRows> PsServer::DoHandOver(
    const rpc::HandOverRequest& request) {
  const ShardMap map = shard_map();
  const uint32_t num_buckets = map.num_buckets();
  std::vector<bool> handing(num_buckets, false);
  for (uint32_t bucket : request.buckets()) {
    const auto it = map.pending().find(bucket);
    if (it == map.pending().end() || it->second.from != rank_) {
      return absl::FailedPreconditionError(absl::StrCat(
          "server ", rank_, ": bucket ", bucket,
          " is not being handed over from here in shard map version ",
          map.version()));
    }
    handing[bucket] = true;
  }
  rpc::MovedRows rows;
  for (uint32_t bucket : request.buckets()) rows.add_buckets(bucket);
  if (request.give_up()) {
    // The new owners hold the rows, the pushes past the cut applied. Once
    // the reads of these buckets running here are done (ReadWhileHere),
    // none is served here again: the new owners serve them from the
    // settled map on. The rows stay until then (AdoptMap drops them), so
    // a HandOver made again copies the same rows.
    absl::WriterMutexLock handover_lock(&handover_mu_);
    absl::MutexLock map_lock(&map_mu_);
    auto handed =
        handed_ != nullptr
            ? std::make_shared<absl::flat_hash_set<uint32_t>>(*handed_)
            : std::make_shared<absl::flat_hash_set<uint32_t>>();
    handed->insert(request.buckets().begin(), request.buckets().end());
    handed_ = std::move(handed);
    return rows;
  }
  const absl::Time began = absl::Now();
  // Every live worker is past the cut (the mover checked): its pushes
  // before it were answered, so applied (sync closes a round in the push
  // that completes it) once semi_async's queue is applied here. None can
  // come here now (a push past the cut goes to the new owner, a request
  // split by an older map is refused), so the rows are final: they are
  // copied while reads of them, and every other bucket's traffic, go on
  // (each stripe is locked only while it is visited; a save waits for the
  // move to settle: RunWithoutMoves). A read may make a fresh row of a key
  // meanwhile: it has the initial values the new owner would give it.
  aggregator_->ApplyQueued();
  uint64_t copied = 0;
  for (const auto& [name, table] : sparse_) {
    rpc::MovedTable* moved = rows.add_tables();
    moved->set_table(name);
    std::vector<uint64_t> keys;
    std::vector<float> weights;
    std::vector<float> state;
    table->ForEachRowWithState(
        [&](uint64_t key, std::span<const float> w, std::span<const float> s,
            uint64_t updates) {
          keys.push_back(key);
          weights.insert(weights.end(), w.begin(), w.end());
          state.insert(state.end(), s.begin(), s.end());
          moved->add_update_counts(updates);
        },
        [&](std::span<const uint64_t> keys, std::span<bool> take) {
          MarkKeysInBuckets(handing, keys, take);
        });
    AssignBytes<uint64_t>(moved->mutable_keys(), keys);
    AssignBytes<float>(moved->mutable_weights(), weights);
    AssignBytes<float>(moved->mutable_state(), state);
    copied += keys.size();
  }
  spdlog::info(
      "server {}: copied {} buckets, {} rows ({:.1f} MB) for their new "
      "owners in {:.1f} ms",
      rank_, request.buckets_size(), copied, rows.ByteSizeLong() / 1e6,
      absl::ToDoubleMilliseconds(absl::Now() - began));
  return rows;
}

grpc::Status PsServer::HandOver(grpc::ServerContextBase*,
                                const rpc::HandOverRequest* request,
                                rpc::MovedRows* response) {
  if (auto s = CheckProtocolVersion(request->protocol_version(), "move");
      !s.ok()) {
    return ToGrpcStatus(s);
  }
  auto rows = DoHandOver(*request);
  if (!rows.ok()) return ToGrpcStatus(rows.status());
  *response = *std::move(rows);
  return grpc::Status::OK;
}

absl::StatusOr<uint64_t> PsServer::DoTakeOver(const rpc::MovedRows& rows) {
  const ShardMap map = shard_map();
  for (uint32_t bucket : rows.buckets()) {
    const auto it = map.pending().find(bucket);
    if (it == map.pending().end() || map.owner(bucket) != rank_) {
      return absl::FailedPreconditionError(absl::StrCat(
          "server ", rank_, ": bucket ", bucket,
          " is not moving here in shard map version ", map.version()));
    }
  }
  // Validated whole before a row is installed.
  for (const rpc::MovedTable& moved : rows.tables()) {
    SparseTable* table = sparse_table(moved.table());
    if (table == nullptr) {
      return absl::NotFoundError(
          absl::StrCat("moved rows of unknown table '", moved.table(), "'"));
    }
    const size_t n = moved.keys().size() / sizeof(uint64_t);
    if (moved.keys().size() != n * sizeof(uint64_t) ||
        moved.weights().size() != n * table->dim() * sizeof(float) ||
        moved.state().size() != n * table->state_width() * sizeof(float) ||
        static_cast<size_t>(moved.update_counts_size()) != n) {
      return absl::InvalidArgumentError(absl::StrCat(
          "moved rows of table '", moved.table(), "' are not ", n,
          " rows of dim ", table->dim(), " with state ", table->state_width()));
    }
  }
  // One TakeOver at a time; a bucket whose rows arrived already (the reply
  // to an earlier TakeOver was lost; or its move record restored them, and
  // a restarted old owner's copy is older) is not installed again.
  absl::MutexLock take_lock(&take_over_mu_);
  absl::flat_hash_set<uint32_t> fresh;
  {
    absl::MutexLock lock(&move_mu_);
    for (uint32_t bucket : rows.buckets()) {
      if (!arrived_.contains(bucket)) fresh.insert(bucket);
    }
  }
  if (fresh.empty()) return 0;
  if (record_moved_in_) {
    if (absl::Status s = record_moved_in_(rows, map.version()); !s.ok()) {
      spdlog::error(
          "server {}: the rows moved here are not written down ({}); a "
          "restore from checkpoints loses them",
          rank_, s.message());
    }
  }
  uint64_t installed = 0;
  for (const rpc::MovedTable& moved : rows.tables()) {
    SparseTable* table = sparse_table(moved.table());
    std::vector<uint64_t> key_scratch;
    std::vector<float> weight_scratch, state_scratch;
    auto keys = ViewAs<uint64_t>(moved.keys(), key_scratch);
    auto weights = ViewAs<float>(moved.weights(), weight_scratch);
    auto state = ViewAs<float>(moved.state(), state_scratch);
    const uint64_t dim = table->dim();
    const uint64_t width = table->state_width();
    for (size_t i = 0; i < keys.size(); ++i) {
      if (!fresh.contains(BucketOfKey(keys[i], map_num_buckets_))) continue;
      table->RestoreRow(keys[i], weights.subspan(i * dim, dim),
                        state.subspan(i * width, width),
                        moved.update_counts(static_cast<int>(i)));
      ++installed;
    }
  }
  // The pushes set aside for these rows are applied now, before any push
  // that follows, and before any read here: the rows hold every push made
  // before the cut and every one past it, so reads of them are served here
  // from now on, also while the old owner still serves the reads before
  // the cut (and in semi_async a window past it) until it gives them up.
  absl::MutexLock lock(&move_mu_);
  arrived_.insert(fresh.begin(), fresh.end());
  HoldPushesOfRowsNotHere();
  return installed;
}

void PsServer::HoldPushesOfRowsNotHere() {
  auto held = std::make_shared<absl::flat_hash_set<uint32_t>>();
  for (uint32_t bucket : incoming_) {
    if (!arrived_.contains(bucket)) held->insert(bucket);
  }
  // Requests run inline again (RunsInline) once no read can wait here.
  moving_ = hold_from_.has_value() || !held->empty();
  std::function<bool(uint64_t)> holds;
  if (!held->empty()) {
    holds = [held, buckets = map_num_buckets_](uint64_t key) {
      return held->contains(BucketOfKey(key, buckets));
    };
  }
  for (const auto& [name, table] : sparse_) table->HoldPushes(holds);
}

grpc::Status PsServer::TakeOver(grpc::ServerContextBase*,
                                const rpc::TakeOverRequest* request,
                                rpc::TakeOverResponse* response) {
  if (auto s = CheckProtocolVersion(request->protocol_version(), "move");
      !s.ok()) {
    return ToGrpcStatus(s);
  }
  auto installed = DoTakeOver(request->rows());
  if (!installed.ok()) return ToGrpcStatus(installed.status());
  response->set_rows(*installed);
  return grpc::Status::OK;
}

}  // namespace hetps
