#include "hetps/ps_client.h"

#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <atomic>
#include <climits>
#include <cstring>
#include <functional>
#include <map>
#include <optional>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/synchronization/mutex.h"
#include "client/hot_row_cache.h"
#include "client/ps_client_factory.h"
#include "client/unique_keys.h"
#include "common/channel.h"
#include "common/clock.h"
#include "common/finite.h"
#include "common/logging.h"
#include "common/status.h"
#include "compress/codec.h"
#include "compress/error_feedback.h"
#include "hetps.grpc.pb.h"
#include "hetps/version.h"
#include "shard/shard_map.h"

namespace hetps {
// Of PsClient::Impl's members: named, not anonymous, since Impl has
// external linkage (GCC's -Wsubobject-linkage in unity builds).
namespace ps_client_internal {

struct ServerConn {
  std::string endpoint;
  std::unique_ptr<rpc::ParameterServer::StubInterface> stub;
  std::unique_ptr<TensorCalls> tensors;  // Push and PullSparse
};

struct TableMeta {
  bool sparse = true;
  uint64_t dim = 0;
};

// Waits for a fixed number of callbacks.
class Latch {
 public:
  explicit Latch(size_t count) : count_(count) {}
  void CountDown() {
    absl::MutexLock lock(&mu_);
    --count_;
  }
  void Wait() {
    absl::MutexLock lock(&mu_, absl::Condition(this, &Latch::Done));
  }

 private:
  bool Done() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return count_ == 0; }

  absl::Mutex mu_;
  size_t count_ ABSL_GUARDED_BY(mu_);
};

}  // namespace ps_client_internal
using ps_client_internal::Latch;
using ps_client_internal::ServerConn;
using ps_client_internal::TableMeta;

namespace {

// Refusals as "moved" (a bucket handed over) a request is split again
// after before the error is returned.
constexpr int kMovedRetries = 12;

// The hot-row cache drops rows too old to be read every this many pulls.
constexpr uint64_t kExpireEveryPulls = 64;

// Which server a key goes to: its owner at the request's clock (what a
// push must do), or, for a read, first the server that still holds the rows
// of a bucket being handed over (ShardMap::ReaderOf).
enum class Route { kOwner, kReader };

// Keys of one request split by server: positions[s] lists indexes into the
// key list, in order.
std::vector<std::vector<uint32_t>> PartitionByServer(
    const ShardMap& map, std::span<const uint64_t> keys,
    const ShardMap::RequestClock& at, Route route = Route::kOwner) {
  std::vector<std::vector<uint32_t>> positions(map.num_servers());
  if (map.num_servers() == 1) {
    positions[0].resize(keys.size());
    for (size_t i = 0; i < keys.size(); ++i) positions[0][i] = i;
    return positions;
  }
  std::vector<uint32_t> owner(keys.size());
  std::vector<size_t> count(map.num_servers(), 0);
  for (size_t i = 0; i < keys.size(); ++i) {
    owner[i] = route == Route::kReader ? map.ReaderOf(keys[i])
                                       : map.ServerAt(keys[i], at);
    ++count[owner[i]];
  }
  for (uint32_t s = 0; s < map.num_servers(); ++s) {
    positions[s].reserve(count[s]);
  }
  for (size_t i = 0; i < keys.size(); ++i) {
    positions[owner[i]].push_back(static_cast<uint32_t>(i));
  }
  return positions;
}

// The rows of `keys` and `values` (rows of `dim`) at `positions`, as
// table `table`'s raw gradient.
PushCall::Gradient GradientOf(const std::string& table, uint32_t dim,
                              std::span<const uint64_t> keys,
                              std::span<const float> values,
                              std::span<const uint32_t> positions,
                              bool& finite) {
  PushCall::Gradient g;
  g.message.set_table(table);
  g.message.set_dim(dim);
  g.keys = TensorSlice<uint64_t>(positions.size());
  g.values = TensorSlice<float>(positions.size() * dim);
  finite = true;
  ForEachRun(positions, [&](size_t i, uint32_t pos, size_t n) {
    std::memcpy(&g.keys.data[i], &keys[pos], n * sizeof(uint64_t));
    finite &= CopyFinite(values.subspan(size_t{pos} * dim, n * dim),
                         &g.values.data[i * dim]);
  });
  return g;
}

// A push whose gradient for `grad.table` is not finite where the client
// copied it: the caller's value and its index, or, when each of the
// caller's values is finite, the sum that overflowed.
absl::Status NonFinitePush(const TableGrad& grad) {
  if (auto st = CheckFinite(grad.table, grad.values); !st.ok()) return st;
  return absl::InvalidArgumentError(
      absl::StrCat("table '", grad.table,
                   "': the gradients of a repeated key sum to a non-finite "
                   "value; push refused"));
}

}  // namespace

struct PsClient::Impl {
  PsClientOptions options;
  Clock* time = nullptr;  // retries, back-off and deadlines run on it
  std::vector<ServerConn> servers;
  // The newest shard map known; replaced when a server reports a newer
  // one (RefreshMap).
  mutable absl::Mutex map_mu;
  std::shared_ptr<const ShardMap> shard_map ABSL_GUARDED_BY(map_mu);
  absl::flat_hash_map<std::string, TableMeta> tables;
  std::atomic<uint64_t> clock{0};
  std::atomic<uint32_t> incarnation{0};  // options.incarnation, then Rejoined
  // Residuals of lossy encodes (options.error_feedback). Pushes of one
  // client are serialized by its caller (PsClient::Push's contract).
  ErrorFeedback feedback;

