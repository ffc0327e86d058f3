#include "config/environment.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <map>
#include <string>

#include "support/test_support.h"

namespace hetps {
namespace {

using ::hetps::testing::StatusIs;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

constexpr absl::StatusCode kInvalid = absl::StatusCode::kInvalidArgument;

// A fake environment: only the variables in the map are set.
class FakeEnv {
 public:
  explicit FakeEnv(std::map<std::string, std::string> vars)
      : vars_(std::move(vars)) {}
  std::function<const char*(const char*)> getenv() const {
    return [this](const char* name) -> const char* {
      auto it = vars_.find(name);
      return it == vars_.end() ? nullptr : it->second.c_str();
    };
  }

 private:
  std::map<std::string, std::string> vars_;
};

TEST(PaddleEnvironmentTest, NothingSetChangesNothing) {
  JobConfig config;
  config.cluster.ps_endpoints = {"keep:1"};
  FakeEnv env({});
  absl::StatusOr<RoleAssignment> role =
      ApplyPaddleEnvironment(config, env.getenv());
  ASSERT_TRUE(role.ok()) << role.status();
  EXPECT_EQ(role->role, RoleAssignment::kNone);
  EXPECT_EQ(role->rank, -1);
  EXPECT_THAT(config.cluster.ps_endpoints, ElementsAre("keep:1"));
}

TEST(PaddleEnvironmentTest, TrainerGetsEndpointsAndRank) {
  JobConfig config;
  FakeEnv env({{"PADDLE_PSERVERS_IP_PORT_LIST", "10.0.0.1:6000, 10.0.0.2:6000"},
               {"PADDLE_TRAINER_ENDPOINTS", "10.0.0.5:6100,10.0.0.6:6100"},
               {"TRAINING_ROLE", "TRAINER"},
               {"PADDLE_TRAINER_ID", "1"}});
  absl::StatusOr<RoleAssignment> role =
      ApplyPaddleEnvironment(config, env.getenv());
  ASSERT_TRUE(role.ok()) << role.status();
  EXPECT_EQ(role->role, RoleAssignment::kWorker);
  EXPECT_EQ(role->rank, 1);
  EXPECT_THAT(config.cluster.ps_endpoints,
              ElementsAre("10.0.0.1:6000", "10.0.0.2:6000"));
  EXPECT_THAT(config.cluster.worker_endpoints,
              ElementsAre("10.0.0.5:6100", "10.0.0.6:6100"));
  EXPECT_EQ(config.num_servers(), 2);
  EXPECT_EQ(config.num_workers(), 2);
}

TEST(PaddleEnvironmentTest, ServerRankIsItsIndexInTheList) {
  JobConfig config;
  FakeEnv env({{"PADDLE_PSERVERS_IP_PORT_LIST", "10.0.0.1:6000,10.0.0.2:6000"},
               {"TRAINING_ROLE", "PSERVER"},
               {"POD_IP", "10.0.0.2"},
               {"PADDLE_PORT", "6000"}});
  absl::StatusOr<RoleAssignment> role =
      ApplyPaddleEnvironment(config, env.getenv());
  ASSERT_TRUE(role.ok()) << role.status();
  EXPECT_EQ(role->role, RoleAssignment::kServer);
  EXPECT_EQ(role->rank, 1);
}

TEST(PaddleEnvironmentTest, ServerWithIpv6PodIp) {
  JobConfig config;
  FakeEnv env(
      {{"PADDLE_PSERVERS_IP_PORT_LIST", "[fd00::1]:6000,[fd00::2]:6000"},
       {"TRAINING_ROLE", "PSERVER"},
       {"POD_IP", "fd00::1"},
       {"PADDLE_PORT", "6000"}});
  absl::StatusOr<RoleAssignment> role =
      ApplyPaddleEnvironment(config, env.getenv());
  ASSERT_TRUE(role.ok()) << role.status();
  EXPECT_EQ(role->rank, 0);
}

TEST(PaddleEnvironmentTest, ErrorsNameTheVariable) {
  struct Case {
    std::map<std::string, std::string> vars;
    std::string message;
  };
  const std::string servers = "10.0.0.1:6000,10.0.0.2:6000";
  const Case cases[] = {
      {{{"PADDLE_PSERVERS_IP_PORT_LIST", "10.0.0.1:6000,nonsense"}},
       "PADDLE_PSERVERS_IP_PORT_LIST[1]: 'nonsense' is not host:port"},
      {{{"PADDLE_TRAINER_ENDPOINTS", "h:99999"}},
       "PADDLE_TRAINER_ENDPOINTS[0]"},
      {{{"TRAINING_ROLE", "HETER"}},
       "TRAINING_ROLE: expected PSERVER or TRAINER"},
      {{{"TRAINING_ROLE", "TRAINER"}}, "PADDLE_TRAINER_ID: must be set"},
      {{{"TRAINING_ROLE", "TRAINER"}, {"PADDLE_TRAINER_ID", "x"}},
       "PADDLE_TRAINER_ID: expected a non-negative integer, got 'x'"},
      {{{"TRAINING_ROLE", "TRAINER"},
        {"PADDLE_TRAINER_ID", "2"},
        {"PADDLE_TRAINER_ENDPOINTS", "a:1,b:1"}},
       "PADDLE_TRAINER_ID: 2 is out of range for 2 workers"},
      {{{"TRAINING_ROLE", "PSERVER"},
        {"PADDLE_PSERVERS_IP_PORT_LIST", servers}},
       "POD_IP, PADDLE_PORT: both must be set"},
      {{{"TRAINING_ROLE", "PSERVER"},
        {"PADDLE_PSERVERS_IP_PORT_LIST", servers},
        {"POD_IP", "10.0.0.9"},
        {"PADDLE_PORT", "6000"}},
       "POD_IP:PADDLE_PORT: '10.0.0.9:6000' is not among the server endpoints"},
  };
  for (const Case& c : cases) {
    JobConfig config;
    config.cluster.ps_endpoints = {"keep:1"};
    FakeEnv env(c.vars);
    EXPECT_THAT(ApplyPaddleEnvironment(config, env.getenv()),
                StatusIs(kInvalid, HasSubstr(c.message)));
    // A failed call leaves the config as it was.
    EXPECT_THAT(config.cluster.ps_endpoints, ElementsAre("keep:1"));
  }
}

TEST(PaddleEnvironmentTest, ServerNeedsAServerList) {
  FakeEnv env({{"TRAINING_ROLE", "PSERVER"},
               {"POD_IP", "10.0.0.1"},
               {"PADDLE_PORT", "6000"}});
  JobConfig config;
  EXPECT_THAT(ApplyPaddleEnvironment(config, env.getenv()),
              StatusIs(kInvalid, HasSubstr("PADDLE_PSERVERS_IP_PORT_LIST: must "
                                           "list the servers")));
  // A list from the config file serves as well.
  config.cluster.ps_endpoints = {"10.0.0.0:6000", "10.0.0.1:6000"};
  absl::StatusOr<RoleAssignment> role =
      ApplyPaddleEnvironment(config, env.getenv());
  ASSERT_TRUE(role.ok()) << role.status();
  EXPECT_EQ(role->role, RoleAssignment::kServer);
  EXPECT_EQ(role->rank, 1);
}

TEST(PaddleEnvironmentTest, EmptyVariablesCountAsUnset) {
  JobConfig config;
  FakeEnv env({{"PADDLE_PSERVERS_IP_PORT_LIST", ""}, {"TRAINING_ROLE", " "}});
  absl::StatusOr<RoleAssignment> role =
      ApplyPaddleEnvironment(config, env.getenv());
  ASSERT_TRUE(role.ok()) << role.status();
  EXPECT_EQ(role->role, RoleAssignment::kNone);
  EXPECT_TRUE(config.cluster.ps_endpoints.empty());
}

}  // namespace
}  // namespace hetps
