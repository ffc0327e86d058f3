// PsServer: the ParameterServer gRPC service of one server rank. Owns this
// rank's shard of every table and the Aggregator of the job's mode.
//
// Every handler checks the protocol version, then validates the whole request
// (table names, dimensions, sizes, key ownership, finite values) before any
// table is touched, so a bad request changes nothing. Codes:
//   FAILED_PRECONDITION  protocol version mismatch; key owned by another
//                        server (the message names the shard-map version)
//   NOT_FOUND            unknown table
//   INVALID_ARGUMENT     wrong dimension, length mismatch, NaN/Inf gradient
//   RESOURCE_EXHAUSTED   more keys than server.max_keys_per_request
//   DEADLINE_EXCEEDED    a sync pull whose round did not close in time
//   ABORTED              "moved: ...": the request was split by a shard map
//                        that no longer holds at its clock; nothing was
//                        served or applied (refresh the map, split again)
//   UNAVAILABLE          rows of a moving bucket did not arrive in time
//
// The handlers are called in process (tests) or by PsService, the gRPC
// callback service in front of it (ps_service.h). A pull hands its caller a
// callback: one that must wait for its round or the SSP bound waits in the
// Aggregator without a thread, and its rows are read on this server's
// reader threads once it may go.
//
// Thread-safety: handlers run concurrently, on any threads.
#pragma once

#include <array>
#include <atomic>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "common/clock.h"
#include "common/slices.h"
#include "common/task_pool.h"
#include "common/tensor_calls.h"
#include "hetps.grpc.pb.h"
#include "hetps/config.h"
#include "server/aggregator.h"
#include "server/latency.h"
#include "server/server_pace.h"
#include "shard/access_stats.h"
#include "shard/shard_map.h"
#include "table/dense_table.h"
#include "table/sparse_table.h"

namespace hetps {

// A PullSparse answer: the response without its rows, and the rows in a
// slice of their own, which PsService sends as the response's `values`
// without copying them (common/slices.h).
struct PullSparseReply {
  rpc::PullSparseResponse message;
  TensorSlice<float> rows;
};

class PsServer final {
 public:
  // Receives a pull's status, once, on whatever thread answered it.
  using Done = std::function<void(grpc::Status)>;

  // `config` must be validated; `rank` < config.num_servers().
  // `semi_async_window`: the window semi_async starts with (the server node
  // passes the coordinator's initial window; it sends changes later).
  // Pulls wait (sync rounds, the SSP bound) on `clock`.
  static absl::StatusOr<std::unique_ptr<PsServer>> Create(
      const JobConfig& config, uint32_t rank, uint32_t semi_async_window = 2,
      Clock& clock = Clock::Real());

  // Fill `response` and call `done`: on the calling thread when the pull
  // may be answered at once (or is refused), else later on a reader
  // thread. They block the caller only while a bucket move holds the
  // request (see RunsInline). `context` (its cancellation) and the request
  // and response must stay valid until `done`.
  void PullSparse(grpc::ServerContextBase* context,
                  const rpc::PullSparseRequest* request,
                  PullSparseReply* response, Done done);
  void PullDense(grpc::ServerContextBase* context,
                 const rpc::PullDenseRequest* request,
                 rpc::PullDenseResponse* response, Done done);
  // A push as the service parsed it (ParsePush), or as a message.
  //
  // With `answer_early`, a push the aggregator applies on arrival (async)
  // is answered before its apply ends: once accepted, `response` is filled
  // and `answer_early` called, and the apply follows on this thread; Push
  // then returns OK, which the caller does not answer again. The pushing
  // worker's pulls wait for the apply (Aggregator::Push).
  grpc::Status Push(grpc::ServerContextBase* context, const ReceivedPush& push,
                    rpc::PushResponse* response,
                    const std::function<void()>& answer_early = {});
  grpc::Status Push(grpc::ServerContextBase* context,
                    const rpc::PushRequest* request,
                    rpc::PushResponse* response);
  grpc::Status GetTableInfo(grpc::ServerContextBase* context,
                            const rpc::TableInfoRequest* request,
                            rpc::TableInfoResponse* response);
  grpc::Status UpdateMembership(grpc::ServerContextBase* context,
                                const rpc::MembershipUpdate* request,
                                rpc::MembershipAck* response);
  grpc::Status Save(grpc::ServerContextBase* context,
                    const rpc::SaveRequest* request,
                    rpc::SaveResponse* response);
  // Live bucket migration (ps_server_moves.cc).
  grpc::Status PrepareMove(grpc::ServerContextBase* context,
                           const rpc::PrepareMoveRequest* request,
                           rpc::PrepareMoveResponse* response);
  grpc::Status AdoptShardMap(grpc::ServerContextBase* context,
                             const rpc::AdoptShardMapRequest* request,
                             rpc::AdoptShardMapResponse* response);
  grpc::Status HandOver(grpc::ServerContextBase* context,
                        const rpc::HandOverRequest* request,
                        rpc::MovedRows* response);
  grpc::Status TakeOver(grpc::ServerContextBase* context,
                        const rpc::TakeOverRequest* request,
                        rpc::TakeOverResponse* response);

