#include "shard/bucket_mover.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <map>

#include "absl/strings/str_cat.h"
#include "common/bytes.h"
#include "common/logging.h"
#include "hetps/version.h"

namespace hetps {
namespace {

// Modes whose workers wait for one another's clocks.
bool BoundsClocks(ConsistencyMode mode) {
  return mode == ConsistencyMode::kSync || mode == ConsistencyMode::kSemiAsync;
}

// Whether a worker seen at `seen` is past its cut `cut`.
bool Passed(const rpc::WorkerCut& seen, const ShardMap::WorkerCut& cut) {
  if (seen.incarnation() != cut.incarnation) {
    return seen.incarnation() > cut.incarnation;
  }
  return seen.clock() >= cut.clock;
}

// The live workers any server in `seen` knows, each once.
std::vector<uint32_t> LiveWorkers(
    const std::vector<rpc::PrepareMoveResponse>& seen) {
  std::vector<uint32_t> live;
  for (const rpc::PrepareMoveResponse& r : seen) {
    live.insert(live.end(), r.live_workers().begin(), r.live_workers().end());
  }
  std::sort(live.begin(), live.end());
  live.erase(std::unique(live.begin(), live.end()), live.end());
  return live;
}

// Whether every live worker that a server in `seen` has seen has split a
// request by map `version` or a newer one.
bool EveryWorkerSplitsBy(const std::vector<rpc::PrepareMoveResponse>& seen,
                         uint64_t version) {
  std::map<uint32_t, uint64_t> newest;  // per worker seen, of all servers
  for (const rpc::PrepareMoveResponse& r : seen) {
    for (const rpc::WorkerCut& s : r.seen()) {
      uint64_t& map_version = newest[s.worker()];
      map_version = std::max(map_version, s.map_version());
    }
  }
  for (uint32_t w : LiveWorkers(seen)) {
    const auto it = newest.find(w);
    if (it != newest.end() && it->second < version) return false;
  }
  return true;
}

// `at` for `worker` in `cut`, unless the cut names a later point for it
// (a newer incarnation, or a later clock of the same one).
void KeepLater(ShardMap::Cut& cut, uint32_t worker, ShardMap::WorkerCut at) {
  auto [it, first] = cut.try_emplace(worker, at);
  if (!first && (at.incarnation > it->second.incarnation ||
                 (at.incarnation == it->second.incarnation &&
                  at.clock > it->second.clock))) {
    it->second = at;
  }
}

// Splits rows handed over by one server by the server each bucket goes to.
std::map<uint32_t, rpc::MovedRows> ByDestination(const rpc::MovedRows& rows,
                                                 const ShardMap& map) {
  std::map<uint32_t, rpc::MovedRows> out;
  for (uint32_t bucket : rows.buckets()) {
    out[map.owner(bucket)].add_buckets(bucket);
  }
  for (const rpc::MovedTable& table : rows.tables()) {
    const size_t n = table.keys().size() / sizeof(uint64_t);
    if (n == 0) continue;
    const size_t dim = table.weights().size() / sizeof(float) / n;
    const size_t width = table.state().size() / sizeof(float) / n;
    std::vector<uint64_t> key_scratch;
    std::vector<float> weight_scratch, state_scratch;
    auto keys = ViewAs<uint64_t>(table.keys(), key_scratch);
    auto weights = ViewAs<float>(table.weights(), weight_scratch);
    auto state = ViewAs<float>(table.state(), state_scratch);
    struct Part {
      std::vector<uint64_t> keys;
      std::vector<float> weights, state;
      std::vector<uint64_t> updates;
    };
    std::map<uint32_t, Part> parts;
    for (size_t i = 0; i < n; ++i) {
      Part& part = parts[map.ServerOf(keys[i])];
      part.keys.push_back(keys[i]);
      part.weights.insert(part.weights.end(), weights.begin() + i * dim,
                          weights.begin() + (i + 1) * dim);
      part.state.insert(part.state.end(), state.begin() + i * width,
                        state.begin() + (i + 1) * width);
      part.updates.push_back(table.update_counts(static_cast<int>(i)));
    }
    for (auto& [server, part] : parts) {
      rpc::MovedTable* t = out[server].add_tables();
      t->set_table(table.table());
      AssignBytes<uint64_t>(t->mutable_keys(), part.keys);
      AssignBytes<float>(t->mutable_weights(), part.weights);
      AssignBytes<float>(t->mutable_state(), part.state);
      t->mutable_update_counts()->Assign(part.updates.begin(),
                                         part.updates.end());
    }
  }
  return out;
}

}  // namespace

BucketMover::BucketMover(std::vector<std::string> endpoints,
                         ConsistencyMode mode, ParameterServerStubs stubs,
                         absl::Duration rpc_timeout,
                         absl::Duration pass_timeout,
                         absl::Duration learn_timeout)
    : mode_(mode),
      rpc_timeout_(rpc_timeout),
      pass_timeout_(pass_timeout),
      learn_timeout_(learn_timeout) {
  absl::MutexLock lock(&mu_);
  for (std::string& endpoint : endpoints) {
    auto stub = stubs(endpoint);
    servers_.push_back({std::move(endpoint), std::move(stub)});
  }
}

std::unique_ptr<grpc::ClientContext> BucketMover::Context() const {
  auto context = std::make_unique<grpc::ClientContext>();
  context->set_deadline(absl::ToChronoTime(absl::Now() + rpc_timeout_));
  return context;
}

grpc::Status BucketMover::Retried(
    const std::function<grpc::Status(grpc::ClientContext*)>& call) const {
  // Every call of a move may be made again: a lost reply, a server that
  // was slow to answer.
  const absl::Time give_up = absl::Now() + rpc_timeout_;
  absl::Duration backoff = absl::Milliseconds(10);
  while (true) {
    auto context = Context();
    // A server that restarts is waited for, not failed at once.
    context->set_wait_for_ready(true);
    grpc::Status status = call(context.get());
    const bool transient =
        status.error_code() == grpc::StatusCode::UNAVAILABLE ||
        status.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED;
    if (!transient || cancelled_ || absl::Now() + backoff >= give_up) {
      return status;
    }
    spdlog::debug("bucket move: a call failed ({}), again in {}",
                  status.error_message(), absl::FormatDuration(backoff));
    absl::SleepFor(backoff);
    backoff = std::min(backoff * 2, absl::Milliseconds(500));
  }
}

absl::Status BucketMover::HandOver(uint32_t source,
                                   const std::vector<uint32_t>& buckets,
                                   bool give_up, rpc::MovedRows* rows) {
  rpc::HandOverRequest request;
  request.set_protocol_version(kProtocolVersion);
  request.mutable_buckets()->Assign(buckets.begin(), buckets.end());
  request.set_give_up(give_up);
  rpc::ParameterServer::StubInterface& from = *servers_[source].stub;
  grpc::Status status = Retried([&](grpc::ClientContext* context) {
    return from.HandOver(context, request, rows);
  });
  return status.ok() ? absl::OkStatus()
                     : ServerError(source, "HandOver", status);
}

absl::Status BucketMover::ServerError(uint32_t server, const char* call,
                                      const grpc::Status& status) const {
  return absl::Status(static_cast<absl::StatusCode>(status.error_code()),
                      absl::StrCat("bucket move: ", call, " on server ", server,
                                   ": ", status.error_message()));
}

absl::StatusOr<std::vector<rpc::PrepareMoveResponse>> BucketMover::Prepare(
    bool hold, uint32_t ahead) {
  std::vector<rpc::PrepareMoveResponse> responses(servers_.size());
  rpc::PrepareMoveRequest request;
  request.set_protocol_version(kProtocolVersion);
  request.set_hold(hold);
  request.set_hold_ahead(ahead);
  for (uint32_t s = 0; s < servers_.size(); ++s) {
    rpc::ParameterServer::StubInterface& stub = *servers_[s].stub;
    grpc::Status status = Retried([&](grpc::ClientContext* context) {
      return stub.PrepareMove(context, request, &responses[s]);
    });
    if (!status.ok()) return ServerError(s, "PrepareMove", status);
  }
  connected_ = true;
  Observe(responses);
  return responses;
}

void BucketMover::Observe(const std::vector<rpc::PrepareMoveResponse>& seen) {
  ShardMap::Cut newest;
  for (const rpc::PrepareMoveResponse& r : seen) {
    for (const rpc::WorkerCut& w : r.seen()) {
      KeepLater(newest, w.worker(),
                {.incarnation = w.incarnation(), .clock = w.clock()});
    }
  }
  const absl::Time now = absl::Now();
  const absl::Duration since = now - observed_at_;
  if (since < kPaceInterval) return;  // too short to tell a pace
  double fastest = 0;
  for (const auto& [worker, at] : newest) {
    const auto before = observed_.find(worker);
    if (before == observed_.end() ||
        before->second.incarnation != at.incarnation ||
        before->second.clock > at.clock) {
      continue;  // new, or restarted
    }
    fastest = std::max(fastest, static_cast<double>(at.clock -
                                                    before->second.clock) /
                                    absl::ToDoubleSeconds(since));
  }
  if (!observed_.empty()) clocks_per_s_ = fastest;
  observed_ = std::move(newest);
  observed_at_ = now;
}

uint32_t HoldAheadClocks(double clocks_per_s,
                         std::span<const absl::Duration> holds) {
  if (holds.empty()) return 0;
  std::vector<absl::Duration> sorted(holds.begin(), holds.end());
  std::sort(sorted.begin(), sorted.end());
  const absl::Duration hold = sorted[(sorted.size() - 1) / 2];
  const double clocks = clocks_per_s * absl::ToDoubleSeconds(hold);
  if (clocks < 0.1) return 0;
  return static_cast<uint32_t>(
      std::min<double>(std::ceil(clocks), kMaxHoldAhead));
}

uint32_t BucketMover::HoldAhead() const {
  return HoldAheadClocks(clocks_per_s_, holds_);
}

absl::Status BucketMover::Adopt(const ShardMap& map,
                                const std::vector<bool>& on) {
  rpc::AdoptShardMapRequest request;
  request.set_protocol_version(kProtocolVersion);
  map.ToProto(request.mutable_shard_map());
  for (uint32_t s = 0; s < servers_.size(); ++s) {
    if (!on.empty() && !on[s]) continue;
    rpc::AdoptShardMapResponse response;
    rpc::ParameterServer::StubInterface& stub = *servers_[s].stub;
    grpc::Status status = Retried([&](grpc::ClientContext* context) {
      return stub.AdoptShardMap(context, request, &response);
    });
    if (!status.ok()) return ServerError(s, "AdoptShardMap", status);
    if (response.version() < map.version()) {
      return absl::FailedPreconditionError(
          absl::StrCat("bucket move: server ", s, " kept shard map version ",
                       response.version(), " instead of ", map.version()));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<MoveReport> BucketMover::Move(
    const std::vector<std::pair<uint32_t, uint32_t>>& moves) {
  absl::MutexLock lock(&mu_);
  if (cancelled_) return absl::CancelledError("bucket move: cancelled");
  const absl::Time began = absl::Now();
  MoveReport report;

  if (BoundsClocks(mode_)) {
    // A worker the cut does not name is past it at once. Where a bound
    // ties the clocks that would deadlock: its first requests would wait
    // at a new owner for rows that move only once the others pass the cut,
    // and they wait for it (sync: for its pushes; semi_async: for it to
    // come within the window). So every live worker must have been seen
    // first.
    auto seen = Prepare(/*hold=*/false);
    if (!seen.ok()) return seen.status();
    std::vector<bool> named;
    for (const rpc::PrepareMoveResponse& r : *seen) {
      for (const rpc::WorkerCut& w : r.seen()) {
        if (w.worker() >= named.size()) named.resize(w.worker() + 1, false);
        named[w.worker()] = true;
      }
    }
    for (const rpc::PrepareMoveResponse& r : *seen) {
      for (uint32_t w : r.live_workers()) {
        if (w >= named.size() || !named[w]) {
          return absl::UnavailableError(absl::StrCat(
              "bucket move: live worker ", w,
              " has sent no request yet (in sync and semi_async the cut must "
              "name every live worker); move later"));
        }
      }
    }
  }

  // 1. Holds, and what every server has seen. A first move connects
  // first: the hold's length sets the next cuts' (HoldAhead).
  if (!connected_) {
    if (auto s = Prepare(/*hold=*/false); !s.ok()) return s.status();
  }
  const uint32_t ahead = HoldAhead();
  const absl::Time hold_began = absl::Now();
  auto prepared = Prepare(/*hold=*/true, ahead);
  if (!prepared.ok()) return prepared.status();
  auto current = ShardMap::FromProto((*prepared)[0].shard_map());
  if (!current.ok()) return current.status();
  for (const rpc::PrepareMoveResponse& r : *prepared) {
    if (r.shard_map().version() != current->version()) {
      // Release the holds with the map they have; nothing moves.
      (void)Adopt(current->WithOwners({}));
      return absl::FailedPreconditionError(
          "bucket move: the servers hold different shard maps");
    }
  }
  std::vector<std::pair<uint32_t, uint32_t>> real;
  for (const auto& [bucket, server] : moves) {
    if (bucket < current->num_buckets() && server < current->num_servers() &&
        current->owner(bucket) == server) {
      continue;
    }
    real.emplace_back(bucket, server);
  }

  // 2. The cut and the handover.
  ShardMap::Cut cut;
  for (const rpc::PrepareMoveResponse& r : *prepared) {
    for (const rpc::WorkerCut& seen : r.seen()) {
      KeepLater(cut, seen.worker(),
                {.incarnation = seen.incarnation(),
                 .clock = seen.clock() + 1 + ahead});
    }
  }
  if (BoundsClocks(mode_)) {
    // One clock for all: a worker whose read past its cut waits at a new
    // owner has its clock one below the cut, and the bound must let every
    // other worker reach the cut (in sync a round is then never split; in
    // semi_async a worker whose own cut lay more than the window past
    // another's would wait for that one forever).
    uint64_t last = 0;
    for (const auto& [worker, at] : cut) last = std::max(last, at.clock);
    for (auto& [worker, at] : cut) at.clock = last;
  }
  auto handover = current->WithHandover(real, cut);
  if (!handover.ok()) {
    // The holds end with an unchanged map of the next version.
    (void)Adopt(current->WithOwners({}));
    return handover.status();
  }
  if (auto s = Adopt(*handover); !s.ok()) return s;
  holds_.push_back(absl::Now() - hold_began);
  if (holds_.size() > kHoldsKept) holds_.erase(holds_.begin());
  report.hold_ahead = ahead;
  std::vector<uint32_t> buckets;
  for (const auto& [bucket, pending] : handover->pending()) {
    if (!current->pending().contains(bucket)) buckets.push_back(bucket);
  }
  return Complete(*handover, buckets, cut, began, report);
}

absl::StatusOr<MoveReport> BucketMover::FinishOpen(const ShardMap& map) {
  absl::MutexLock lock(&mu_);
  if (cancelled_) return absl::CancelledError("bucket move: cancelled");
  const absl::Time began = absl::Now();
  // First every server takes `map` (a newer map only): the mover may have
  // stopped after some adopted it and before others did — the settled map
  // at the new owners but not yet at the old ones (steps 5-7), or a
  // handover map not everywhere yet. An old owner then drops the rows, or
  // hands them over as the map says.
  if (auto s = Adopt(map); !s.ok()) return s;
  // Every open handover at once, past the latest cut of each worker (cuts
  // only grow, so a worker past it is past every earlier one).
  std::vector<uint32_t> buckets;
  ShardMap::Cut cut;
  for (const auto& [bucket, pending] : map.pending()) {
    buckets.push_back(bucket);
    for (const auto& [worker, at] : pending.cut) KeepLater(cut, worker, at);
  }
  MoveReport report;
  if (buckets.empty()) {
    report.map = std::make_shared<const ShardMap>(map);
    return report;
  }
  return Complete(map, buckets, cut, began, report);
}

absl::StatusOr<MoveReport> BucketMover::Complete(
    const ShardMap& handover, const std::vector<uint32_t>& buckets,
    const ShardMap::Cut& cut, absl::Time began, MoveReport report) {
  const absl::Time handed = absl::Now();

  // 3. Every live worker past its cut.
  const absl::Time give_up = handed + pass_timeout_;
  while (true) {
    auto seen = Prepare(/*hold=*/false);
    if (!seen.ok()) return seen.status();
    std::vector<uint32_t> behind;
    for (uint32_t w : LiveWorkers(*seen)) {
      const auto at = cut.find(w);
      if (at == cut.end()) continue;  // never seen: past the cut at once
      bool passed = false;
      for (const rpc::PrepareMoveResponse& r : *seen) {
        for (const rpc::WorkerCut& s : r.seen()) {
          if (s.worker() == w && Passed(s, at->second)) passed = true;
        }
      }
      if (!passed) behind.push_back(w);
    }
    if (behind.empty()) break;
    if (cancelled_) {
      return absl::CancelledError(absl::StrCat(
          "bucket move: cancelled; the handover of shard map version ",
          handover.version(), " stays open"));
    }
    if (absl::Now() >= give_up) {
      return absl::DeadlineExceededError(absl::StrCat(
          "bucket move: worker ", behind.front(), " did not pass the cut (",
          behind.size(), " behind) in ", absl::FormatDuration(pass_timeout_),
          "; the handover of shard map version ", handover.version(),
          " stays open"));
    }
    absl::SleepFor(absl::Milliseconds(1));
  }
  report.wait = absl::Now() - handed;

  // 4. A copy of the rows, from each old owner to each new one; the old
  // owners serve reads of them meanwhile, the new owners hold their reads
  // and apply the pushes they kept for them once the rows are in, then
  // serve the reads.
  std::map<uint32_t, std::vector<uint32_t>> by_source;
  std::vector<bool> destination(servers_.size(), false);
  for (uint32_t bucket : buckets) {
    by_source[handover.pending().at(bucket).from].push_back(bucket);
    destination[handover.owner(bucket)] = true;
  }
  for (const auto& [source, list] : by_source) {
    rpc::MovedRows rows;
    if (auto s = HandOver(source, list, /*give_up=*/false, &rows); !s.ok()) {
      return s;
    }
    for (auto& [to_server, part] : ByDestination(rows, handover)) {
      rpc::TakeOverRequest take;
      take.set_protocol_version(kProtocolVersion);
      for (const rpc::MovedTable& t : part.tables()) {
        report.rows += t.update_counts_size();
        report.bytes += t.keys().size() + t.weights().size() + t.state().size();
      }
      *take.mutable_rows() = std::move(part);
      rpc::TakeOverResponse taken;
      rpc::ParameterServer::StubInterface& to = *servers_[to_server].stub;
      grpc::Status status = Retried([&](grpc::ClientContext* context) {
        return to.TakeOver(context, take, &taken);
      });
      if (!status.ok()) return ServerError(to_server, "TakeOver", status);
    }
  }
  report.held = absl::Now() - handed;
  // 5. Settled at the new owners (those that hand none of these buckets
  // over themselves: a server gives a bucket up before it adopts the map
  // that has it elsewhere): the clients learn the map from their answers
  // and read the rows there.
  const ShardMap settled = handover.Settled(buckets);
  std::vector<bool> first(servers_.size());
  for (uint32_t s = 0; s < servers_.size(); ++s) {
    first[s] = destination[s] && !by_source.contains(s);
  }
  if (auto s = Adopt(settled, first); !s.ok()) return s;
  // 6. The old owners give the buckets up: a client that still splits by
  // the handover map is refused there and reads them at the new owners.
  // Only after 5: given up before, the old owners refused every read of
  // the buckets until the client had an answer from a new owner with the
  // settled map, and those reads, asked twice, were the slowest of a move.
  // And only once every live worker has split a request by the settled
  // map (or learn_timeout has passed): until then the old owners serve
  // reads split by an older one (docs/BENCHMARKS.md §12, "Refused reads:
  // the give-up after the workers learn the settled map").
  const absl::Time settled_began = absl::Now();
  while (absl::Now() - settled_began < learn_timeout_ && !cancelled_) {
    auto seen = Prepare(/*hold=*/false);
    if (!seen.ok()) return seen.status();
    if (EveryWorkerSplitsBy(*seen, settled.version())) break;
    absl::SleepFor(absl::Milliseconds(1));
  }
  report.learn = absl::Now() - settled_began;
  for (const auto& [source, list] : by_source) {
    rpc::MovedRows none;
    if (auto s = HandOver(source, list, /*give_up=*/true, &none); !s.ok()) {
      return s;
    }
  }
  // 7. Settled everywhere: the old owners drop the rows, and a new owner
  // restarted since 5 (which took the newest map of the others, the
  // handover map) takes it again; the others have it already.
  if (auto s = Adopt(settled); !s.ok()) return s;
  report.transfer = absl::Now() - handed - report.wait - report.learn;
  report.buckets = buckets.size();
  report.map = std::make_shared<const ShardMap>(settled);
  report.total = absl::Now() - began;
  return report;
}

}  // namespace hetps