  // Rows pulled from the servers (and their key and value bytes), read
  // from the hot-row cache, and pulled again because the cached copy was
  // over the bound; pull requests refused as "moved" (PullStats).
  std::atomic<uint64_t> pulled_rows{0};
  std::atomic<uint64_t> pulled_bytes{0};
  std::atomic<uint64_t> cached_rows{0};
  std::atomic<uint64_t> refetched_rows{0};
  std::atomic<uint64_t> moved_retries{0};

  // The hot-row cache (options.rpc.hot_rows; workers only, null otherwise)
  // and what it knows of the servers.
  absl::Mutex cache_mu;
  std::unique_ptr<HotRowCache> cache;
  absl::flat_hash_map<std::string, uint32_t> cache_tables
      ABSL_GUARDED_BY(cache_mu);
  // Each server's applies as its latest pull reply said, the bound its
  // replies carry, and per push clock and server the oldest version of a
  // kept row read for that push (PushRequest.oldest_read): a pull ahead
  // reads for the push after the next.
  std::vector<uint64_t> server_applies ABSL_GUARDED_BY(cache_mu);
  uint64_t read_lag_bound ABSL_GUARDED_BY(cache_mu) = 0;
  absl::flat_hash_map<uint64_t, std::vector<std::optional<uint64_t>>>
      oldest_read ABSL_GUARDED_BY(cache_mu);
  uint64_t pulls_since_expiry ABSL_GUARDED_BY(cache_mu) = 0;

  std::shared_ptr<const ShardMap> Map() const {
    absl::MutexLock lock(&map_mu);
    return shard_map;
  }

  ShardMap::RequestClock At() const {
    return {.worker = options.worker_id,
            .incarnation = incarnation.load(),
            .clock = clock.load()};
  }

  // Keeps `newest` when it is newer than `known` and the map held; the
  // hot-row cache forgets its rows then (their versions are the old
  // owners' applies).
  void KeepMap(ShardMap newest, uint64_t known) {
    {
      absl::MutexLock lock(&map_mu);
      if (newest.version() <= known ||
          newest.version() <= shard_map->version()) {
        return;
      }
      shard_map = std::make_shared<const ShardMap>(std::move(newest));
    }
    if (cache != nullptr) {
      absl::MutexLock lock(&cache_mu);
      for (const auto& [name, id] : cache_tables) {
        cache->Expire(id, [](uint64_t, uint64_t) { return true; });
      }
    }
  }

  // Reads the servers' shard maps and keeps the newest (KeepMap).
  absl::Status RefreshMap(uint64_t known) {
    auto infos = AllTableInfos();
    if (!infos.ok()) return infos.status();
    std::optional<ShardMap> newest;
    for (const rpc::TableInfoResponse& info : *infos) {
      auto map = ShardMap::FromProto(info.shard_map());
      if (!map.ok()) return map.status();
      if (!newest || map->version() > newest->version()) newest = *map;
    }
    KeepMap(*std::move(newest), known);
    return absl::OkStatus();
  }

  // After a refusal as "moved" on `attempt`: the newest map into *map (a
  // short pause first when the servers have none newer yet).
  absl::Status Resplit(std::shared_ptr<const ShardMap>& map, int attempt) {
    if (auto s = RefreshMap(map->version()); !s.ok()) return s;
    std::shared_ptr<const ShardMap> newer = Map();
    if (newer->version() == map->version()) {
      time->SleepFor(absl::Milliseconds(1 << std::min(attempt, 6)));
    }
    map = std::move(newer);
    return absl::OkStatus();
  }

  // Splits the sparse rows of a push's `requests` again by `map` (rows
  // that were encoded go decoded, as the server would have read them: the
  // error-feedback residuals already account for them); dense slices stay.
  // `targets` becomes the servers with something to take.
  absl::Status ResplitPush(const ShardMap& map,
                           const ShardMap::RequestClock& at,
                           std::vector<PushCall>& requests,
                           std::vector<uint32_t>& targets) {
    struct Rows {
      uint32_t dim = 0;
      std::vector<uint64_t> keys;
      std::vector<float> values;
    };
    std::map<std::string, Rows> sparse;
    for (PushCall& request : requests) {
      std::vector<PushCall::Gradient> kept;
      for (PushCall::Gradient& g : request.gradients) {
        auto meta = tables.find(g.message.table());
        if (meta == tables.end() || !meta->second.sparse) {
          kept.push_back(std::move(g));
          continue;
        }
        Rows& rows = sparse[g.message.table()];
        rows.dim = g.message.dim();
        if (g.message.codec() != 0) {
          std::vector<uint64_t> keys;
          std::vector<float> values;
          if (auto s = DecodeRows(g.message.values(), g.message.dim(), SIZE_MAX,
                                  &keys, &values);
              !s.ok()) {
            return s;
          }
          rows.keys.insert(rows.keys.end(), keys.begin(), keys.end());
          rows.values.insert(rows.values.end(), values.begin(), values.end());
        } else {
          rows.keys.insert(rows.keys.end(), g.keys.data.begin(),
                           g.keys.data.end());
          rows.values.insert(rows.values.end(), g.values.data.begin(),
                             g.values.data.end());
        }
      }
      request.gradients = std::move(kept);
      request.message.set_map_version(map.version());
    }
    for (const auto& [table, rows] : sparse) {
      auto positions = PartitionByServer(map, rows.keys, at);
      for (uint32_t s = 0; s < positions.size(); ++s) {
        if (positions[s].empty()) continue;
        bool finite;  // checked when the push was first split
        requests[s].gradients.push_back(GradientOf(
            table, rows.dim, rows.keys, rows.values, positions[s], finite));
      }
    }
    targets.clear();
    for (uint32_t s = 0; s < requests.size(); ++s) {
      if (!requests[s].gradients.empty() || options.push_to_all_servers) {
        targets.push_back(s);
      }
    }
    return absl::OkStatus();
  }

