#include "coord/membership.h"

#include <gtest/gtest.h>

namespace hetps {
namespace {

using Gone = std::vector<std::pair<uint32_t, std::string>>;

const absl::Time kStart = absl::FromUnixSeconds(100);

// Time is an argument: the heartbeat timeout is checked at exact instants.
TEST(MembershipTest, ASilentWorkerLeavesAfterTheHeartbeatTimeout) {
  Membership m(2, kStart, absl::Seconds(5), absl::Seconds(15));
  EXPECT_EQ(m.Register(0, kStart).incarnation, 1u);
  EXPECT_EQ(m.Register(1, kStart).incarnation, 1u);
  m.Heartbeat(0, kStart + absl::Seconds(4));
  EXPECT_TRUE(m.Expire(kStart + absl::Seconds(5)).empty()) << "not past yet";
  EXPECT_EQ(m.Expire(kStart + absl::Milliseconds(5500)),
            (Gone{{1, "no heartbeat for 5.5s"}}));
  EXPECT_EQ(m.epoch(), 2u);
  EXPECT_FALSE(m.live(1));
  EXPECT_EQ(m.left_reason(1), "no heartbeat for 5.5s");
  EXPECT_EQ(m.Live(), (std::vector<uint32_t>{0}));
  EXPECT_TRUE(m.Expire(kStart + absl::Seconds(8)).empty());
  EXPECT_EQ(m.Expire(kStart + absl::Seconds(10)),
            (Gone{{0, "no heartbeat for 6s"}}));
}

TEST(MembershipTest, AWorkerThatNeverRegisteredGetsTheConnectDeadlineMore) {
  Membership m(1, kStart, absl::Seconds(5), absl::Seconds(15));
  EXPECT_TRUE(m.Expire(kStart + absl::Seconds(14)).empty());
  EXPECT_EQ(m.Expire(kStart + absl::Seconds(16)),
            (Gone{{0, "never registered within 15s"}}));
}

TEST(MembershipTest, LeavingAndRegisteringAgainMoveTheEpoch) {
  Membership m(2, kStart, absl::Seconds(5), absl::Seconds(15));
  m.Register(1, kStart);
  EXPECT_TRUE(m.Leave(1, "finished its data"));
  EXPECT_FALSE(m.Leave(1, "again")) << "already out";
  EXPECT_EQ(m.epoch(), 2u);
  const Membership::Registration back = m.Register(1, kStart);
  EXPECT_EQ(back.incarnation, 2u);
  EXPECT_TRUE(back.rejoined);
  EXPECT_EQ(m.epoch(), 3u);
  EXPECT_TRUE(m.live(1));
  EXPECT_EQ(m.left_reason(1), "");
  // A restart found before anyone noticed: no change of the live set.
  const Membership::Registration again = m.Register(1, kStart);
  EXPECT_EQ(again.incarnation, 3u);
  EXPECT_FALSE(again.rejoined);
  EXPECT_EQ(m.epoch(), 3u);
}

}  // namespace
}  // namespace hetps