  // Whether requests may be handled on the caller's thread (gRPC's callback
  // threads): no move is prepared and no rows are on their way here (a
  // request may wait for those), and the server is no emulated slower
  // machine (its handlers sleep).
  // Otherwise PsService hands them to threads that may block.
  bool RunsInline() const { return !moving_.load() && !paced_; }
  // While one lives, the calling thread must not block (PsService sets it
  // around a request it runs on gRPC's callback threads): a request that
  // would wait for a bucket move after all (one began after RunsInline
  // said no) is refused with UNAVAILABLE instead. Nothing of it has been
  // applied then; the client retries, and PsService, seeing the move, runs
  // the retry on a thread that may wait.
  class NoBlockingScope {
   public:
    NoBlockingScope();
    ~NoBlockingScope();
    NoBlockingScope(const NoBlockingScope&) = delete;
    NoBlockingScope& operator=(const NoBlockingScope&) = delete;

   private:
    const bool outer_;
  };

  // What Save calls (the server's Checkpointer); unset: FAILED_PRECONDITION.
  void SetSaveHandler(std::function<absl::StatusOr<std::string>()> save) {
    save_ = std::move(save);
  }
  // Runs `fn` while no bucket move involves this server: after the moves to
  // or from it have settled (and a move being prepared has its map), and
  // holding off the next move's PrepareMove until `fn` returns. A checkpoint
  // saved in `fn` holds exactly the buckets this server's map gives it.
  // UNAVAILABLE when a move does not settle within kMoveSettleWait.
  absl::Status RunWithoutMoves(const std::function<void()>& fn);
  // Called by TakeOver with the rows moved here and the map version that
  // moves them, before they are installed (the Checkpointer writes them
  // down, so that a restore finds them). An error is logged; the rows are
  // installed all the same.
  void SetMovedInRecorder(
      std::function<absl::Status(const rpc::MovedRows&, uint64_t)> record) {
    record_moved_in_ = std::move(record);
  }
  // Aggregator::RunBetweenApplies.
  void RunBetweenApplies(const std::function<void(uint64_t)>& fn) {
    aggregator_->RunBetweenApplies(fn);
  }
  // The Checkpointer restored the tables: Aggregator::TablesRestored.
  void TablesRestored() { aggregator_->TablesRestored(); }

  // In-process access (tests, status). Null when absent.
  SparseTable* sparse_table(const std::string& name) const;
  DenseTable* dense_table(const std::string& name) const;
  uint32_t rank() const { return rank_; }
  // The shard map now: a copy (AdoptShardMap may replace it).
  ShardMap shard_map() const;
  uint64_t map_version() const;
  // Takes `map` if it is newer than the one held (returns whether it did);
  // the reads of buckets it moves here wait until their rows arrive (by
  // TakeOver), the pushes are held until then, and a PrepareMove hold
  // ends. `arrived`: buckets moving here whose rows are in the tables
  // already (a restarted server that restored them from its move record).
  // The rows of buckets whose move away from here it settles are dropped.
  bool AdoptMap(ShardMap map,
                const absl::flat_hash_set<uint32_t>& arrived = {});
  uint64_t applied_rounds() const { return aggregator_->applied_rounds(); }
  AggregatorStats aggregator_stats() const { return aggregator_->Stats(); }
  // What GetTableInfo answers for all tables: rows, queue, latencies.
  rpc::TableInfoResponse Info() const;
  // host:port of this server's /metrics (set once it serves them), reported
  // in Info() so that status and the dashboard can name it.
  void SetMetricsEndpoint(std::string endpoint) {
    absl::MutexLock lock(&metrics_mu_);
    metrics_endpoint_ = std::move(endpoint);
  }