  // After the answers to requests split by the map of version `known`
  // (`answers[s]`: server s's, for s in `from`): the newest version they
  // reported and, of those that carried their server's map (one split by
  // an older map gets it), the newest. Keeps that map, or fetches one when
  // none carried the newest version.
  template <typename Response>
  absl::Status FollowMaps(uint64_t known,
                          std::span<const Response* const> answers,
                          std::span<const uint32_t> from) {
    uint64_t reported = 0;
    const rpc::ShardMapProto* sent = nullptr;
    for (uint32_t s : from) {
      const Response& answer = *answers[s];
      reported = std::max(reported, answer.map_version());
      if (answer.has_shard_map() &&
          (sent == nullptr || answer.shard_map().version() > sent->version())) {
        sent = &answer.shard_map();
      }
    }
    if (reported <= known) return absl::OkStatus();
    if (sent == nullptr || sent->version() < reported) {
      return RefreshMap(known);
    }
    auto map = ShardMap::FromProto(*sent);
    if (!map.ok()) return map.status();
    KeepMap(*std::move(map), known);
    return absl::OkStatus();
  }

  uint32_t CacheTableId(const std::string& table)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(cache_mu) {
    return cache_tables.try_emplace(table, cache_tables.size()).first->second;
  }

  // Starts one RPC for `server`; must call `done` exactly once.
  using StartFn = std::function<void(uint32_t server, grpc::ClientContext*,
                                     std::function<void(grpc::Status)> done)>;

  // Runs `start` for every server in `targets` concurrently. Servers that
  // answer UNAVAILABLE are called again after a back-off until
  // connect_deadline_s has passed since the first failure. With `moved`,
  // the servers that refuse as "moved" are listed there. Returns the first
  // other error, prefixed with the server and endpoint.
  absl::Status CallAll(std::vector<uint32_t> targets, const StartFn& start,
                       std::vector<uint32_t>* moved = nullptr) {
    absl::Duration backoff = absl::Seconds(options.rpc.initial_backoff_s);
    const absl::Duration limit = absl::Seconds(options.rpc.connect_deadline_s);
    std::optional<absl::Time> failing_since;
    while (true) {
      std::vector<grpc::Status> results(targets.size());
      std::vector<std::unique_ptr<grpc::ClientContext>> contexts;
      Latch latch(targets.size());
      for (size_t i = 0; i < targets.size(); ++i) {
        contexts.push_back(std::make_unique<grpc::ClientContext>());
        contexts.back()->set_deadline(
            RpcDeadline(*time, options.rpc.rpc_timeout_s));
        start(targets[i], contexts.back().get(),
              [&results, &latch, i](grpc::Status s) {
                results[i] = std::move(s);
                latch.CountDown();
              });
      }
      latch.Wait();
      std::vector<uint32_t> retry;
      std::string last_error;
      for (size_t i = 0; i < targets.size(); ++i) {
        const grpc::Status& s = results[i];
        if (s.ok()) continue;
        if (moved != nullptr &&
            IsMovedError(
                absl::Status(static_cast<absl::StatusCode>(s.error_code()),
                             s.error_message()))) {
          moved->push_back(targets[i]);
          continue;
        }
        const ServerConn& conn = servers[targets[i]];
        if (s.error_code() == grpc::StatusCode::UNAVAILABLE) {
          retry.push_back(targets[i]);
          last_error = s.error_message();
          continue;
        }
        return absl::Status(
            static_cast<absl::StatusCode>(s.error_code()),
            absl::StrCat("server ", targets[i], " (", conn.endpoint,
                         "): ", s.error_message()));
      }
      if (retry.empty()) return absl::OkStatus();
      const absl::Time now = time->Now();
      if (!failing_since) failing_since = now;
      const absl::Duration waited = now - *failing_since;
      if (waited >= limit) {
        return absl::UnavailableError(absl::StrCat(
            "PS server ", retry.front(), " at ",
            servers[retry.front()].endpoint, " unreachable for ",
            absl::StrFormat("%.1f", absl::ToDoubleSeconds(waited)),
            " s (client.connect_deadline_s = ", options.rpc.connect_deadline_s,
            "); last error: ", last_error));
      }
      spdlog::debug("{} server(s) unavailable ({}), retrying in {}",
                    retry.size(), last_error, absl::FormatDuration(backoff));
      time->SleepFor(std::min(backoff, limit - waited));
      backoff = std::min(backoff * 2, absl::Seconds(options.rpc.max_backoff_s));
      targets = std::move(retry);
    }
  }

  std::vector<uint32_t> AllServers() const {
    std::vector<uint32_t> all(servers.size());
    for (uint32_t s = 0; s < all.size(); ++s) all[s] = s;
    return all;
  }

  absl::StatusOr<TableMeta> Meta(const std::string& table, bool sparse) const {
    auto it = tables.find(table);
    if (it == tables.end()) {
      return absl::NotFoundError(absl::StrCat("unknown table '", table, "'"));
    }
    if (it->second.sparse != sparse) {
      return absl::InvalidArgumentError(absl::StrCat(
          "table '", table, "' is ", it->second.sparse ? "sparse" : "dense"));
    }
    return it->second;
  }

  // Every server's GetTableInfo (all tables, and its shard map).
  absl::StatusOr<std::vector<rpc::TableInfoResponse>> AllTableInfos() {
    std::vector<rpc::TableInfoResponse> infos(servers.size());
    rpc::TableInfoRequest request;
    request.set_protocol_version(kProtocolVersion);
    absl::Status status = CallAll(
        AllServers(), [&](uint32_t s, grpc::ClientContext* ctx, auto done) {
          servers[s].stub->async()->GetTableInfo(ctx, &request, &infos[s],
                                                 std::move(done));
        });
    if (!status.ok()) return status;
    return infos;
  }

