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
  for (uint64_t k = 0; k < 1000; ++k)
    EXPECT_EQ(back->ServerOf(k), map.ServerOf(k));
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

// Worker 0 at (incarnation 1, clock c); the cut hands over at worker 0's
// clock 10 and worker 1's clock 4 (both incarnation 1).
ShardMap::RequestClock W0(uint64_t clock, uint32_t incarnation = 1) {
  return {.worker = 0, .incarnation = incarnation, .clock = clock};
}
ShardMap::RequestClock W1(uint64_t clock) {
  return {.worker = 1, .incarnation = 1, .clock = clock};
}
const ShardMap::Cut kCut = {{0, {.incarnation = 1, .clock = 10}},
                            {1, {.incarnation = 1, .clock = 4}}};

TEST(ShardMapTest, AHandoverSplitsABucketByEachWorkersClockUntilSettled) {
  const ShardMap map = ShardMap::Uniform(2, 16);
  // A key of bucket 3 (server 1) moves to server 0.
  uint64_t key = 0;
  while (map.BucketOf(key) != 3) ++key;
  ASSERT_EQ(map.ServerOf(key), 1u);
  auto moved = map.WithHandover({{3, 0}}, kCut);
  ASSERT_TRUE(moved.ok()) << moved.status();
  EXPECT_EQ(moved->version(), 2u);
  EXPECT_EQ(moved->owner(3), 0u);
  EXPECT_EQ(moved->ServerAt(key, W0(9)), 1u);
  EXPECT_EQ(moved->ServerAt(key, W0(10)), 0u);
  EXPECT_EQ(moved->ServerAt(key, W0(11)), 0u);
  // Each worker at its own clock.
  EXPECT_EQ(moved->ServerAt(key, W1(3)), 1u);
  EXPECT_EQ(moved->ServerAt(key, W1(4)), 0u);
  // A newer process of worker 0 (its clock back at 0) and a worker the cut
  // does not name (the read-only client) are past the cut.
  EXPECT_EQ(moved->ServerAt(key, W0(0, 2)), 0u);
  EXPECT_EQ(moved->ServerAt(key, {.worker = 9, .incarnation = 0, .clock = 0}),
            0u);
  // Other buckets are untouched, whatever the clock.
  uint64_t other = 0;
  while (map.BucketOf(other) != 4) ++other;
  EXPECT_EQ(moved->ServerAt(other, W0(0)), map.ServerOf(other));
  // A read goes first to the server that holds the rows until they leave.
  EXPECT_EQ(moved->ReaderOf(key), 1u);
  EXPECT_EQ(moved->ReaderOf(other), map.ServerOf(other));
  // One handover at a time per bucket; ranges checked; no move in place.
  EXPECT_EQ(moved->WithHandover({{3, 1}}, kCut).status().code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(moved->WithHandover({{16, 1}}, kCut).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(moved->WithHandover({{2, 2}}, kCut).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(moved->WithHandover({{4, 0}}, kCut).status().code(),
            absl::StatusCode::kInvalidArgument);
  // The wire keeps the pending move.
  rpc::ShardMapProto proto;
  moved->ToProto(&proto);
  auto back = ShardMap::FromProto(proto);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->ServerAt(key, W0(9)), 1u);
  EXPECT_EQ(back->ServerAt(key, W0(10)), 0u);
  EXPECT_EQ(back->ServerAt(key, W1(3)), 1u);
  EXPECT_EQ(back->pending().size(), 1u);
  // Settled: the new owner at every clock, and the bucket may move again.
  const ShardMap settled = moved->Settled({3});
  EXPECT_EQ(settled.version(), 3u);
  EXPECT_EQ(settled.ServerAt(key, W0(0)), 0u);
  EXPECT_EQ(settled.ReaderOf(key), 0u);
  EXPECT_TRUE(settled.WithHandover({{3, 1}}, kCut).ok());
  // A pending move naming a server out of range is refused on the wire.
  proto.mutable_pending(0)->set_from(7);
  EXPECT_FALSE(ShardMap::FromProto(proto).ok());
}

TEST(ShardMapTest, ASplitHoldsUntilAHandoverTakesEffectAtItsCut) {
  const ShardMap v1 = ShardMap::Uniform(2, 16);
  auto v2 = v1.WithHandover({{3, 0}}, kCut);
  ASSERT_TRUE(v2.ok());
  // Split by v1: still right before the cut, not from it on.
  EXPECT_TRUE(v2->SplitHolds(1, W0(9)));
  EXPECT_FALSE(v2->SplitHolds(1, W0(10)));
  EXPECT_TRUE(v2->SplitHolds(1, W1(3)));
  EXPECT_FALSE(v2->SplitHolds(1, W1(4)));
  EXPECT_TRUE(v2->SplitHolds(2, W0(10)));
  // Settling changes no owner at any clock: a v2 split still holds.
  const ShardMap v3 = v2->Settled({3});
  EXPECT_TRUE(v3.SplitHolds(2, W0(100)));
  EXPECT_FALSE(v3.SplitHolds(1, W0(100)));
  // An immediate change (WithOwners) takes effect at every clock.
  const ShardMap v4 = v3.WithOwners({{5, 0}});
  EXPECT_FALSE(v4.SplitHolds(3, W0(0)));
  EXPECT_TRUE(v4.SplitHolds(4, W0(0)));
  // The history travels with the map.
  for (const ShardMap* map : {&v3, &v4}) {
    rpc::ShardMapProto proto;
    map->ToProto(&proto);
    auto back = ShardMap::FromProto(proto);
    ASSERT_TRUE(back.ok()) << back.status();
    for (uint64_t split = 1; split <= 4; ++split) {
      for (uint64_t clock : {0, 9, 10, 100}) {
        EXPECT_EQ(back->SplitHolds(split, W0(clock)),
                  map->SplitHolds(split, W0(clock)))
            << "v" << map->version() << " split " << split << " clock "
            << clock;
      }
    }
  }
}

TEST(ShardMapTest, ASplitOlderThanTheKeptHistoryIsRefused) {
  ShardMap map = ShardMap::Uniform(2, 16);
  for (size_t i = 0; i < ShardMap::kKeptChanges + 3; ++i) {
    map = map.WithOwners({{3, static_cast<uint32_t>(i % 2)}});
  }
  const uint64_t newest = map.version();
  EXPECT_TRUE(map.SplitHolds(newest, W0(0)));
  // The first versions' changes are forgotten: no split of them holds,
  // even for a request the later changes would not touch.
  EXPECT_FALSE(map.SplitHolds(2, W0(0)));
  rpc::ShardMapProto proto;
  map.ToProto(&proto);
  EXPECT_EQ(static_cast<size_t>(proto.changes_size()), ShardMap::kKeptChanges);
  auto back = ShardMap::FromProto(proto);
  ASSERT_TRUE(back.ok());
  EXPECT_FALSE(back->SplitHolds(2, W0(0)));
  EXPECT_TRUE(back->SplitHolds(newest, W0(0)));
}

// A resumed job's map: the owners given, at the version given, and a split
// by any earlier map refused (the client splits again).
TEST(ShardMapTest, AResumedMapRefusesSplitsOfEveryEarlierMap) {
  std::vector<uint32_t> owner = {1, 1, 0, 0};
  const ShardMap map = ShardMap::Resumed(9, 2, owner);
  EXPECT_EQ(map.version(), 9u);
  EXPECT_EQ(map.owner(0), 1u);
  EXPECT_EQ(map.owner(2), 0u);
  EXPECT_TRUE(map.pending().empty());
  const ShardMap::RequestClock at{.worker = 0, .incarnation = 1, .clock = 0};
  EXPECT_TRUE(map.SplitHolds(9, at));
  EXPECT_FALSE(map.SplitHolds(8, at));
  EXPECT_FALSE(map.SplitHolds(1, at));
  rpc::ShardMapProto proto;
  map.ToProto(&proto);
  auto back = ShardMap::FromProto(proto);
  ASSERT_TRUE(back.ok());
  EXPECT_FALSE(back->SplitHolds(8, at));
  EXPECT_TRUE(back->SplitHolds(9, at));
}

// A pending move names the map version that began it (a restarted server
// matches it against its move records), through the proto too.
TEST(ShardMapTest, APendingMoveKeepsTheVersionThatBeganIt) {
  const ShardMap first = ShardMap::Uniform(2, 8);
  auto handover =
      first.WithHandover({{3, 0}}, {{0, {.incarnation = 1, .clock = 4}}});
  ASSERT_TRUE(handover.ok());
  ASSERT_TRUE(handover->pending().contains(3));
  EXPECT_EQ(handover->pending().at(3).version, 2u);
  rpc::ShardMapProto proto;
  handover->ToProto(&proto);
  auto back = ShardMap::FromProto(proto);
  ASSERT_TRUE(back.ok());
  EXPECT_EQ(back->pending().at(3).version, 2u);
  EXPECT_EQ(back->pending().at(3).from, 1u);
}

}  // namespace
}  // namespace hetps
