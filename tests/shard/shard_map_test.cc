#include "shard/shard_map.h"

#include <gtest/gtest.h>

#include <vector>

#include "data/feature_key.h"

namespace hetps {
namespace {

TEST(ShardMapTest, UniformOwnersRoundRobinAndSpreadKeys) {
  const ShardMap map = ShardMap::Uniform(3, 12);
  EXPECT_EQ(map.version(), 1u);
  EXPECT_EQ(map.num_buckets(), 12u);
  std::vector<int> per_server(3, 0);
  // Structured keys (one slot, consecutive values) must still spread.
  for (uint64_t v = 0; v < 30000; ++v) {
    const uint64_t key = FeatureKey(5, v);
    EXPECT_EQ(map.ServerOf(key), map.BucketOf(key) % 3);
    ++per_server[map.ServerOf(key)];
  }
  for (int n : per_server) {
    EXPECT_GT(n, 9000);
    EXPECT_LT(n, 11000);
  }
}

TEST(ShardMapTest, ProtoRoundTripKeepsPlacement) {
  const ShardMap map = ShardMap::Uniform(2, 64);
  rpc::ShardMapProto proto;
  map.ToProto(&proto);
  auto back = ShardMap::FromProto(proto);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->version(), map.version());
  for (uint64_t k = 0; k < 1000; ++k) EXPECT_EQ(back->ServerOf(k), map.ServerOf(k));
}

TEST(ShardMapTest, FromProtoRejectsOwnerOutOfRange) {
  rpc::ShardMapProto proto;
  proto.set_version(3);
  proto.set_num_servers(2);
  proto.add_bucket_owner(0);
  proto.add_bucket_owner(2);
  auto map = ShardMap::FromProto(proto);
  EXPECT_EQ(map.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(map.status().message().find("bucket 1"), std::string::npos);
}

TEST(ShardMapTest, DenseSlicesCoverTheArrayExactlyOnce) {
  // 10 floats over 3 servers: 4 + 3 + 3.
  using Slice = std::pair<uint64_t, uint64_t>;
  EXPECT_EQ(ShardMap::DenseSlice(10, 0, 3), Slice(0, 4));
  EXPECT_EQ(ShardMap::DenseSlice(10, 1, 3), Slice(4, 3));
  EXPECT_EQ(ShardMap::DenseSlice(10, 2, 3), Slice(7, 3));
  // Fewer elements than servers: the last server holds nothing.
  EXPECT_EQ(ShardMap::DenseSlice(1, 1, 2).second, 0u);
}

}  // namespace
}  // namespace hetps
