#include "common/ports.h"

#include <fstream>
#include <set>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "support/test_support.h"

namespace hetps {
namespace {

int EphemeralLow() {
  std::ifstream range("/proc/sys/net/ipv4/ip_local_port_range");
  int low = 0;
  range >> low;
  return low;
}

// The launcher's ports are drawn below the ephemeral range, so a socket
// bound to port 0 by any other process on the machine cannot be handed
// one of them between the draw and the server's bind.
TEST(PortsTest, PortsAreDistinctAndBelowTheEphemeralRange) {
  const int low = EphemeralLow();
  ASSERT_GT(low, 21000) << "this machine's ephemeral range leaves no room";
  for (int round = 0; round < 20; ++round) {
    auto ports = PickFreePorts("127.0.0.1", 8);
    ASSERT_TRUE(ports.ok()) << ports.status();
    ASSERT_EQ(ports->size(), 8u);
    EXPECT_EQ(std::set<int>(ports->begin(), ports->end()).size(), 8u);
    for (int port : *ports) {
      EXPECT_GE(port, 20000);
      EXPECT_LT(port, low);
    }
  }
}

TEST(PortsTest, AHostThatIsNotAnAddressIsRefusedByName) {
  auto ports = PickFreePorts("localhost", 1);
  EXPECT_THAT(ports, testing::StatusIs(absl::StatusCode::kInvalidArgument,
                                       ::testing::HasSubstr("'localhost'")));
}

}  // namespace
}  // namespace hetps
