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

using testing::kInvalid;

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

// issue 15: Slurm's hostlists, as SLURM_JOB_NODELIST writes them.
TEST(HostlistTest, ExpandsRangesPaddingAndGroups) {
  EXPECT_THAT(*ExpandHostlist("node[01-03,07]"),
              ElementsAre("node01", "node02", "node03", "node07"));
  EXPECT_THAT(*ExpandHostlist("login1"), ElementsAre("login1"));
  EXPECT_THAT(*ExpandHostlist("a[8-10],b,c[2]"),
              ElementsAre("a8", "a9", "a10", "b", "c2"));
  EXPECT_THAT(*ExpandHostlist("gpu[1-2]-ib[0-1]"),
              ElementsAre("gpu1-ib0", "gpu1-ib1", "gpu2-ib0", "gpu2-ib1"));
  EXPECT_THAT(*ExpandHostlist("n[098-101]"),
              ElementsAre("n098", "n099", "n100", "n101"));
  for (const char* bad : {"node[01-03", "node01]", "node[3-1]", "node[a-b]",
                          "node[]", "a,,b", "node[1-2-3]"}) {
    EXPECT_THAT(ExpandHostlist(bad), StatusIs(kInvalid, HasSubstr(""))) << bad;
  }
}

JobConfig RendezvousJob() {
  JobConfig config;
  config.cluster.servers = 2;
  config.cluster.workers = 4;
  return config;
}

TEST(LauncherEnvironmentTest, NoLauncherChangesNothing) {
  JobConfig config = RendezvousJob();
  FakeEnv env(std::map<std::string, std::string>{{"TRAINING_ROLE", "TRAINER"}});
  absl::StatusOr<RoleAssignment> role =
      ApplyLauncherEnvironment(config, env.getenv());
  ASSERT_TRUE(role.ok()) << role.status();
  EXPECT_EQ(role->role, RoleAssignment::kNone);
  EXPECT_EQ(config.cluster.rendezvous, "");
}

TEST(LauncherEnvironmentTest, MpiRanksServeThenTrainOnOneMachine) {
  for (int rank = 0; rank < 6; ++rank) {
    JobConfig config = RendezvousJob();
    FakeEnv env({{"OMPI_COMM_WORLD_RANK", std::to_string(rank)},
                 {"OMPI_COMM_WORLD_SIZE", "6"},
                 {"OMPI_COMM_WORLD_LOCAL_SIZE", "6"}});
    absl::StatusOr<RoleAssignment> role =
        ApplyLauncherEnvironment(config, env.getenv());
    ASSERT_TRUE(role.ok()) << role.status();
    EXPECT_EQ(role->role,
              rank < 2 ? RoleAssignment::kServer : RoleAssignment::kWorker);
    EXPECT_EQ(role->rank, rank < 2 ? rank : rank - 2);
    EXPECT_EQ(config.cluster.rendezvous, "127.0.0.1:7100");
  }
}

TEST(LauncherEnvironmentTest, MpiAcrossMachinesNeedsTheRendezvous) {
  std::map<std::string, std::string> vars = {
      {"OMPI_COMM_WORLD_RANK", "3"},
      {"OMPI_COMM_WORLD_SIZE", "6"},
      {"OMPI_COMM_WORLD_LOCAL_SIZE", "3"}};
  JobConfig config = RendezvousJob();
  EXPECT_THAT(ApplyLauncherEnvironment(config, FakeEnv(vars).getenv()),
              StatusIs(kInvalid, HasSubstr("cluster.rendezvous: mpirun "
                                           "across machines")));
  config.cluster.rendezvous = "node01:9000";
  absl::StatusOr<RoleAssignment> role =
      ApplyLauncherEnvironment(config, FakeEnv(vars).getenv());
  ASSERT_TRUE(role.ok()) << role.status();
  EXPECT_EQ(role->role, RoleAssignment::kWorker);
  EXPECT_EQ(role->rank, 1);
  EXPECT_EQ(config.cluster.rendezvous, "node01:9000");
}

TEST(LauncherEnvironmentTest, SlurmMeetsOnTheFirstNodeOfTheAllocation) {
  JobConfig config = RendezvousJob();
  FakeEnv env({{"SLURM_PROCID", "1"},
               {"SLURM_NTASKS", "6"},
               {"SLURM_JOB_NODELIST", "gpu[07-08,11],cpu3"}});
  absl::StatusOr<RoleAssignment> role =
      ApplyLauncherEnvironment(config, env.getenv());
  ASSERT_TRUE(role.ok()) << role.status();
  EXPECT_EQ(role->role, RoleAssignment::kServer);
  EXPECT_EQ(role->rank, 1);
  EXPECT_EQ(config.cluster.rendezvous, "gpu07:7100");
}

TEST(LauncherEnvironmentTest, MistakesNameTheVariableAndChangeNothing) {
  const std::vector<std::pair<std::map<std::string, std::string>, std::string>>
      cases = {
          {{{"SLURM_PROCID", "0"},
            {"SLURM_NTASKS", "5"},
            {"SLURM_JOB_NODELIST", "n1"}},
           "SLURM_NTASKS is 5, not cluster.servers + cluster.workers (2 + 4)"},
          {{{"SLURM_PROCID", "x"}, {"SLURM_NTASKS", "6"}}, "SLURM_PROCID"},
          {{{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "6"}},
           "SLURM_JOB_NODELIST: unset"},
          {{{"SLURM_PROCID", "0"},
            {"SLURM_NTASKS", "6"},
            {"SLURM_JOB_NODELIST", "n[1-"}},
           "SLURM_JOB_NODELIST: '[' without ']'"},
          {{{"OMPI_COMM_WORLD_RANK", "6"},
            {"OMPI_COMM_WORLD_SIZE", "6"},
            {"OMPI_COMM_WORLD_LOCAL_SIZE", "6"}},
           "OMPI_COMM_WORLD_RANK: 6 is not below 6"},
      };
  for (const auto& [vars, message] : cases) {
    JobConfig config = RendezvousJob();
    EXPECT_THAT(ApplyLauncherEnvironment(config, FakeEnv(vars).getenv()),
                StatusIs(kInvalid, HasSubstr(message)))
        << message;
    EXPECT_EQ(config.cluster.rendezvous, "");
  }
  JobConfig listed = RendezvousJob();
  listed.cluster.ps_endpoints = {"a:1", "b:1"};
  EXPECT_THAT(
      ApplyLauncherEnvironment(
          listed,
          FakeEnv({{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "6"}}).getenv()),
      StatusIs(kInvalid, HasSubstr("cluster.ps_endpoints")));
}

}  // namespace
}  // namespace hetps
