// ShardMap: where every parameter lives. A sparse key hashes to one of
// `num_buckets` buckets (fixed for the job, so keys never re-hash); each
// bucket is owned by one server. Moving a bucket changes the owner table and
// bumps `version`. Dense tables are split into contiguous, even slices.
//
// A ShardMap is a value: copy it freely; it is immutable once built.
#pragma once

#include <cstdint>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "common/hash.h"
#include "hetps.pb.h"

namespace hetps {

// The bucket of `key` among `num_buckets`: fixed for the job, whoever owns
// the bucket.
inline uint32_t BucketOfKey(uint64_t key, uint32_t num_buckets) {
  return ScaleToRange(Mix64(key), num_buckets);
}

class ShardMap {
 public:
  // Bucket b owned by server b % num_servers; version 1. Both > 0.
  static ShardMap Uniform(uint32_t num_servers, uint32_t num_buckets);
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

  // Server `server`'s slice [offset, offset + length) of a dense array of
  // `size` floats: the first size % n servers get one element more.
  static std::pair<uint64_t, uint64_t> DenseSlice(uint64_t size,
                                                  uint32_t server,
                                                  uint32_t num_servers);

 private:
  ShardMap(uint64_t version, uint32_t num_servers, std::vector<uint32_t> owner)
      : version_(version),
        num_servers_(num_servers),
        owner_(std::move(owner)) {}

  uint64_t version_;
  uint32_t num_servers_;
  std::vector<uint32_t> owner_;  // bucket → server rank
};

}  // namespace hetps
