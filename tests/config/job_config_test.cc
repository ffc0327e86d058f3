#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdio>
#include <fstream>
#include <string>

#include "hetps/config.h"
#include "support/test_support.h"

namespace hetps {
namespace {

using ::hetps::testing::StatusIs;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

using testing::kInvalid;

constexpr char kFullConfig[] = R"(
name: ctr-small
mode: semi_async
window: 4
log_level: debug
cluster:
  servers: 3
  workers: 5
  host: 10.0.0.1
  ps_endpoints: ["10.0.0.1:7000", "10.0.0.2:7000"]
  worker_endpoints: ["10.0.0.3:7100"]
server:
  num_buckets: 1024
  max_keys_per_request: 1000
  max_message_bytes: 1048576
  sync_wait_timeout_s: 12.5
  heartbeat_timeout_s: 20
  table_stripes: 16
client:
  connect_deadline_s: 5
  rpc_timeout_s: 60
  initial_backoff_s: 0.1
  max_backoff_s: 2
  heartbeat_interval_s: 0.5
train:
  model: lr
  epochs: 7
  batch_size: 128
  optimizer: {type: adam, learning_rate: 0.001, beta1: 0.8, beta2: 0.99}
  init: {type: normal, scale: 0.5, seed: 11}
  data:
    train_samples: 100
    test_samples: 10
    fields: 3
    ids_per_field: 50
    seed: 99
tables:
  - name: lr_w
    kind: sparse
    dim: 1
    optimizer: {type: ftrl, learning_rate: 0.1, l1: 0.5, l2: 0.25, ftrl_beta: 2}
    init: {type: zero}
  - name: lr_b
    kind: dense
    optimizer: {type: sgd}
)";

JobConfig ParseOrDie(const std::string& yaml) {
  absl::StatusOr<JobConfig> config = ParseJobConfigYaml(yaml);
  EXPECT_TRUE(config.ok()) << config.status();
  return config.ok() ? *config : JobConfig{};
}

TEST(JobConfigTest, ParsesEveryField) {
  JobConfig c = ParseOrDie(kFullConfig);
  EXPECT_EQ(c.name, "ctr-small");
  EXPECT_EQ(c.mode, ConsistencyMode::kSemiAsync);
  EXPECT_EQ(c.window, 4);
  EXPECT_EQ(c.log_level, "debug");
  EXPECT_EQ(c.cluster.servers, 3);
  EXPECT_EQ(c.cluster.workers, 5);
  EXPECT_EQ(c.cluster.host, "10.0.0.1");
  EXPECT_THAT(c.cluster.ps_endpoints,
              ElementsAre("10.0.0.1:7000", "10.0.0.2:7000"));
  EXPECT_THAT(c.cluster.worker_endpoints, ElementsAre("10.0.0.3:7100"));
  EXPECT_EQ(c.num_servers(), 2);  // endpoints win over the counts
  EXPECT_EQ(c.num_workers(), 1);
  EXPECT_EQ(c.server.num_buckets, 1024u);
  EXPECT_EQ(c.server.max_keys_per_request, 1000u);
  EXPECT_EQ(c.server.max_message_bytes, 1048576u);
  EXPECT_DOUBLE_EQ(c.server.sync_wait_timeout_s, 12.5);
  EXPECT_DOUBLE_EQ(c.server.heartbeat_timeout_s, 20);
  EXPECT_EQ(c.server.table_stripes, 16);
  EXPECT_DOUBLE_EQ(c.client.connect_deadline_s, 5);
  EXPECT_DOUBLE_EQ(c.client.rpc_timeout_s, 60);
  EXPECT_DOUBLE_EQ(c.client.initial_backoff_s, 0.1);
  EXPECT_DOUBLE_EQ(c.client.max_backoff_s, 2);
  EXPECT_DOUBLE_EQ(c.client.heartbeat_interval_s, 0.5);
  EXPECT_EQ(c.train.model, "lr");
  EXPECT_EQ(c.train.epochs, 7);
  EXPECT_EQ(c.train.batch_size, 128);
  EXPECT_EQ(c.train.optimizer.type, "adam");
  EXPECT_FLOAT_EQ(c.train.optimizer.learning_rate, 0.001f);
  EXPECT_FLOAT_EQ(c.train.optimizer.beta1, 0.8f);
  EXPECT_FLOAT_EQ(c.train.optimizer.beta2, 0.99f);
  EXPECT_FLOAT_EQ(c.train.optimizer.epsilon, 1e-8f);  // untouched default
  EXPECT_EQ(c.train.init.type, "normal");
  EXPECT_FLOAT_EQ(c.train.init.scale, 0.5f);
  EXPECT_EQ(c.train.init.seed, 11u);
  EXPECT_EQ(c.train.data.train_samples, 100u);
  EXPECT_EQ(c.train.data.test_samples, 10u);
  EXPECT_EQ(c.train.data.fields, 3);
  EXPECT_EQ(c.train.data.ids_per_field, 50u);
  EXPECT_EQ(c.train.data.seed, 99u);
  ASSERT_EQ(c.tables.size(), 2u);
  EXPECT_EQ(c.tables[0].name, "lr_w");
  EXPECT_EQ(c.tables[0].kind, TableKind::kSparse);
  EXPECT_EQ(c.tables[0].optimizer.type, "ftrl");
  EXPECT_FLOAT_EQ(c.tables[0].optimizer.l1, 0.5f);
  EXPECT_FLOAT_EQ(c.tables[0].optimizer.l2, 0.25f);
  EXPECT_FLOAT_EQ(c.tables[0].optimizer.ftrl_beta, 2.0f);
  EXPECT_EQ(c.tables[0].init.type, "zero");
  EXPECT_EQ(c.tables[1].name, "lr_b");
  EXPECT_EQ(c.tables[1].kind, TableKind::kDense);
  EXPECT_EQ(c.tables[1].dim, 1u);
  EXPECT_EQ(c.tables[1].optimizer.type, "sgd");
  EXPECT_EQ(c.tables[1].init.type, "uniform");  // struct default
  EXPECT_TRUE(ValidateJobConfig(c).ok()) << ValidateJobConfig(c);
  EXPECT_EQ(c.tables.size(), 2u);  // listed tables are kept as they are
}

TEST(JobConfigTest, EmptyDocumentGivesDefaults) {
  for (const char* text : {"", "# only a comment\n", "server:\n"}) {
    JobConfig c = ParseOrDie(text);
    const JobConfig defaults;
    EXPECT_EQ(c.name, defaults.name);
    EXPECT_EQ(c.mode, ConsistencyMode::kSync);
    EXPECT_EQ(c.cluster.servers, 2);
    EXPECT_EQ(c.cluster.workers, 3);
    EXPECT_EQ(c.num_servers(), 2);
    EXPECT_EQ(c.num_workers(), 3);
    EXPECT_EQ(c.server.num_buckets, 4096u);
    EXPECT_EQ(c.train.optimizer.type, "adagrad");
    EXPECT_TRUE(c.tables.empty());
    EXPECT_TRUE(ValidateJobConfig(c).ok());
  }
}

TEST(JobConfigTest, ModeNamesRoundTrip) {
  for (ConsistencyMode mode : {ConsistencyMode::kSync, ConsistencyMode::kAsync,
                               ConsistencyMode::kSemiAsync}) {
    absl::StatusOr<ConsistencyMode> parsed =
        ParseConsistencyMode(ConsistencyModeName(mode));
    ASSERT_TRUE(parsed.ok());
    EXPECT_EQ(*parsed, mode);
  }
  EXPECT_STREQ(ConsistencyModeName(ConsistencyMode::kSemiAsync), "semi_async");
  EXPECT_THAT(ParseConsistencyMode("ssp"),
              StatusIs(kInvalid,
                       "mode: unknown mode 'ssp' (expected sync, "
                       "async, semi_async)"));
}

TEST(JobConfigTest, UnknownFieldsNameTheirPath) {
  EXPECT_THAT(ParseJobConfigYaml("nmae: x\n"),
              StatusIs(kInvalid, "config: unknown field 'nmae'"));
  EXPECT_THAT(ParseJobConfigYaml("cluster: {wokers: 3}\n"),
              StatusIs(kInvalid, "config: unknown field 'cluster.wokers'"));
  EXPECT_THAT(ParseJobConfigYaml("train: {data: {seeds: 3}}\n"),
              StatusIs(kInvalid, HasSubstr("'train.data.seeds'")));
  EXPECT_THAT(
      ParseJobConfigYaml("tables: [{name: a}, {name: b, optimzer: {}}]\n"),
      StatusIs(kInvalid, HasSubstr("unknown field 'tables[1].optimzer'")));
  EXPECT_THAT(ParseJobConfigYaml(
                  "tables: [{name: a, optimizer: {type: sgd, lr: 1}}]\n"),
              StatusIs(kInvalid, HasSubstr("'tables[0].optimizer.lr'")));
}

TEST(JobConfigTest, WrongTypesNameTheField) {
  EXPECT_THAT(
      ParseJobConfigYaml("train: {epochs: abc}\n"),
      StatusIs(kInvalid, "train.epochs: expected an integer, got 'abc'"));
  EXPECT_THAT(ParseJobConfigYaml("server: {num_buckets: -1}\n"),
              StatusIs(kInvalid, HasSubstr("server.num_buckets: expected a "
                                           "non-negative integer")));
  EXPECT_THAT(
      ParseJobConfigYaml("window: 99999999999\n"),
      StatusIs(kInvalid, HasSubstr("window: 99999999999 is out of range")));
  EXPECT_THAT(
      ParseJobConfigYaml("client: {rpc_timeout_s: soon}\n"),
      StatusIs(kInvalid, HasSubstr("client.rpc_timeout_s: expected a number")));
  EXPECT_THAT(
      ParseJobConfigYaml("cluster: {ps_endpoints: 'a:1'}\n"),
      StatusIs(kInvalid, "cluster.ps_endpoints: expected a list, got 'a:1'"));
  EXPECT_THAT(ParseJobConfigYaml("cluster: [1, 2]\n"),
              StatusIs(kInvalid, "cluster: expected a map, got a list"));
  EXPECT_THAT(ParseJobConfigYaml("name: [a]\n"),
              StatusIs(kInvalid, HasSubstr("name: expected a string")));
  EXPECT_THAT(ParseJobConfigYaml("mode: fast\n"),
              StatusIs(kInvalid, HasSubstr("mode: unknown mode 'fast'")));
  EXPECT_THAT(
      ParseJobConfigYaml("tables: [{name: a, kind: wide}]\n"),
      StatusIs(kInvalid, HasSubstr("tables[0].kind: unknown kind 'wide'")));
  EXPECT_THAT(ParseJobConfigYaml("- 1\n- 2\n"),
              StatusIs(kInvalid, HasSubstr("config: expected a map")));
}

TEST(JobConfigTest, RepeatedFieldIsAnError) {
  EXPECT_THAT(ParseJobConfigYaml("train:\n  epochs: 1\n  epochs: 2\n"),
              StatusIs(kInvalid, HasSubstr("'train.epochs' is given twice")));
}

TEST(JobConfigTest, SyntaxErrorGivesTheLine) {
  EXPECT_THAT(ParseJobConfigYaml("name: a\ntrain:\n  epochs: [1, 2\n"),
              StatusIs(kInvalid, HasSubstr("line 4")));
  EXPECT_THAT(ParseJobConfigYaml("name: a\n  bad: indent\n"),
              StatusIs(kInvalid, HasSubstr("line 2")));
}

// Validation -----------------------------------------------------------------

absl::Status ValidateYaml(const std::string& yaml) {
  absl::StatusOr<JobConfig> config = ParseJobConfigYaml(yaml);
  if (!config.ok()) return config.status();
  return ValidateJobConfig(*config);
}

TEST(JobConfigTest, ValidationNamesTheField) {
  EXPECT_THAT(ValidateYaml("window: -3\n"),
              StatusIs(kInvalid, "window: must be >= 0, got -3"));
  EXPECT_THAT(ValidateYaml("cluster: {workers: 0}\n"),
              StatusIs(kInvalid, "cluster.workers: must be >= 1, got 0"));
  EXPECT_THAT(ValidateYaml("cluster: {servers: 0}\n"),
              StatusIs(kInvalid, HasSubstr("cluster.servers")));
  // Counts do not matter once endpoints are given.
  EXPECT_TRUE(
      ValidateYaml("cluster: {servers: 0, ps_endpoints: [a:1]}\n").ok());
  EXPECT_THAT(
      ValidateYaml("cluster: {ps_endpoints: ['a:1', 'foo']}\n"),
      StatusIs(kInvalid, "cluster.ps_endpoints[1]: 'foo' is not host:port"));
  EXPECT_THAT(ValidateYaml("cluster: {worker_endpoints: ['a:1', 'a:1']}\n"),
              StatusIs(kInvalid, HasSubstr("cluster.worker_endpoints[1]")));
  EXPECT_THAT(ValidateYaml("cluster: {rendezvous: 'node01'}\n"),
              StatusIs(kInvalid, HasSubstr("cluster.rendezvous: ")));
  EXPECT_TRUE(ValidateYaml("cluster: {rendezvous: 'node01:7100'}\n").ok());
  EXPECT_THAT(ValidateYaml("train: {batch_size: 0}\n"),
              StatusIs(kInvalid, HasSubstr("train.batch_size: must be >= 1")));
  EXPECT_THAT(ValidateYaml("train: {epochs: 0}\n"),
              StatusIs(kInvalid, HasSubstr("train.epochs: must be >= 1")));
  EXPECT_THAT(
      ValidateYaml("train: {warmup_rounds: -1}\n"),
      StatusIs(kInvalid, HasSubstr("train.warmup_rounds: must be >= 0")));
  EXPECT_THAT(
      ValidateYaml("train: {model: dnn}\n"),
      StatusIs(
          kInvalid,
          "train.model: unknown model 'dnn' (expected lr, fm, deepfm, none)"));
  EXPECT_THAT(ValidateYaml("train: {isa: avx3}\n"),
              StatusIs(kInvalid,
                       "train.isa: unknown instruction-set level 'avx3' "
                       "(expected auto, sse2, avx2, avx512)"));
  EXPECT_THAT(ValidateYaml("client: {rpc_timeout_s: 0}\n"),
              StatusIs(kInvalid, HasSubstr("client.rpc_timeout_s: must be")));
  EXPECT_THAT(ValidateYaml("server: {heartbeat_timeout_s: -1}\n"),
              StatusIs(kInvalid, HasSubstr("server.heartbeat_timeout_s")));
  EXPECT_THAT(ValidateYaml("client: {heartbeat_interval_s: 30}\n"),
              StatusIs(kInvalid, HasSubstr("client.heartbeat_interval_s: must "
                                           "be < server.heartbeat_timeout_s")));
  EXPECT_THAT(ValidateYaml("cluster: {servers: 8}\nserver: {num_buckets: 4}\n"),
              StatusIs(kInvalid,
                       "server.num_buckets: must be >= the number "
                       "of servers (8), got 4"));
  EXPECT_THAT(ValidateYaml("client: {hot_rows: {enabled: true}}\n"),
              StatusIs(kInvalid, HasSubstr("client.hot_rows.enabled: sync "
                                           "reads exact rows")));
  EXPECT_THAT(
      ValidateYaml("mode: async\n"
                   "client: {hot_rows: {enabled: true, hot_share: 0}}\n"),
      StatusIs(kInvalid, HasSubstr("client.hot_rows.hot_share: must "
                                   "be in (0, 1], got 0")));
  EXPECT_THAT(
      ValidateYaml("mode: async\n"
                   "client: {hot_rows: {enabled: true, sample_drift: -0.1}}\n"),
      StatusIs(kInvalid, HasSubstr("client.hot_rows.sample_drift: must "
                                   "be 0 or more, got -0.1")));
  EXPECT_TRUE(
      ValidateYaml("mode: async\nclient: {hot_rows: {enabled: true}}\n").ok());
  EXPECT_THAT(ValidateYaml("log_level: loud\n"),
              StatusIs(kInvalid, HasSubstr("log_level: unknown level 'loud'")));
}

TEST(JobConfigTest, ValidationChecksServerProfilesAndSharding) {
  // The default cluster has 2 servers.
  EXPECT_TRUE(
      ValidateYaml("server_profiles: [{ranks: [1], speed: 0.5}]\n").ok());
  EXPECT_THAT(ValidateYaml("server_profiles: [{ranks: [2], speed: 0.5}]\n"),
              StatusIs(kInvalid, HasSubstr("server_profiles[0].ranks: server "
                                           "2 out of range (the job has 2 "
                                           "servers)")));
  EXPECT_THAT(
      ValidateYaml("server_profiles: [{ranks: [0]}, {ranks: [0]}]\n"),
      StatusIs(kInvalid, HasSubstr("server_profiles[1].ranks: server 0 is "
                                   "also in server_profiles[0]")));
  EXPECT_THAT(ValidateYaml("server_profiles: [{ranks: [0], speed: 2}]\n"),
              StatusIs(kInvalid, "server_profiles[0].speed: must be in (0, "
                                 "1], got 2"));
  EXPECT_THAT(
      ValidateYaml("server_profiles: [{ranks: [0], slowdowns: [{from_s: 5, "
                   "to_s: 2, factor: 0.5}]}]\n"),
      StatusIs(kInvalid, HasSubstr("server_profiles[0].slowdowns[0].to_s: "
                                   "must be > from_s")));
  EXPECT_THAT(ValidateYaml("sharding: {trigger: 0.9}\n"),
              StatusIs(kInvalid, HasSubstr("sharding.trigger: must be >= 1")));
  EXPECT_THAT(ValidateYaml("sharding: {trigger: 1.2, target: 1.3}\n"),
              StatusIs(kInvalid, HasSubstr("sharding.target: must be in [1, "
                                           "trigger (1.2)], got 1.3")));
  EXPECT_THAT(ValidateYaml("sharding: {max_moved_mb: 0}\n"),
              StatusIs(kInvalid, HasSubstr("sharding.max_moved_mb")));
  EXPECT_TRUE(
      ValidateYaml("sharding: {migrate: true}\ncheckpoint: {dir: /tmp/x}\n")
          .ok());
  EXPECT_TRUE(ValidateYaml("sharding: {migrate: true}\n").ok());
}

TEST(JobConfigTest, ValidationChecksOptimizersAndInitializers) {
  EXPECT_THAT(ValidateYaml("train: {optimizer: {type: rmsprop}}\n"),
              StatusIs(kInvalid,
                       "train.optimizer.type: unknown optimizer "
                       "'rmsprop' (expected sgd, adagrad, adam, ftrl)"));
  EXPECT_THAT(ValidateYaml("train: {optimizer: {learning_rate: 0}}\n"),
              StatusIs(kInvalid, HasSubstr("train.optimizer.learning_rate")));
  EXPECT_THAT(ValidateYaml("train: {optimizer: {learning_rate: nan}}\n"),
              StatusIs(kInvalid, HasSubstr("train.optimizer.learning_rate")));
  EXPECT_THAT(
      ValidateYaml("train: {optimizer: {beta1: 1}}\n"),
      StatusIs(kInvalid, "train.optimizer.beta1: must be in [0, 1), got 1"));
  EXPECT_THAT(ValidateYaml("train: {optimizer: {epsilon: 0}}\n"),
              StatusIs(kInvalid, HasSubstr("train.optimizer.epsilon")));
  EXPECT_THAT(ValidateYaml("train: {optimizer: {l1: -0.5}}\n"),
              StatusIs(kInvalid, HasSubstr("train.optimizer.l1")));
  EXPECT_THAT(ValidateYaml("tables: [{name: lr_w}, {name: lr_b, kind: dense, "
                           "optimizer: {ftrl_beta: -1}}]\n"),
              StatusIs(kInvalid, HasSubstr("tables[1].optimizer.ftrl_beta")));
  EXPECT_THAT(
      ValidateYaml("train: {init: {type: ones}}\n"),
      StatusIs(kInvalid, HasSubstr("train.init.type: unknown initializer")));
  EXPECT_THAT(ValidateYaml("train: {init: {scale: -1}}\n"),
              StatusIs(kInvalid, HasSubstr("train.init.scale")));
}

TEST(JobConfigTest, ValidationChecksTables) {
  EXPECT_THAT(ValidateYaml("tables: [{name: lr_w}, {name: lr_b, kind: dense}, "
                           "{name: lr_w}]\n"),
              StatusIs(kInvalid,
                       "tables[2].name: duplicate table name 'lr_w' (also "
                       "tables[0])"));
  EXPECT_THAT(ValidateYaml("tables: [{dim: 4}]\n"),
              StatusIs(kInvalid, "tables[0].name: must not be empty"));
  EXPECT_THAT(ValidateYaml("tables: [{name: lr_w, dim: 0}]\n"),
              StatusIs(kInvalid, HasSubstr("tables[0].dim: must be >= 1")));
}

TEST(JobConfigTest, ValidationLeavesModelTablesToTheModel) {
  // The model's tables depend on the data's shape; ResolveModelTables
  // (tests/model) fills them, not validation.
  JobConfig c = ParseOrDie("train: {model: deepfm}\n");
  ASSERT_TRUE(ValidateJobConfig(c).ok());
  EXPECT_TRUE(c.tables.empty());
  EXPECT_THAT(ValidateYaml("train: {model: dnn}\n"),
              StatusIs(kInvalid, HasSubstr("train.model: unknown model 'dnn' "
                                           "(expected lr, fm, deepfm, none)")));
}

// Overrides ------------------------------------------------------------------

TEST(JobConfigTest, OverridesSetFieldsByPath) {
  JobConfig c;
  ASSERT_TRUE(ApplyOverride(c, "train.epochs=3").ok());
  ASSERT_TRUE(ApplyOverride(c, "mode=async").ok());
  ASSERT_TRUE(ApplyOverride(c, "train.optimizer.learning_rate = 0.25").ok());
  ASSERT_TRUE(ApplyOverride(c, "cluster.ps_endpoints=a:1,b:2").ok());
  ASSERT_TRUE(ApplyOverride(c, "name=my job").ok());
  ASSERT_TRUE(ApplyOverride(c, "cluster.worker_endpoints=[w:1, w:2]").ok());
  EXPECT_EQ(c.train.epochs, 3);
  EXPECT_EQ(c.mode, ConsistencyMode::kAsync);
  EXPECT_FLOAT_EQ(c.train.optimizer.learning_rate, 0.25f);
  EXPECT_EQ(c.train.optimizer.type, "adagrad");  // siblings untouched
  EXPECT_THAT(c.cluster.ps_endpoints, ElementsAre("a:1", "b:2"));
  EXPECT_THAT(c.cluster.worker_endpoints, ElementsAre("w:1", "w:2"));
  EXPECT_EQ(c.name, "my job");
  EXPECT_EQ(c.num_servers(), 2);

  ASSERT_TRUE(ApplyOverride(c, "cluster.ps_endpoints[1]=c:3").ok());
  EXPECT_THAT(c.cluster.ps_endpoints, ElementsAre("a:1", "c:3"));
  ASSERT_TRUE(ApplyOverride(c, "cluster.ps_endpoints=").ok());
  EXPECT_TRUE(c.cluster.ps_endpoints.empty());
}

TEST(JobConfigTest, OverridesReachTablesByIndex) {
  JobConfig c = ParseOrDie(kFullConfig);
  ASSERT_TRUE(ApplyOverride(c, "tables[1].optimizer.learning_rate=0.5").ok());
  EXPECT_FLOAT_EQ(c.tables[1].optimizer.learning_rate, 0.5f);
  EXPECT_EQ(c.tables[1].optimizer.type, "sgd");
  EXPECT_THAT(ApplyOverride(c, "tables[2].dim=3"),
              StatusIs(kInvalid, HasSubstr("tables[2]: no such entry")));
}

TEST(JobConfigTest, BadOverridesLeaveConfigUnchanged) {
  JobConfig c;
  EXPECT_THAT(ApplyOverride(c, "train.epoch=3"),
              StatusIs(kInvalid, HasSubstr("unknown field 'train.epoch'")));
  EXPECT_THAT(
      ApplyOverride(c, "train.epochs=abc"),
      StatusIs(kInvalid, "train.epochs: expected an integer, got 'abc'"));
  EXPECT_THAT(ApplyOverride(c, "train.epochs"),
              StatusIs(kInvalid, HasSubstr("expected path=value")));
  EXPECT_THAT(ApplyOverride(c, "=3"), StatusIs(kInvalid, HasSubstr("empty")));
  EXPECT_THAT(ApplyOverride(c, "train..epochs=3"),
              StatusIs(kInvalid, HasSubstr("malformed field path")));
  EXPECT_THAT(ApplyOverride(c, "train=3"),
              StatusIs(kInvalid, "train: expected a map, got '3'"));
  EXPECT_THAT(ApplyOverride(c, "mode=fast"),
              StatusIs(kInvalid, HasSubstr("mode: unknown mode 'fast'")));
  EXPECT_EQ(c.train.epochs, TrainConfig{}.epochs);
  EXPECT_EQ(c.mode, ConsistencyMode::kSync);
}

// Files and endpoints --------------------------------------------------------

TEST(JobConfigTest, LoadsFileAndReportsMissingOne) {
  const std::string path = ::testing::TempDir() + "/hetps_job_config_test.yaml";
  {
    std::ofstream out(path);
    out << "name: from-file\ntrain: {epochs: 9}\n";
  }
  absl::StatusOr<JobConfig> c = LoadJobConfigFile(path);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->name, "from-file");
  EXPECT_EQ(c->train.epochs, 9);
  std::remove(path.c_str());

  EXPECT_THAT(LoadJobConfigFile("/nonexistent/job.yaml"),
              StatusIs(absl::StatusCode::kNotFound,
                       HasSubstr("/nonexistent/job.yaml")));
  EXPECT_THAT(LoadJobConfigFile(::testing::TempDir()),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr("cannot read")));
}

TEST(JobConfigTest, EndpointsNeedHostAndPort) {
  for (const char* good :
       {"localhost:1", "10.1.2.3:65535", "[::1]:8080", "a.b.c:443"}) {
    EXPECT_TRUE(ValidateEndpoint(good).ok()) << good;
  }
  for (const char* bad :
       {"foo", ":80", "host:", "host:0", "host:65536", "host:8x", "host:-1",
        "::1:80", "[::1]", "[]:80", "[::1]80", "my host:80", ""}) {
    EXPECT_THAT(ValidateEndpoint(bad),
                StatusIs(kInvalid, HasSubstr("is not host:port")))
        << bad;
  }
}

}  // namespace
}  // namespace hetps