 private:
  PsServer(const JobConfig& config, uint32_t rank, ShardMap shard_map,
           std::unique_ptr<Aggregator> aggregator, Clock& clock);

  // A pull's end from now on: records its latency and calls `done`.
  std::function<void(absl::Status)> TimedPull(Done done);
  // A pull's table reads, once it is admitted (PullSparse, PullDense).
  using Read = std::function<absl::Status()>;
  // Admits a pull of `worker_id` at job clock `clock`, `ahead` steps ahead
  // (Aggregator::AdmitPull), then runs `read` — at once on this thread, or
  // on a reader thread after waiting — and calls `done` with the outcome.
  void AdmitThenRead(grpc::ServerContextBase* context, uint32_t worker_id,
                     uint64_t clock, uint32_t ahead, Read read,
                     std::function<void(absl::Status)> done);
  // Reads this server's slice of `table` into `response` for an admitted
  // pull of `worker_id` (PullDense, or along a PullSparse).
  void ReadDense(uint32_t worker_id, DenseTable* table,
                 rpc::PullDenseResponse* response);
  // One gradient of a push: `message` names the table (and codec); its
  // raw keys and values are `keys` and `values`, wherever they are kept;
  // `finite`: the values were checked already, and are all finite.
  struct PushedGradient {
    const rpc::TableGradient* message;
    std::string_view keys;
    std::string_view values;
    bool finite;
  };
  grpc::Status Push(grpc::ServerContextBase* context,
                    const rpc::PushRequest& request,
                    std::span<const PushedGradient> gradients,
                    rpc::PushResponse* response,
                    const std::function<void()>& answer_early);
  // `accepted`: as Aggregator::Push's.
  absl::Status DoPush(grpc::ServerContextBase* context,
                      const rpc::PushRequest& request,
                      std::span<const PushedGradient> gradients,
                      const std::function<void()>& accepted);
  // What CheckKeys needs to know of a pull, and tells of it.
  struct ReadCheck {
    // The clock its rows must be current to: the pull's, plus `ahead`.
    uint64_t clock = 0;
    // Out: the buckets it reads past their cut that are on their way from
    // here (ShardMap::ReaderOf): ReadWhileHere reads them.
    std::vector<uint32_t> leaving;
  };
  // Keys of a request at `at` split by map `split_version`: within the size
  // limit (RESOURCE_EXHAUSTED), split by a map that still holds at `at`
  // (ABORTED, kMovedPrefix), each this server's at `at`
  // (FAILED_PRECONDITION). A pull (`read` set) is checked key by key, not
  // by its split: a key of a bucket leaving here is read here past the cut
  // while its rows are here and, in sync, while every push the read must
  // see came before the cut; otherwise ABORTED (kMovedPrefix), and the
  // client asks the new owner.
  absl::Status CheckKeys(const std::string& table,
                         std::span<const uint64_t> keys,
                         const ShardMap::RequestClock& at,
                         uint64_t split_version,
                         ReadCheck* read = nullptr) const;
  // A read at `at` (current to `read_clock`) of `key`, whose bucket is
  // `pending` from here in `map`, past its cut: OK to serve here, or
  // ABORTED (kMovedPrefix) naming the new owner.
  absl::Status CheckLeavingRead(const std::string& table, uint64_t key,
                                const ShardMap& map,
                                const ShardMap::Pending& pending,
                                const absl::flat_hash_set<uint32_t>* handed,
                                const ShardMap::RequestClock& at,
                                uint64_t read_clock) const;
  // Runs `read` unless one of `leaving` (ReadCheck::leaving) was given up
  // or settled since it was checked (ABORTED, kMovedPrefix): a HandOver
  // giving them up, and the drop of their rows, wait for the reads running
  // here.
  absl::Status ReadWhileHere(const std::vector<uint32_t>& leaving,
                             const std::function<absl::Status()>& read);
  // Sets a pull's or push's answer's map_version, and its shard_map too
  // when the request was split by an older map (0: it does not say).
  template <typename Response>
  void TellMap(uint64_t split_version, Response* response) const {
    std::shared_ptr<const ShardMap> map;
    {
      absl::MutexLock lock(&map_mu_);
      map = map_;
    }
    response->set_map_version(map->version());
    if (split_version > 0 && split_version < map->version()) {
      map->ToProto(response->mutable_shard_map());
    }
  }
  template <typename Request>
  static ShardMap::RequestClock AtOf(const Request& request) {
    return {.worker = request.worker_id(),
            .incarnation = request.incarnation(),
            .clock = request.clock()};
  }
  // Notes `at` as its worker's newest request, split by map `map_version`
  // (what PrepareMove reports; ps_server_moves.cc). Before AwaitMoves.
  void NoteRequest(const ShardMap::RequestClock& at, uint64_t map_version);
  // The migration gates of a request at `at` (ps_server_moves.cc). With no
  // keys, and `hold`: while a move is prepared, holds a request at or past
  // its worker's hold point until the new map is adopted. With a pull's keys
  // (checked to be this server's; `hold` unused): waits until the rows of
  // those moving here have arrived (a push waits for none: its rows'
  // gradients are held, HoldPushes).
  // UNAVAILABLE after kMoveWait (the client retries), CANCELLED with the
  // call.
  absl::Status AwaitMoves(grpc::ServerContextBase* context,
                          const ShardMap::RequestClock& at,
                          std::span<const uint64_t> keys, bool hold);
  bool MustWait(const ShardMap::RequestClock& at,
                std::span<const uint64_t> keys, bool hold) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(move_mu_);
  // A move is being prepared, or one to or from this server is pending.
  bool MoveInvolvesThisServer() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(move_mu_);
  absl::StatusOr<rpc::MovedRows> DoHandOver(
      const rpc::HandOverRequest& request);
  // AdoptMap's part under the locks; `settled_away`: the buckets whose
  // rows to drop once they are released.
  bool AdoptMapLocked(ShardMap map,
                      const absl::flat_hash_set<uint32_t>& arrived_here,
                      absl::flat_hash_set<uint32_t>* settled_away);
  absl::StatusOr<uint64_t> DoTakeOver(const rpc::MovedRows& rows);
  // Every sparse table sets aside the pushes of the buckets moving here
  // whose rows have not arrived (SparseTable::HoldPushes), and applies
  // those it held for the others; moving_ says whether any is left (or a
  // move is prepared).
  void HoldPushesOfRowsNotHere() ABSL_EXCLUSIVE_LOCKS_REQUIRED(move_mu_);
  // The aggregator's clock for a request of `worker` at `clock` from its
  // `incarnation` (RegisterResponse.incarnation). The first incarnation this
  // server sees keeps its clocks; a newer one (the worker restarted, its
  // clocks back at 0) is moved to Aggregator::RejoinClock; an older one is
  // refused with FAILED_PRECONDITION.
  absl::StatusOr<uint64_t> JobClock(uint32_t worker, uint32_t incarnation,
                                    uint64_t clock);

