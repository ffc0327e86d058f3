#include "shard/shard_map.h"

#include "absl/strings/str_cat.h"

namespace hetps {
namespace {

ShardMap::Cut CutOf(
    const google::protobuf::RepeatedPtrField<rpc::WorkerCut>& proto) {
  ShardMap::Cut cut;
  for (const rpc::WorkerCut& w : proto) {
    cut[w.worker()] = {.incarnation = w.incarnation(), .clock = w.clock()};
  }
  return cut;
}

void CutToProto(const ShardMap::Cut& cut,
                google::protobuf::RepeatedPtrField<rpc::WorkerCut>* proto) {
  for (const auto& [worker, at] : cut) {
    rpc::WorkerCut* w = proto->Add();
    w->set_worker(worker);
    w->set_incarnation(at.incarnation);
    w->set_clock(at.clock);
  }
}

}  // namespace

ShardMap ShardMap::Uniform(uint32_t num_servers, uint32_t num_buckets) {
  std::vector<uint32_t> owner(num_buckets);
  for (uint32_t b = 0; b < num_buckets; ++b) owner[b] = b % num_servers;
  return ShardMap(1, num_servers, std::move(owner), {}, Changes{});
}

ShardMap ShardMap::Resumed(uint64_t version, uint32_t num_servers,
                           std::vector<uint32_t> owner) {
  Changes changes;
  changes.Add(version, Cut{});
  changes.forgotten = version - 1;
  return ShardMap(version, num_servers, std::move(owner), {},
                  std::move(changes));
}

absl::StatusOr<ShardMap> ShardMap::FromProto(const rpc::ShardMapProto& proto) {
  if (proto.num_servers() == 0 || proto.bucket_owner_size() == 0) {
    return absl::InvalidArgumentError("shard map: no servers or no buckets");
  }
  std::vector<uint32_t> owner(proto.bucket_owner().begin(),
                              proto.bucket_owner().end());
  for (size_t b = 0; b < owner.size(); ++b) {
    if (owner[b] >= proto.num_servers()) {
      return absl::InvalidArgumentError(
          absl::StrCat("shard map: bucket ", b, " owned by server ", owner[b],
                       " of ", proto.num_servers()));
    }
  }
  absl::flat_hash_map<uint32_t, Pending> pending;
  for (const rpc::PendingMove& m : proto.pending()) {
    if (m.bucket() >= owner.size() || m.from() >= proto.num_servers()) {
      return absl::InvalidArgumentError(
          absl::StrCat("shard map: pending move of bucket ", m.bucket(),
                       " from server ", m.from(), " out of range"));
    }
    pending[m.bucket()] = Pending{
        .from = m.from(), .cut = CutOf(m.cut()), .version = m.version()};
  }
  Changes changes;
  for (const rpc::OwnerChange& c : proto.changes()) {
    changes.list.emplace_back(c.version(), CutOf(c.cut()));
  }
  changes.forgotten = proto.forgotten();
  return ShardMap(proto.version(), proto.num_servers(), std::move(owner),
                  std::move(pending), std::move(changes));
}

void ShardMap::ToProto(rpc::ShardMapProto* proto) const {
  proto->set_version(version_);
  proto->set_num_servers(num_servers_);
  proto->mutable_bucket_owner()->Assign(owner_.begin(), owner_.end());
  for (const auto& [bucket, p] : pending_) {
    rpc::PendingMove* m = proto->add_pending();
    m->set_bucket(bucket);
    m->set_from(p.from);
    m->set_version(p.version);
    CutToProto(p.cut, m->mutable_cut());
  }
  for (const auto& [version, cut] : changes_.list) {
    rpc::OwnerChange* c = proto->add_changes();
    c->set_version(version);
    CutToProto(cut, c->mutable_cut());
  }
  proto->set_forgotten(changes_.forgotten);
}

bool ShardMap::IsPast(const Cut& cut, const RequestClock& at) {
  const auto it = cut.find(at.worker);
  if (it == cut.end()) return true;
  if (at.incarnation != it->second.incarnation) {
    return at.incarnation > it->second.incarnation;
  }
  return at.clock >= it->second.clock;
}

uint32_t ShardMap::ServerAt(uint64_t key, const RequestClock& at) const {
  const uint32_t bucket = BucketOf(key);
  if (!pending_.empty()) {
    const auto it = pending_.find(bucket);
    if (it != pending_.end() && !IsPast(it->second.cut, at)) {
      return it->second.from;
    }
  }
  return owner_[bucket];
}

uint32_t ShardMap::ReaderOf(uint64_t key) const {
  const uint32_t bucket = BucketOf(key);
  if (!pending_.empty()) {
    const auto it = pending_.find(bucket);
    if (it != pending_.end()) return it->second.from;
  }
  return owner_[bucket];
}

void ShardMap::Changes::Add(uint64_t version, Cut cut) {
  list.emplace_back(version, std::move(cut));
  if (list.size() > kKeptChanges) {
    forgotten = list.front().first;
    list.erase(list.begin());
  }
}

absl::StatusOr<ShardMap> ShardMap::WithHandover(
    const std::vector<std::pair<uint32_t, uint32_t>>& moves,
    const Cut& cut) const {
  std::vector<uint32_t> owner = owner_;
  absl::flat_hash_map<uint32_t, Pending> pending = pending_;
  for (const auto& [bucket, server] : moves) {
    if (bucket >= owner.size() || server >= num_servers_ ||
        owner[bucket] == server) {
      return absl::InvalidArgumentError(absl::StrCat(
          "shard map: move of bucket ", bucket, " to server ", server,
          bucket < owner.size() && server == owner[bucket]
              ? ", its owner already"
              : " out of range"));
    }
    if (!pending
             .emplace(bucket, Pending{.from = owner[bucket],
                                      .cut = cut,
                                      .version = version_ + 1})
             .second) {
      return absl::FailedPreconditionError(absl::StrCat(
          "shard map: bucket ", bucket, " is still being handed over"));
    }
    owner[bucket] = server;
  }
  Changes changes = changes_;
  changes.Add(version_ + 1, cut);
  return ShardMap(version_ + 1, num_servers_, std::move(owner),
                  std::move(pending), std::move(changes));
}

ShardMap ShardMap::Settled(const std::vector<uint32_t>& buckets) const {
  absl::flat_hash_map<uint32_t, Pending> pending = pending_;
  for (uint32_t bucket : buckets) pending.erase(bucket);
  return ShardMap(version_ + 1, num_servers_, owner_, std::move(pending),
                  changes_);
}

bool ShardMap::SplitHolds(uint64_t split_version,
                          const RequestClock& at) const {
  if (split_version < changes_.forgotten) return false;
  for (const auto& [version, cut] : changes_.list) {
    if (version > split_version && IsPast(cut, at)) return false;
  }
  return true;
}

ShardMap ShardMap::WithOwners(
    const std::vector<std::pair<uint32_t, uint32_t>>& moves) const {
  std::vector<uint32_t> owner = owner_;
  for (const auto& [bucket, server] : moves) owner.at(bucket) = server;
  Changes changes = changes_;
  changes.Add(version_ + 1, Cut{});
  return ShardMap(version_ + 1, num_servers_, std::move(owner), pending_,
                  std::move(changes));
}

std::pair<uint64_t, uint64_t> ShardMap::DenseSlice(uint64_t size,
                                                   uint32_t server,
                                                   uint32_t num_servers) {
  const uint64_t base = size / num_servers;
  const uint64_t extra = size % num_servers;
  const uint64_t offset = server * base + std::min<uint64_t>(server, extra);
  const uint64_t length = base + (server < extra ? 1 : 0);
  return {offset, length};
}

}  // namespace hetps
