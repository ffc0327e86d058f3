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

absl::Status PsServer::AwaitMoves(grpc::ServerContextBase* context,
                                  const ShardMap::RequestClock& at,
                                  std::span<const uint64_t> keys) {
  const bool worker = at.worker < seen_.size();
  const uint64_t packed = PackAt(at.incarnation, at.clock);
  if (keys.empty() && worker) {
    std::atomic<uint64_t>& seen = seen_[at.worker];
    uint64_t old = seen.load();
    while (old < packed && !seen.compare_exchange_weak(old, packed)) {
    }
  }
  if (!moving_.load()) return absl::OkStatus();
  absl::MutexLock lock(&move_mu_);
  if (t_no_blocking && MustWait(at, keys)) {
    return absl::UnavailableError(
        absl::StrCat("server ", rank_,
                     ": a bucket move began as this request arrived; "
                     "retry"));
  }
  const absl::Time deadline = absl::Now() + kMoveWait;
  while (MustWait(at, keys)) {
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
                        std::span<const uint64_t> keys) const {
  if (keys.empty()) {
    return at.worker < seen_.size() && hold_from_.has_value() &&
           PackAt(at.incarnation, at.clock) >= (*hold_from_)[at.worker];
  }
  if (incoming_.empty()) return false;
  for (uint64_t key : keys) {
    if (incoming_.contains(BucketOfKey(key, map_num_buckets_))) return true;
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
  if (config_.mode != ConsistencyMode::kSync || at.worker >= seen_.size()) {
    // Async and semi_async read what was applied, and a pull past the cut
    // whose own push went to the new owner comes only once that push was
    // answered, after the rows left. The reader is no worker.
    return absl::OkStatus();
  }
  // Sync: a read at clock c sees the pushes before c, all made before the
  // cut (one clock for every worker) only while c is at most the cut.
  const auto named = pending.cut.find(at.worker);
  if (named != pending.cut.end() &&
      named->second.incarnation == at.incarnation &&
      read_clock <= named->second.clock) {
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
  if (hold_from_.has_value()) return true;
  absl::MutexLock map_lock(&map_mu_);
  for (const auto& [bucket, pending] : map_->pending()) {
    if (pending.from == rank_ || map_->owner(bucket) == rank_) return true;
  }
  return false;
}

bool PsServer::AdoptMap(ShardMap map,
                        const absl::flat_hash_set<uint32_t>& arrived_here) {
  absl::flat_hash_set<uint32_t> stale;  // rows to drop
  if (!AdoptMapLocked(std::move(map), arrived_here, &stale)) return false;
  if (!stale.empty()) {
    uint64_t dropped = 0;
    for (const auto& [name, table] : sparse_) {
      dropped += table->ExtractRows(
          [&](uint64_t key) {
            return stale.contains(BucketOfKey(key, map_num_buckets_));
          },
          [](uint64_t, std::span<const float>, std::span<const float>,
             uint64_t) {});
    }
    spdlog::info(
        "server {}: {} rows of {} buckets handed over before this process "
        "started dropped",
        rank_, dropped, stale.size());
  }
  return true;
}

bool PsServer::AdoptMapLocked(ShardMap map,
                              const absl::flat_hash_set<uint32_t>& arrived_here,
                              absl::flat_hash_set<uint32_t>* stale) {
  absl::MutexLock lock(&move_mu_);
  {
    absl::MutexLock map_lock(&map_mu_);
    if (map.version() <= map_->version()) return false;
    // Handed over from here, settled, but not by this process's HandOver.
    for (const auto& [bucket, pending] : map_->pending()) {
      if (pending.from == rank_ && !map.pending().contains(bucket) &&
          map.owner(bucket) != rank_ &&
          (handed_ == nullptr || !handed_->contains(bucket))) {
        stale->insert(bucket);
      }
    }
  }
  arrived_.insert(arrived_here.begin(), arrived_here.end());
  // The buckets that move here wait for their rows before the map that
  // sends their requests here is in force.
  absl::flat_hash_set<uint32_t> incoming;
  absl::flat_hash_set<uint32_t> arrived;
  for (const auto& [bucket, pending] : map.pending()) {
    if (map.owner(bucket) != rank_) continue;
    if (arrived_.contains(bucket)) {
      arrived.insert(bucket);
    } else {
      incoming.insert(bucket);
    }
  }
  incoming_ = std::move(incoming);
  arrived_ = std::move(arrived);
  hold_from_.reset();
  moving_ = !incoming_.empty();
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
      if (handed_ == nullptr) {
        last_handed_.clear();
        last_handed_rows_.reset();
      }
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
      // Past the newest seen (the cut will be there or later); a worker
      // never seen here waits from its first request.
      (*hold_from_)[w] = seen == 0 ? 1 : seen + 1;
    }
    if (seen == 0) continue;
    const ShardMap::WorkerCut at = Unpack(seen);
    rpc::WorkerCut* out = response->add_seen();
    out->set_worker(w);
    out->set_incarnation(at.incarnation);
    out->set_clock(at.clock);
  }
  for (uint32_t w : live_) response->add_live_workers(w);
  shard_map().ToProto(response->mutable_shard_map());
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
  // Every live worker is past the cut (the mover checked): its pushes
  // before it were answered, so applied (sync closes a round in the push
  // that completes it); semi_async's queue is applied below.
  absl::flat_hash_set<uint32_t> buckets;
  for (uint32_t bucket : request.buckets()) {
    const auto it = map.pending().find(bucket);
    if (it == map.pending().end() || it->second.from != rank_) {
      return absl::FailedPreconditionError(absl::StrCat(
          "server ", rank_, ": bucket ", bucket,
          " is not being handed over from here in shard map version ",
          map.version()));
    }
    buckets.insert(bucket);
  }
  std::vector<uint32_t> asked(request.buckets().begin(),
                              request.buckets().end());
  std::sort(asked.begin(), asked.end());
  {
    absl::MutexLock map_lock(&map_mu_);
    size_t gone = 0;
    for (uint32_t bucket : asked) {
      gone += handed_ != nullptr && handed_->contains(bucket) ? 1 : 0;
    }
    if (gone > 0) {
      // A retry (the reply to the first was lost): the same rows again.
      if (asked == last_handed_ && last_handed_rows_ != nullptr) {
        return *last_handed_rows_;
      }
      return absl::FailedPreconditionError(absl::StrCat(
          "server ", rank_, ": ", gone, " of the ", asked.size(),
          " buckets asked for were handed over already, by another "
          "HandOver"));
    }
  }
  rpc::MovedRows rows;
  for (uint32_t bucket : request.buckets()) rows.add_buckets(bucket);
  const uint32_t num_buckets = map.num_buckets();
  {
    // After the reads of these buckets running here (ReadWhileHere); none
    // begins after.
    absl::WriterMutexLock handover_lock(&handover_mu_);
    absl::MutexLock map_lock(&map_mu_);
    auto handed =
        handed_ != nullptr
            ? std::make_shared<absl::flat_hash_set<uint32_t>>(*handed_)
            : std::make_shared<absl::flat_hash_set<uint32_t>>();
    handed->insert(buckets.begin(), buckets.end());
    handed_ = std::move(handed);
  }
  const absl::Time began = absl::Now();
  // semi_async's queue applied, the rows hold every gradient pushed for
  // these buckets: every push before the cut was answered, and none can
  // come here now (a push past the cut goes to the new owner, a request
  // split by an older map is refused, and reads of these buckets stopped
  // above). So the rows are taken while other buckets' pushes, applies and
  // pulls go on: each stripe is locked only while it is visited (a save
  // waits for the move to settle: RunWithoutMoves).
  aggregator_->ApplyQueued();
  uint64_t extracted = 0;
  for (const auto& [name, table] : sparse_) {
    rpc::MovedTable* moved = rows.add_tables();
    moved->set_table(name);
    std::vector<uint64_t> keys;
    std::vector<float> weights;
    std::vector<float> state;
    table->ExtractRows(
        [&](uint64_t key) {
          return buckets.contains(BucketOfKey(key, num_buckets));
        },
        [&](uint64_t key, std::span<const float> w, std::span<const float> s,
            uint64_t updates) {
          keys.push_back(key);
          weights.insert(weights.end(), w.begin(), w.end());
          state.insert(state.end(), s.begin(), s.end());
          moved->add_update_counts(updates);
        });
    AssignBytes<uint64_t>(moved->mutable_keys(), keys);
    AssignBytes<float>(moved->mutable_weights(), weights);
    AssignBytes<float>(moved->mutable_state(), state);
    extracted += keys.size();
  }
  spdlog::info(
      "server {}: handed over {} buckets, {} rows ({:.1f} MB) in "
      "{:.1f} ms",
      rank_, request.buckets_size(), extracted, rows.ByteSizeLong() / 1e6,
      absl::ToDoubleMilliseconds(absl::Now() - began));
  absl::MutexLock map_lock(&map_mu_);
  last_handed_ = std::move(asked);
  last_handed_rows_ = std::make_shared<const rpc::MovedRows>(rows);
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
  // to an earlier TakeOver was lost, and its requests may have been applied
  // since) is not installed again.
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
  absl::MutexLock lock(&move_mu_);
  for (uint32_t bucket : fresh) {
    incoming_.erase(bucket);
    arrived_.insert(bucket);
  }
  moving_ = hold_from_.has_value() || !incoming_.empty();
  move_changed_.SignalAll();
  return installed;
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