  // Constant after construction.
  const JobConfig config_;
  const uint32_t rank_;
  Clock& clock_;
  const uint32_t map_num_buckets_;  // fixed for the job
  mutable absl::Mutex map_mu_;
  std::shared_ptr<const ShardMap> map_ ABSL_GUARDED_BY(map_mu_);
  // Held shared by a read of buckets leaving here (ReadWhileHere), and by
  // HandOver while it marks them given up: no read of a bucket runs here
  // once it is given up.
  absl::Mutex handover_mu_ ABSL_ACQUIRED_BEFORE(map_mu_);
  // Buckets this server gave up (HandOver give_up) whose move has not
  // settled (null: none): their new owners hold the rows, and reads of
  // them are refused here. The rows are dropped when the move settles.
  std::shared_ptr<const absl::flat_hash_set<uint32_t>> handed_
      ABSL_GUARDED_BY(map_mu_);

  const std::unique_ptr<Aggregator> aggregator_;
  absl::flat_hash_map<std::string, std::unique_ptr<SparseTable>> sparse_;
  absl::flat_hash_map<std::string, std::unique_ptr<DenseTable>> dense_;
  std::function<absl::StatusOr<std::string>()> save_;  // set before serving
  // Set before serving.
  std::function<absl::Status(const rpc::MovedRows&, uint64_t)> record_moved_in_;

  LatencyHistogram pull_latency_;
  LatencyHistogram push_latency_;
  AccessRecorder access_;  // rows, bytes and hot keys of sparse requests
  ServerPace pace_;        // server_profiles: an emulated slower machine
  const bool paced_;       // pace_ has a profile
  // Read the rows of pulls that waited: one thread per CPU this process
  // may use (its affinity and cgroup quota), or as many as wait at once on
  // an emulated slower machine (whose reads sleep).
  TaskPool readers_;