  absl::Status Handshake() {
    auto infos = AllTableInfos();
    if (!infos.ok()) return infos.status();
    for (uint32_t s = 0; s < servers.size(); ++s) {
      const rpc::TableInfoResponse& info = (*infos)[s];
      if (info.server_rank() != s) {
        return absl::FailedPreconditionError(absl::StrCat(
            "endpoint ", servers[s].endpoint, " is server rank ",
            info.server_rank(), ", expected rank ", s,
            " (is the endpoint list in the same order everywhere?)"));
      }
      auto map = ShardMap::FromProto(info.shard_map());
      if (!map.ok()) return map.status();
      if (map->num_servers() != servers.size()) {
        return absl::FailedPreconditionError(absl::StrCat(
            "server ", s, " (", servers[s].endpoint, ") expects ",
            map->num_servers(), " servers, the client knows ", servers.size()));
      }
      // A move may be under way: the newest map is the one in force.
      absl::MutexLock lock(&map_mu);
      if (!shard_map || map->version() > shard_map->version()) {
        shard_map = std::make_shared<const ShardMap>(*std::move(map));
      }
      for (const rpc::TableInfo& t : info.tables()) {
        TableMeta meta{t.schema().kind() == rpc::TABLE_KIND_SPARSE,
                       t.schema().dim()};
        auto [it, inserted] = tables.try_emplace(t.schema().name(), meta);
        if (!inserted &&
            (it->second.sparse != meta.sparse || it->second.dim != meta.dim)) {
          return absl::FailedPreconditionError(
              absl::StrCat("servers disagree on the schema of table '",
                           t.schema().name(), "'"));
        }
      }
    }
    return absl::OkStatus();
  }
};

absl::StatusOr<std::unique_ptr<PsClient>> PsClient::Connect(
    const PsClientOptions& options) {
  return PsClientFactory::Connect(
      options, Clock::Real(),
      GrpcPsClientStubs(options.max_message_bytes, options.credentials));
}

absl::StatusOr<std::unique_ptr<PsClient>> PsClientFactory::Connect(
    const PsClientOptions& options, Clock& clock, PsClientStubs stubs) {
  if (options.endpoints.empty()) {
    return absl::InvalidArgumentError("PsClient: no server endpoints");
  }
  auto impl = std::make_unique<PsClient::Impl>();
  impl->options = options;
  impl->incarnation = options.incarnation;
  impl->time = &clock;
  for (const std::string& endpoint : options.endpoints) {
    PsClientStub stub = stubs(endpoint);
    impl->servers.push_back({.endpoint = endpoint,
                             .stub = std::move(stub.stub),
                             .tensors = std::move(stub.tensors)});
  }
  if (auto s = impl->Handshake(); !s.ok()) return s;
  if (options.rpc.hot_rows.enabled && options.worker_id != kReaderId) {
    absl::MutexLock lock(&impl->cache_mu);
    impl->cache = std::make_unique<HotRowCache>(options.rpc.hot_rows);
    impl->server_applies.assign(impl->servers.size(), 0);
  }
  return std::unique_ptr<PsClient>(new PsClient(std::move(impl)));
}

