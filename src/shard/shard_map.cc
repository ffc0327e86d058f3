#include "shard/shard_map.h"

#include "absl/strings/str_cat.h"

namespace hetps {

ShardMap ShardMap::Uniform(uint32_t num_servers, uint32_t num_buckets) {
  std::vector<uint32_t> owner(num_buckets);
  for (uint32_t b = 0; b < num_buckets; ++b) owner[b] = b % num_servers;
  return ShardMap(1, num_servers, std::move(owner));
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
  return ShardMap(proto.version(), proto.num_servers(), std::move(owner));
}

void ShardMap::ToProto(rpc::ShardMapProto* proto) const {
  proto->set_version(version_);
  proto->set_num_servers(num_servers_);
  proto->mutable_bucket_owner()->Assign(owner_.begin(), owner_.end());
}

ShardMap ShardMap::WithOwners(
    const std::vector<std::pair<uint32_t, uint32_t>>& moves) const {
  std::vector<uint32_t> owner = owner_;
  for (const auto& [bucket, server] : moves) owner.at(bucket) = server;
  return ShardMap(version_ + 1, num_servers_, std::move(owner));
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