  // Live bucket migration. Per worker the newest (incarnation, clock) of a
  // request, packed (PackAt) so that a larger number is a later request,
  // and the newest shard map version its requests were split by.
  std::vector<std::atomic<uint64_t>> seen_;
  std::vector<std::atomic<uint64_t>> seen_maps_;
  // True while a move is prepared or rows are on their way here: requests
  // take move_mu_ only then.
  std::atomic<bool> moving_{false};
  mutable absl::Mutex move_mu_;
  absl::CondVar move_changed_;
  // While a move is prepared: per worker, the packed clock from which its
  // requests wait for the new map.
  std::optional<std::vector<uint64_t>> hold_from_ ABSL_GUARDED_BY(move_mu_);
  // Buckets the map moves here, pending: their reads wait and their pushes
  // are held until the rows arrive. Of those, the buckets whose rows have
  // arrived.
  absl::flat_hash_set<uint32_t> incoming_ ABSL_GUARDED_BY(move_mu_);
  absl::flat_hash_set<uint32_t> arrived_ ABSL_GUARDED_BY(move_mu_);
  absl::Mutex take_over_mu_;  // one TakeOver at a time
  // RunWithoutMoves is running `fn`: PrepareMove waits.
  bool saving_ ABSL_GUARDED_BY(move_mu_) = false;
  // AdoptMap calls dropping the rows of buckets that moved away: a save
  // waits.
  int dropping_ ABSL_GUARDED_BY(move_mu_) = 0;
  uint64_t live_epoch_ ABSL_GUARDED_BY(move_mu_) = 0;
  std::vector<uint32_t> live_ ABSL_GUARDED_BY(move_mu_);

  mutable absl::Mutex metrics_mu_;
  std::string metrics_endpoint_ ABSL_GUARDED_BY(metrics_mu_);

  // The workers' hot-row caches (client.hot_rows): the most applies a
  // cached row may lag the worker's pull of its step.
  uint64_t ReadLagBound() const;
  // Records a pull's version for `worker` at job clock `clock`: the first
  // pull of a clock is the step's.
  void RecordRead(uint32_t worker, uint64_t clock, uint64_t applies);
  // A push at job clock `clock` computed from rows as old as `oldest_read`.
  void RecordCachedPush(uint32_t worker, uint64_t clock, uint64_t oldest_read);

  struct StepRead {
    uint64_t clock = ~uint64_t{0};
    uint64_t applies = 0;
  };
  // read_lag_counts[i]: pushes whose reads lagged i applies (the last entry
  // every larger lag).
  static constexpr size_t kReadLagBuckets = 33;
  mutable absl::Mutex reads_mu_;
  // By worker, the first read for each of its next two pushes (a pull
  // ahead reads for the push after the next), at [clock % 2].
  absl::flat_hash_map<uint32_t, std::array<StepRead, 2>> step_reads_
      ABSL_GUARDED_BY(reads_mu_);
  std::vector<uint64_t> read_lag_counts_ ABSL_GUARDED_BY(reads_mu_) =
      std::vector<uint64_t>(kReadLagBuckets, 0);
  uint64_t cached_pushes_ ABSL_GUARDED_BY(reads_mu_) = 0;
  uint64_t max_read_lag_ ABSL_GUARDED_BY(reads_mu_) = 0;
  uint64_t read_lag_violations_ ABSL_GUARDED_BY(reads_mu_) = 0;

  struct Incarnation {
    uint32_t number = 0;
    uint64_t offset = 0;  // added to this incarnation's clocks
  };
  absl::Mutex incarnations_mu_;
  absl::flat_hash_map<uint32_t, Incarnation> incarnations_  // by worker
      ABSL_GUARDED_BY(incarnations_mu_);
};

// Calls `pull` (&PsServer::PullSparse or &PsServer::PullDense) and blocks
// until it is answered: for in-process callers (tests, fuzz targets).
template <typename Request, typename Response>
grpc::Status AwaitPullAnswer(PsServer& server,
                             void (PsServer::*pull)(grpc::ServerContextBase*,
                                                    const Request*, Response*,
                                                    PsServer::Done),
                             grpc::ServerContextBase* context,
                             const Request* request, Response* response) {
  absl::Notification answered;
  grpc::Status status;
  (server.*pull)(context, request, response, [&](grpc::Status s) {
    status = std::move(s);
    answered.Notify();
  });
  answered.WaitForNotification();
  return status;
}

}  // namespace hetps