PsClient::PsClient(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
PsClient::~PsClient() = default;

uint64_t PsClient::clock() const { return impl_->clock.load(); }

void PsClient::Rejoined(uint32_t incarnation) {
  impl_->incarnation.store(incarnation);
}

const std::vector<std::string>& PsClient::endpoints() const {
  return impl_->options.endpoints;
}

PullStats PsClient::pull_stats() const {
  return {.pulled_rows = impl_->pulled_rows.load(),
          .pulled_bytes = impl_->pulled_bytes.load(),
          .cached_rows = impl_->cached_rows.load(),
          .refetched_rows = impl_->refetched_rows.load(),
          .moved_retries = impl_->moved_retries.load()};
}

absl::StatusOr<uint64_t> PsClient::TableDim(const std::string& table) const {
  auto it = impl_->tables.find(table);
  if (it == impl_->tables.end()) {
    return absl::NotFoundError(absl::StrCat("unknown table '", table, "'"));
  }
  return it->second.dim;
}

namespace {

// Copies server `s`'s (of `n`) slice of a dense table of out.size() floats
// from its reply into `out`; INTERNAL when the reply has another slice.
absl::Status CopyDenseSlice(uint32_t s, uint32_t n,
                            const rpc::PullDenseResponse& reply,
                            std::span<float> out) {
  const auto [offset, length] = ShardMap::DenseSlice(out.size(), s, n);
  const std::string& bytes = reply.values();
  if (reply.offset() != offset || bytes.size() != length * sizeof(float)) {
    return absl::InternalError(
        absl::StrCat("server ", s, " returned dense slice at ", reply.offset(),
                     " of ", bytes.size(), " bytes, expected ", offset, " of ",
                     length * sizeof(float)));
  }
  std::memcpy(&out[offset], bytes.data(), bytes.size());
  return absl::OkStatus();
}

}  // namespace

absl::Status PsClient::PullSparse(const std::string& table,
                                  std::span<const uint64_t> keys,
                                  std::span<float> out, KeySet key_set,
                                  RowSource source, const DenseAlong* dense,
                                  std::optional<uint64_t> for_push) {
  auto meta = impl_->Meta(table, /*sparse=*/true);
  if (!meta.ok()) return meta.status();
  const uint64_t dim = meta->dim;
  if (out.size() != keys.size() * dim) {
    return absl::InvalidArgumentError(
        absl::StrCat("PullSparse('", table, "'): output holds ", out.size(),
                     " floats, need ", keys.size(), " × ", dim));
  }
  uint64_t dense_size = 0;
  if (dense != nullptr) {
    auto dense_meta = impl_->Meta(dense->table, /*sparse=*/false);
    if (!dense_meta.ok()) return dense_meta.status();
    dense_size = dense_meta->dim;
    if (dense->out.size() != dense_size) {
      return absl::InvalidArgumentError(
          absl::StrCat("PullSparse('", table, "') with dense '", dense->table,
                       "': output holds ", dense->out.size(),
                       " floats, the table has ", dense_size));
    }
  }
  if (keys.empty() && dense == nullptr) return absl::OkStatus();

  UniqueKeys dedup;
  bool repeated = false;
  std::span<const uint64_t> unique = keys;
  std::vector<float> unique_rows;
  std::span<float> rows = out;
  if (key_set == KeySet::kMayRepeat) {
    dedup.Build(keys);
    repeated = dedup.keys().size() < keys.size();
    if (repeated) {
      unique = dedup.keys();
      unique_rows.resize(unique.size() * dim);
      rows = unique_rows;
    }
  }

  const ShardMap::RequestClock at = impl_->At();
  uint32_t ahead = 0;
  if (for_push) {
    if (*for_push < at.clock || *for_push > at.clock + 1) {
      return absl::InvalidArgumentError(absl::StrCat(
          "PullSparse('", table, "'): rows for the push at clock ", *for_push,
          ", but the client is at clock ", at.clock,
          " (a pull reads at most one step ahead)"));
    }
    ahead = static_cast<uint32_t>(*for_push - at.clock);
  }
  HotRowCache* cache =
      source == RowSource::kCacheAllowed ? impl_->cache.get() : nullptr;
  // The push the rows read serve, whose lag the servers record.
  const uint64_t serves = at.clock + ahead;

  std::shared_ptr<const ShardMap> map = impl_->Map();
  const uint32_t n = map->num_servers();
  Route route = Route::kReader;
  auto positions = PartitionByServer(*map, unique, at, route);
  std::vector<PulledRows> answers(n);
  // Servers holding a slice of the dense table asked for along (in
  // `targets` from the start, with or without keys).
  std::vector<bool> dense_slice(n, false);
  if (dense != nullptr) {
    for (uint32_t s = 0; s < n; ++s) {
      dense_slice[s] = ShardMap::DenseSlice(dense_size, s, n).second > 0;
    }
  }
  // Per server, what its answers to the last fetch said: its applies at
  // the oldest of them (the version of the rows it read) and its lag bound.
  std::vector<uint64_t> read_applies(n, 0), read_lag_bound(n, 0);
  // Asks `targets` for the rows at `positions` (perhaps none: the pull is
  // still the step's gate and reports the server's applies); `with_dense`:
  // the requests also carry the dense read (the first fetch). A server
  // that refuses as "moved" (a bucket's old owner refuses a read once its
  // rows have left, or in sync one that must see pushes made past the
  // cut) is asked again, and only its rows are split again: by owner at
  // once the first time, then by the newer map (both updated); the other
  // servers' answers stand. On return, `positions` and `targets` say which
  // server read which rows.
  auto fetch = [&](std::vector<std::vector<uint32_t>>& positions,
                   std::vector<uint32_t>& targets,
                   bool with_dense) -> absl::Status {
    std::vector<std::vector<uint32_t>> answered(n);
    std::vector<bool> answered_any(n, false);
    std::vector<bool> dense_left(n, false);
    if (with_dense) dense_left = dense_slice;
    std::vector<uint32_t> asking = targets;
    for (int attempt = 0;; ++attempt) {
      std::vector<PullSparseCall> requests(n);
      for (uint32_t s : asking) {
        rpc::PullSparseRequest& req = requests[s].message;
        req.set_protocol_version(kProtocolVersion);
        req.set_table(table);
        req.set_dim(static_cast<uint32_t>(dim));
        req.set_worker_id(at.worker);
        req.set_incarnation(at.incarnation);
        req.set_clock(at.clock);
        req.set_ahead(ahead);
        req.set_map_version(map->version());
        if (dense_left[s]) {
          req.set_dense_table(dense->table);
          req.set_dense_size(dense_size);
        }
        requests[s].keys = TensorSlice<uint64_t>(positions[s].size());
        const std::span<uint64_t> dst = requests[s].keys.data;
        for (size_t i = 0; i < dst.size(); ++i)
          dst[i] = unique[positions[s][i]];
        // The rows go straight to their places in `rows`.
        answers[s].rows = rows;
        answers[s].positions = positions[s];
        answers[s].dim = dim;
      }
      std::vector<uint32_t> moved;
      absl::Status status = impl_->CallAll(
          asking,
          [&](uint32_t s, grpc::ClientContext* ctx, auto done) {
            // A pull ahead sent again (a server restarted) after the push
            // before it went through is a pull at the clock that push
            // reached: sent with the old clock, a restarted sync server
            // would wait for that push, which it lost, forever.
            const uint64_t now = impl_->clock.load();
            rpc::PullSparseRequest& req = requests[s].message;
            if (for_push && now > req.clock() && now <= *for_push) {
              req.set_clock(now);
              req.set_ahead(static_cast<uint32_t>(*for_push - now));
            }
            impl_->servers[s].tensors->PullSparse(ctx, &requests[s],
                                                  &answers[s], std::move(done));
          },
          attempt < kMovedRetries ? &moved : nullptr);
      if (!status.ok()) return status;
      impl_->moved_retries += moved.size();
      std::vector<uint32_t> read;
      for (uint32_t s : asking) {
        if (std::find(moved.begin(), moved.end(), s) != moved.end()) continue;
        read.push_back(s);
        // Its rows are in place (PulledRows checked their number).
        const rpc::PullSparseResponse& response = answers[s].message;
        impl_->pulled_rows += positions[s].size();
        impl_->pulled_bytes +=
            positions[s].size() * (sizeof(uint64_t) + dim * sizeof(float));
        if (dense_left[s]) {
          if (auto d = CopyDenseSlice(s, n, response.dense(), dense->out);
              !d.ok()) {
            return d;
          }
          dense_left[s] = false;
        }
        const uint64_t applies = response.applied_rounds();
        read_applies[s] =
            answered_any[s] ? std::min(read_applies[s], applies) : applies;
        read_lag_bound[s] = response.max_read_lag();
        answered_any[s] = true;
        answered[s].insert(answered[s].end(), positions[s].begin(),
                           positions[s].end());
      }
      if (moved.empty()) {
        // A newer map for the next requests; a failure here is met again
        // (and reported) by the request that needs it.
        std::vector<const rpc::PullSparseResponse*> responses(n, nullptr);
        for (uint32_t s : read) responses[s] = &answers[s].message;
        (void)impl_->FollowMaps<rpc::PullSparseResponse>(map->version(),
                                                         responses, read);
        break;
      }
      if (route == Route::kReader) {
        route = Route::kOwner;
      } else if (auto r = impl_->Resplit(map, attempt); !r.ok()) {
        return r;
      }
      std::vector<uint32_t> left;
      for (uint32_t s : moved) {
        left.insert(left.end(), positions[s].begin(), positions[s].end());
      }
      std::vector<uint64_t> keys_left(left.size());
      for (size_t i = 0; i < left.size(); ++i) keys_left[i] = unique[left[i]];
      auto split = PartitionByServer(*map, keys_left, at, route);
      // The servers that refused are asked again, with or without rows:
      // the pull is their gate too.
      std::vector<bool> again(n, false);
      for (uint32_t s : moved) again[s] = true;
      for (uint32_t s = 0; s < n; ++s) {
        positions[s].clear();
        for (uint32_t i : split[s]) positions[s].push_back(left[i]);
        if (!positions[s].empty()) again[s] = true;
      }
      asking.clear();
      for (uint32_t s = 0; s < n; ++s) {
        if (again[s]) asking.push_back(s);
      }
    }
    positions = std::move(answered);
    targets.clear();
    for (uint32_t s = 0; s < n; ++s) {
      if (answered_any[s]) targets.push_back(s);
    }
    return absl::OkStatus();
  };

  // Rows read from the cache, per server: their positions, versions and
  // lag bounds.
  struct Copy {
    uint32_t pos;
    HotRowCache::Kept kept;
  };
  std::vector<std::vector<Copy>> cached(n);
  uint32_t table_id = 0;
  if (cache != nullptr) {
    absl::MutexLock lock(&impl_->cache_mu);
    table_id = impl_->CacheTableId(table);
    cache->Observe(table_id, unique);
    for (uint32_t s = 0; s < n; ++s) {
      const uint64_t known = impl_->server_applies[s];
      const uint64_t bound = impl_->read_lag_bound;
      std::vector<uint32_t> missing;
      for (uint32_t pos : positions[s]) {
        auto kept = cache->Read(table_id, unique[pos], known, bound,
                                rows.subspan(pos * dim, dim));
        if (kept) {
          cached[s].push_back({pos, *kept});
        } else {
          missing.push_back(pos);
        }
      }
      positions[s] = std::move(missing);
    }
  }
  std::vector<uint32_t> targets;
  for (uint32_t s = 0; s < n; ++s) {
    if (!positions[s].empty() || !cached[s].empty() || dense_slice[s]) {
      targets.push_back(s);
    }
  }
  if (auto s = fetch(positions, targets, /*with_dense=*/true); !s.ok()) {
    return s;
  }
  if (cache != nullptr) {
    // What the servers said: their applies at the read (the version of
    // the rows pulled) and the bound; a cached row over it is pulled again.
    std::vector<std::vector<uint32_t>> again(n);
    std::vector<uint32_t> again_targets;
    {
      absl::MutexLock lock(&impl_->cache_mu);
      for (uint32_t s : targets) {
        const uint64_t applies = read_applies[s];
        const uint64_t bound = read_lag_bound[s];
        impl_->server_applies[s] = std::max(impl_->server_applies[s], applies);
        impl_->read_lag_bound = bound;
        uint64_t oldest = applies;
        for (uint32_t pos : positions[s]) {
          if (cache->IsHot(table_id, unique[pos])) {
            cache->Store(table_id, unique[pos], applies,
                         rows.subspan(pos * dim, dim));
          }
        }
        for (const auto& [pos, kept] : cached[s]) {
          if (applies > kept.version + std::min(kept.lag, bound)) {
            again[s].push_back(pos);
          } else {
            oldest = std::min(oldest, kept.version);
          }
        }
        if (!again[s].empty()) again_targets.push_back(s);
        const size_t used = cached[s].size() - again[s].size();
        impl_->cached_rows += used;
        if (used > 0) {
          auto& reads = impl_->oldest_read[serves];
          reads.resize(impl_->servers.size());
          auto& read = reads[s];
          read = read ? std::min(*read, oldest) : oldest;
        }
      }
      if (++impl_->pulls_since_expiry >= kExpireEveryPulls) {
        impl_->pulls_since_expiry = 0;
        const std::vector<uint64_t> applies = impl_->server_applies;
        const uint64_t bound = impl_->read_lag_bound;
        cache->Expire(table_id, [&](uint64_t key, uint64_t version) {
          return applies[map->ServerOf(key)] > version + bound;
        });
      }
    }
    if (!again_targets.empty()) {
      for (uint32_t s : again_targets) impl_->refetched_rows += again[s].size();
      if (auto s = fetch(again, again_targets, /*with_dense=*/false); !s.ok()) {
        return s;
      }
      absl::MutexLock lock(&impl_->cache_mu);
      for (uint32_t s : again_targets) {
        for (uint32_t pos : again[s]) {
          cache->Store(table_id, unique[pos], read_applies[s],
                       rows.subspan(pos * dim, dim));
        }
      }
    }
  }
  if (repeated) {
    for (size_t i = 0; i < keys.size(); ++i) {
      std::memcpy(&out[i * dim], &unique_rows[dedup.position()[i] * dim],
                  dim * sizeof(float));
    }
  }
  return absl::OkStatus();
}

absl::Status PsClient::PullDense(const std::string& table,
                                 std::span<float> out) {
  auto meta = impl_->Meta(table, /*sparse=*/false);
  if (!meta.ok()) return meta.status();
  if (out.size() != meta->dim) {
    return absl::InvalidArgumentError(
        absl::StrCat("PullDense('", table, "'): output holds ", out.size(),
                     " floats, the table has ", meta->dim));
  }
  const uint32_t n = static_cast<uint32_t>(impl_->servers.size());
  std::vector<rpc::PullDenseRequest> requests(n);
  std::vector<rpc::PullDenseResponse> responses(n);
  std::vector<uint32_t> targets;
  for (uint32_t s = 0; s < n; ++s) {
    if (ShardMap::DenseSlice(meta->dim, s, n).second == 0) continue;
    targets.push_back(s);
    requests[s].set_protocol_version(kProtocolVersion);
    requests[s].set_table(table);
    requests[s].set_size(meta->dim);
    requests[s].set_worker_id(impl_->options.worker_id);
    requests[s].set_incarnation(impl_->incarnation.load());
    requests[s].set_clock(impl_->clock.load());
  }
  absl::Status status = impl_->CallAll(
      targets, [&](uint32_t s, grpc::ClientContext* ctx, auto done) {
        impl_->servers[s].stub->async()->PullDense(
            ctx, &requests[s], &responses[s], std::move(done));
      });
  if (!status.ok()) return status;
  for (uint32_t s : targets) {
    if (auto d = CopyDenseSlice(s, n, responses[s], out); !d.ok()) return d;
  }
  return absl::OkStatus();
}

absl::Status PsClient::Push(std::span<const TableGrad> grads,
                            uint32_t batch_size, KeySet key_set,
                            PushEncoding* encoding) {
  const CodecSpec* spec =
      encoding != nullptr && encoding->spec.kind != CodecKind::kNone
          ? &encoding->spec
          : nullptr;
  ErrorFeedback* feedback = spec != nullptr && impl_->options.error_feedback
                                ? &impl_->feedback
                                : nullptr;
  uint64_t raw_bytes = 0, raw_value_bytes = 0;
  uint64_t sent_bytes = 0, sent_value_bytes = 0;
  std::shared_ptr<const ShardMap> map = impl_->Map();
  const uint32_t n = map->num_servers();
  std::vector<PushCall> requests(n);
  std::vector<bool> has_content(n, false);
  const ShardMap::RequestClock at = impl_->At();
  for (uint32_t s = 0; s < n; ++s) {
    rpc::PushRequest& request = requests[s].message;
    request.set_protocol_version(kProtocolVersion);
    request.set_worker_id(at.worker);
    request.set_incarnation(at.incarnation);
    request.set_clock(at.clock);
    request.set_batch_size(batch_size);
    request.set_map_version(map->version());
  }
  // Refused whole before anything is sent: no server applies a part of a
  // bad push. Raw values are checked as they are copied for the servers;
  // encoded ones before any is encoded, so that no error-feedback residual
  // moves.
  if (spec != nullptr) {
    for (const TableGrad& grad : grads) {
      if (auto st = CheckFinite(grad.table, grad.values); !st.ok()) return st;
    }
  }
  for (const TableGrad& grad : grads) {
    auto it = impl_->tables.find(grad.table);
    if (it == impl_->tables.end()) {
      return absl::NotFoundError(
          absl::StrCat("unknown table '", grad.table, "'"));
    }
    const TableMeta meta = it->second;
    if (!meta.sparse) {
      if (!grad.keys.empty() || grad.values.size() != meta.dim) {
        return absl::InvalidArgumentError(absl::StrCat(
            "Push('", grad.table, "'): dense table of size ", meta.dim, " got ",
            grad.values.size(), " values and ", grad.keys.size(), " keys"));
      }
      for (uint32_t s = 0; s < n; ++s) {
        const auto [offset, length] = ShardMap::DenseSlice(meta.dim, s, n);
        if (length == 0) continue;
        PushCall::Gradient& g = requests[s].gradients.emplace_back();
        g.message.set_table(grad.table);
        g.message.set_dim(static_cast<uint32_t>(meta.dim));
        const auto slice = grad.values.subspan(offset, length);
        raw_bytes += slice.size() * sizeof(float);
        raw_value_bytes += slice.size() * sizeof(float);
        if (spec == nullptr) {
          g.values = TensorSlice<float>(slice.size());
          if (!CopyFinite(slice, g.values.data.data())) {
            return NonFinitePush(grad);
          }
          sent_bytes += g.values.data.size_bytes();
          sent_value_bytes += g.values.data.size_bytes();
          has_content[s] = true;
          continue;
        }
        if (feedback != nullptr) {
          // Each server holds its own slice: one residual per slice.
          if (auto st =
                  feedback->EncodeDense(absl::StrCat(grad.table, "@", s), *spec,
                                        slice, g.message.mutable_values());
              !st.ok()) {
            return st;
          }
        } else {
          EncodeDense(*spec, slice, g.message.mutable_values());
        }
        g.message.set_codec(static_cast<uint32_t>(spec->kind));
        const std::string& payload = g.message.values();
        sent_bytes += payload.size();
        sent_value_bytes += payload.size() - PayloadAddressBytes(payload);
        has_content[s] = true;
      }
      continue;
    }
    const uint64_t dim = meta.dim;
    if (grad.values.size() != grad.keys.size() * dim) {
      return absl::InvalidArgumentError(
          absl::StrCat("Push('", grad.table, "'): ", grad.keys.size(),
                       " keys × dim ", dim, " need ", grad.keys.size() * dim,
                       " values, got ", grad.values.size()));
    }
    if (!grad.uses.empty() && grad.uses.size() != grad.keys.size()) {
      return absl::InvalidArgumentError(
          absl::StrCat("Push('", grad.table, "'): ", grad.keys.size(),
                       " keys, but uses for ", grad.uses.size()));
    }
    std::span<const uint64_t> keys = grad.keys;
    std::span<const float> values = grad.values;
    std::span<const uint32_t> uses = grad.uses;
    std::vector<float> summed;
    std::vector<uint32_t> summed_uses;
    UniqueKeys dedup;
    if (key_set == KeySet::kMayRepeat) {
      dedup.Build(keys);
      if (dedup.keys().size() < keys.size()) {
        summed.assign(dedup.keys().size() * dim, 0.0f);
        summed_uses.assign(dedup.keys().size(), 0);
        for (size_t i = 0; i < keys.size(); ++i) {
          const uint32_t p = dedup.position()[i];
          float* dst = &summed[p * dim];
          for (uint64_t j = 0; j < dim; ++j) dst[j] += values[i * dim + j];
          summed_uses[p] += uses.empty() ? 1 : uses[i];
        }
        keys = dedup.keys();
        values = summed;
        uses = summed_uses;
      }
    }
    auto positions = PartitionByServer(*map, keys, at);
    const uint32_t d = static_cast<uint32_t>(dim);
    for (uint32_t s = 0; s < n; ++s) {
      if (positions[s].empty()) continue;
      bool finite;
      PushCall::Gradient& g = requests[s].gradients.emplace_back(
          GradientOf(grad.table, d, keys, values, positions[s], finite));
      if (!finite) return NonFinitePush(grad);
      const std::span<const uint64_t> k = g.keys.data;
      const std::span<const float> v = g.values.data;
      raw_bytes += k.size_bytes() + v.size_bytes();
      raw_value_bytes += v.size_bytes();
      has_content[s] = true;
      if (spec == nullptr) {
        sent_bytes += k.size_bytes() + v.size_bytes();
        sent_value_bytes += v.size_bytes();
        continue;
      }
      std::string* payload = g.message.mutable_values();
      if (feedback != nullptr) {
        if (auto st = feedback->EncodeRows(grad.table, *spec, d, k, v, payload);
            !st.ok()) {
          return st;
        }
      } else {
        EncodeRows(*spec, d, k, v, payload);
      }
      // The payload carries the keys and values.
      g.keys = TensorSlice<uint64_t>();
      g.values = TensorSlice<float>();
      g.message.set_codec(static_cast<uint32_t>(spec->kind));
      sent_bytes += payload->size();
      sent_value_bytes += payload->size() - PayloadAddressBytes(*payload);
    }
    if (impl_->cache != nullptr) {
      absl::MutexLock lock(&impl_->cache_mu);
      impl_->cache->NotePush(impl_->CacheTableId(grad.table), keys, uses,
                             batch_size);
    }
  }
  std::vector<uint32_t> targets;
  for (uint32_t s = 0; s < n; ++s) {
    if (has_content[s] || impl_->options.push_to_all_servers) {
      targets.push_back(s);
    }
  }
  if (impl_->cache != nullptr) {
    // The oldest rows the gradient was computed from, for the servers'
    // record of the cache's lag.
    absl::MutexLock lock(&impl_->cache_mu);
    if (auto it = impl_->oldest_read.find(at.clock);
        it != impl_->oldest_read.end()) {
      for (uint32_t s : targets) {
        if (it->second[s]) requests[s].message.set_oldest_read(*it->second[s]);
      }
    }
  }
  std::vector<rpc::PushResponse> responses(n);
  for (int attempt = 0;; ++attempt) {
    absl::Status status = impl_->CallAll(
        targets, [&](uint32_t s, grpc::ClientContext* ctx, auto done) {
          impl_->servers[s].tensors->Push(ctx, &requests[s], &responses[s],
                                          std::move(done));
        });
    if (IsMovedError(status) && attempt < kMovedRetries) {
      // Refused whole by every server (nothing applied): the same rows,
      // split by the newer map.
      if (auto r = impl_->Resplit(map, attempt); !r.ok()) return r;
      if (auto r = impl_->ResplitPush(*map, at, requests, targets); !r.ok()) {
        return r;
      }
      continue;
    }
    if (!status.ok()) return status;
    break;
  }
  std::vector<const rpc::PushResponse*> answers(n);
  for (uint32_t s = 0; s < n; ++s) answers[s] = &responses[s];
  (void)impl_->FollowMaps<rpc::PushResponse>(map->version(), answers, targets);
  if (impl_->cache != nullptr) {
    absl::MutexLock lock(&impl_->cache_mu);
    absl::erase_if(impl_->oldest_read,
                   [&](const auto& read) { return read.first <= at.clock; });
    for (uint32_t s = 0; s < n; ++s) {
      impl_->server_applies[s] =
          std::max(impl_->server_applies[s], responses[s].applied_rounds());
    }
  }
  impl_->clock.fetch_add(1);
  if (encoding != nullptr) {
    encoding->raw_bytes += raw_bytes;
    encoding->sent_bytes += sent_bytes;
    encoding->raw_value_bytes += raw_value_bytes;
    encoding->sent_value_bytes += sent_value_bytes;
  }
  return absl::OkStatus();
}

}  // namespace hetps
