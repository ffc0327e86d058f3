// ShardMap: where every parameter lives. A sparse key hashes to one of
// `num_buckets` buckets (fixed for the job, so keys never re-hash); each
// bucket is owned by one server. Moving a bucket changes the owner table and
// bumps `version`. Dense tables are split into contiguous, even slices.
//
// A ShardMap is a value: copy it freely; it is immutable once built.
#pragma once

#include <cstdint>
#include <map>
#include <span>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/strings/match.h"
#include "common/hash.h"
#include "hetps.pb.h"

namespace hetps {

// How a server's refusal of a request split by an outdated map begins (an
// ABORTED status): the client refreshes its map and splits again.
inline constexpr char kMovedPrefix[] = "moved: ";
// The most clocks a move's cut may lie past the newest clock of a worker
// any server has seen (PrepareMoveRequest.hold_ahead).
inline constexpr uint32_t kMaxHoldAhead = 64;
inline bool IsMovedError(const absl::Status& status) {
  return status.code() == absl::StatusCode::kAborted &&
         absl::StrContains(status.message(), kMovedPrefix);
}

// The bucket of `key` among `num_buckets`: fixed for the job, whoever owns
// the bucket.
inline uint32_t BucketOfKey(uint64_t key, uint32_t num_buckets) {
  return ScaleToRange(Mix64(key), num_buckets);
}

// Sets take[i] to whether keys[i] lies in a bucket `buckets` marks (one
// entry a bucket): the rows of a table that a move copies or drops
// (SparseTable::KeySelector).
inline void MarkKeysInBuckets(const std::vector<bool>& buckets,
                              std::span<const uint64_t> keys,
                              std::span<bool> take) {
  const auto num_buckets = static_cast<uint32_t>(buckets.size());
  for (size_t i = 0; i < keys.size(); ++i) {
    take[i] = buckets[BucketOfKey(keys[i], num_buckets)];
  }
}

class ShardMap {
 public:
  // Bucket b owned by server b % num_servers; version 1. Both > 0.
  static ShardMap Uniform(uint32_t num_servers, uint32_t num_buckets);
  // A resumed job's map (ResumedShardMap): `owner` at `version` (> 1), as
  // one change that every request is past, so that a request split by any
  // earlier map is refused ("moved") and split again. Owners must be in
  // range.
  static ShardMap Resumed(uint64_t version, uint32_t num_servers,
                          std::vector<uint32_t> owner);
  // INVALID_ARGUMENT when the owners do not fit num_servers or are empty.
  static absl::StatusOr<ShardMap> FromProto(const rpc::ShardMapProto& proto);
  void ToProto(rpc::ShardMapProto* proto) const;
  // The next version: each (bucket, server) of `moves` owned by that server.
  // Both must be in range.
  ShardMap WithOwners(
      const std::vector<std::pair<uint32_t, uint32_t>>& moves) const;

  uint64_t version() const { return version_; }
  uint32_t num_servers() const { return num_servers_; }
  uint32_t num_buckets() const { return static_cast<uint32_t>(owner_.size()); }

  uint32_t BucketOf(uint64_t key) const {
    return BucketOfKey(key, num_buckets());
  }
  uint32_t ServerOf(uint64_t key) const { return owner_[BucketOf(key)]; }
  uint32_t owner(uint32_t bucket) const { return owner_[bucket]; }
  // A request's place in its worker's sequence: who sent it, which process
  // of that rank (incarnation), and the pushes it had made (clock).
  struct RequestClock {
    uint32_t worker = 0;
    uint32_t incarnation = 0;
    uint64_t clock = 0;
  };
  // Where a handover takes effect: per worker, the (incarnation, clock) from
  // which its requests go to the new owner. A worker the cut does not name
  // (the read-only client, a worker never seen) and a newer process of a
  // named one are past it at once.
  struct WorkerCut {
    uint32_t incarnation = 0;
    uint64_t clock = 0;
  };
  using Cut = std::map<uint32_t, WorkerCut>;
  static bool IsPast(const Cut& cut, const RequestClock& at);

  // Who serves `key` for a request at `at`: a bucket whose move is pending
  // belongs to its old owner before the handover's cut.
  uint32_t ServerAt(uint64_t key, const RequestClock& at) const;
  // Who to ask first for a read of `key`: a pending bucket's old owner,
  // before and past the cut alike, while it still holds the rows (it
  // serves a read past the cut that needs no push made past it, and
  // refuses once the rows have left: then ServerAt's server, which waits
  // for them). So reads do not wait for a handover.
  uint32_t ReaderOf(uint64_t key) const;

  // A bucket on its way from `from` to `owner(bucket)`, handed over at
  // `cut`.
  struct Pending {
    uint32_t from = 0;
    Cut cut;
    uint64_t version = 0;  // the map version that began the handover
  };
  const absl::flat_hash_map<uint32_t, Pending>& pending() const {
    return pending_;
  }
  // The next version with each (bucket, server) of `moves` owned by that
  // server from `cut` on, by its current owner before (a pending move).
  // FAILED_PRECONDITION for a bucket whose move is still pending (one
  // handover at a time per bucket), INVALID_ARGUMENT out of range or for a
  // move to the bucket's owner.
  absl::StatusOr<ShardMap> WithHandover(
      const std::vector<std::pair<uint32_t, uint32_t>>& moves,
      const Cut& cut) const;
  // The next version with `buckets`' handovers done: no longer pending.
  ShardMap Settled(const std::vector<uint32_t>& buckets) const;

  // Whether a request at `at` split by a map of `split_version` went to the
  // servers this map sends it to: no change of owners of a later version
  // takes effect at or before it. A server refuses a request whose split
  // no longer holds, whole, so that the client re-splits it (a part resent
  // to a server that already took the rest would be dropped as a
  // duplicate). The map remembers the last kKeptChanges changes; a split
  // older than those is refused.
  bool SplitHolds(uint64_t split_version, const RequestClock& at) const;
  static constexpr size_t kKeptChanges = 64;

  // Server `server`'s slice [offset, offset + length) of a dense array of
  // `size` floats: the first size % n servers get one element more.
  static std::pair<uint64_t, uint64_t> DenseSlice(uint64_t size,
                                                  uint32_t server,
                                                  uint32_t num_servers);

 private:
  // (version, cut) of each change of owners: a handover at its cut,
  // WithOwners at an empty cut (every request). The last kKeptChanges;
  // `forgotten` is the newest version dropped from the front (0: none).
  struct Changes {
    std::vector<std::pair<uint64_t, Cut>> list;
    uint64_t forgotten = 0;
    void Add(uint64_t version, Cut cut);
  };
  ShardMap(uint64_t version, uint32_t num_servers, std::vector<uint32_t> owner,
           absl::flat_hash_map<uint32_t, Pending> pending, Changes changes)
      : version_(version),
        num_servers_(num_servers),
        owner_(std::move(owner)),
        pending_(std::move(pending)),
        changes_(std::move(changes)) {}

  uint64_t version_;
  uint32_t num_servers_;
  std::vector<uint32_t> owner_;                     // bucket → server rank
  absl::flat_hash_map<uint32_t, Pending> pending_;  // by bucket
  Changes changes_;
};

}  // namespace hetps
