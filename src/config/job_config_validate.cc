// Validating a JobConfig (include/hetps/config.h): every field checked once,
// each error naming its field (ValidateJobConfig), and endpoints.
#include <cmath>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "config/config_errors.h"
#include "hetps/config.h"

namespace hetps {
namespace {

// Names accepted by the string-valued enums. Order is the order shown in
// error messages.
constexpr absl::string_view kOptimizerTypes[] = {"sgd", "adagrad", "adam",
                                                 "ftrl"};
constexpr absl::string_view kInitializerTypes[] = {"zero", "uniform", "normal"};
// Built-in models (src/model/), plus "none" for jobs whose own code drives
// the PsClient API.
constexpr absl::string_view kModels[] = {"lr", "fm", "deepfm", "none"};
constexpr absl::string_view kIsas[] = {"auto", "sse2", "avx2", "avx512"};
constexpr absl::string_view kDataFormats[] = {"synthetic", "movielens",
                                              "criteo", "libsvm", "libfm"};
constexpr absl::string_view kLogLevels[] = {"trace", "debug", "info", "warn",
                                            "error"};

// ---------------------------------------------------------------------------
// Validation helpers: each returns an error naming `path`.

template <typename Int>
absl::Status CheckAtLeast(absl::string_view path, Int value, Int min) {
  if (value >= min) return absl::OkStatus();
  return Invalid(path, ": must be >= ", min, ", got ", value);
}

absl::Status CheckPositive(absl::string_view path, double value) {
  if (std::isfinite(value) && value > 0) return absl::OkStatus();
  return Invalid(path, ": must be a finite number > 0, got ", value);
}

absl::Status CheckNonNegative(absl::string_view path, double value) {
  if (std::isfinite(value) && value >= 0) return absl::OkStatus();
  return Invalid(path, ": must be a finite number >= 0, got ", value);
}

absl::Status CheckUnitInterval(absl::string_view path, double value) {
  if (value >= 0 && value < 1) return absl::OkStatus();
  return Invalid(path, ": must be in [0, 1), got ", value);
}

absl::Status CheckOneOf(absl::string_view path, absl::string_view what,
                        absl::string_view value,
                        absl::Span<const absl::string_view> allowed) {
  for (absl::string_view name : allowed) {
    if (value == name) return absl::OkStatus();
  }
  return Invalid(path, ": unknown ", what, " '", value, "' (expected ",
                 absl::StrJoin(allowed, ", "), ")");
}

// Returns the first failing check from the enclosing function.

absl::Status ValidateOptimizer(const std::string& path,
                               const OptimizerConfig& opt) {
  CONFIG_RETURN_IF_ERROR(CheckOneOf(JoinPath(path, "type"), "optimizer",
                                    opt.type, kOptimizerTypes));
  CONFIG_RETURN_IF_ERROR(
      CheckPositive(JoinPath(path, "learning_rate"), opt.learning_rate));
  CONFIG_RETURN_IF_ERROR(CheckNonNegative(JoinPath(path, "initial_accumulator"),
                                          opt.initial_accumulator));
  CONFIG_RETURN_IF_ERROR(CheckPositive(JoinPath(path, "epsilon"), opt.epsilon));
  CONFIG_RETURN_IF_ERROR(CheckUnitInterval(JoinPath(path, "beta1"), opt.beta1));
  CONFIG_RETURN_IF_ERROR(CheckUnitInterval(JoinPath(path, "beta2"), opt.beta2));
  CONFIG_RETURN_IF_ERROR(
      CheckNonNegative(JoinPath(path, "ftrl_beta"), opt.ftrl_beta));
  CONFIG_RETURN_IF_ERROR(CheckNonNegative(JoinPath(path, "l1"), opt.l1));
  CONFIG_RETURN_IF_ERROR(CheckNonNegative(JoinPath(path, "l2"), opt.l2));
  return absl::OkStatus();
}

absl::Status ValidateInit(const std::string& path,
                          const InitializerConfig& init) {
  CONFIG_RETURN_IF_ERROR(CheckOneOf(JoinPath(path, "type"), "initializer",
                                    init.type, kInitializerTypes));
  CONFIG_RETURN_IF_ERROR(CheckNonNegative(JoinPath(path, "scale"), init.scale));
  return absl::OkStatus();
}

absl::Status ValidateEndpoints(const std::string& path,
                               const std::vector<std::string>& endpoints) {
  for (size_t i = 0; i < endpoints.size(); ++i) {
    absl::Status status = ValidateEndpoint(endpoints[i]);
    if (!status.ok())
      return Invalid(IndexPath(path, i), ": ", status.message());
    for (size_t j = 0; j < i; ++j) {
      if (endpoints[j] == endpoints[i]) {
        return Invalid(IndexPath(path, i), ": '", endpoints[i], "' is also ",
                       IndexPath(path, j));
      }
    }
  }
  return absl::OkStatus();
}

absl::Status ValidateCluster(const ClusterConfig& cluster) {
  if (cluster.ps_endpoints.empty()) {
    CONFIG_RETURN_IF_ERROR(CheckAtLeast("cluster.servers", cluster.servers, 1));
  }
  if (cluster.worker_endpoints.empty()) {
    CONFIG_RETURN_IF_ERROR(CheckAtLeast("cluster.workers", cluster.workers, 1));
  }
  if (cluster.host.empty()) return Invalid("cluster.host: must not be empty");
  CONFIG_RETURN_IF_ERROR(
      ValidateEndpoints("cluster.ps_endpoints", cluster.ps_endpoints));
  CONFIG_RETURN_IF_ERROR(
      ValidateEndpoints("cluster.worker_endpoints", cluster.worker_endpoints));
  if (!cluster.rendezvous.empty()) {
    if (absl::Status s = ValidateEndpoint(cluster.rendezvous); !s.ok()) {
      return Invalid("cluster.rendezvous: ", s.message());
    }
  }
  return absl::OkStatus();
}

absl::Status ValidateServer(const ServerOptions& server, int num_servers) {
  if (static_cast<int64_t>(server.num_buckets) < num_servers) {
    return Invalid("server.num_buckets: must be >= the number of servers (",
                   num_servers, "), got ", server.num_buckets);
  }
  CONFIG_RETURN_IF_ERROR(CheckAtLeast<uint64_t>(
      "server.max_keys_per_request", server.max_keys_per_request, 1));
  // gRPC takes message limits as int.
  constexpr uint64_t kMaxGrpcMessage = std::numeric_limits<int>::max();
  if (server.max_message_bytes < 1 ||
      server.max_message_bytes > kMaxGrpcMessage) {
    return Invalid("server.max_message_bytes: must be in 1..", kMaxGrpcMessage,
                   ", got ", server.max_message_bytes);
  }
  CONFIG_RETURN_IF_ERROR(
      CheckPositive("server.sync_wait_timeout_s", server.sync_wait_timeout_s));
  CONFIG_RETURN_IF_ERROR(
      CheckPositive("server.heartbeat_timeout_s", server.heartbeat_timeout_s));
  CONFIG_RETURN_IF_ERROR(
      CheckAtLeast("server.table_stripes", server.table_stripes, 1));
  return absl::OkStatus();
}

absl::Status ValidateHotRows(const HotRowsConfig& hot_rows,
                             ConsistencyMode mode) {
  if (!hot_rows.enabled) return absl::OkStatus();
  if (mode == ConsistencyMode::kSync) {
    return Invalid(
        "client.hot_rows.enabled: sync reads exact rows, a cache has nothing "
        "to skip; use semi_async or async");
  }
  if (!(hot_rows.hot_share > 0 && hot_rows.hot_share <= 1)) {
    return Invalid("client.hot_rows.hot_share: must be in (0, 1], got ",
                   hot_rows.hot_share);
  }
  if (!(hot_rows.sample_drift >= 0 && std::isfinite(hot_rows.sample_drift))) {
    return Invalid("client.hot_rows.sample_drift: must be 0 or more, got ",
                   hot_rows.sample_drift);
  }
  return CheckAtLeast<uint64_t>("client.hot_rows.max_rows", hot_rows.max_rows,
                                1);
}

absl::Status ValidateClient(const ClientOptions& client,
                            const ServerOptions& server) {
  CONFIG_RETURN_IF_ERROR(
      CheckPositive("client.connect_deadline_s", client.connect_deadline_s));
  CONFIG_RETURN_IF_ERROR(
      CheckPositive("client.rpc_timeout_s", client.rpc_timeout_s));
  CONFIG_RETURN_IF_ERROR(
      CheckPositive("client.initial_backoff_s", client.initial_backoff_s));
  CONFIG_RETURN_IF_ERROR(
      CheckPositive("client.max_backoff_s", client.max_backoff_s));
  if (client.max_backoff_s < client.initial_backoff_s) {
    return Invalid(
        "client.max_backoff_s: must be >= client.initial_backoff_s (",
        client.initial_backoff_s, "), got ", client.max_backoff_s);
  }
  CONFIG_RETURN_IF_ERROR(CheckPositive("client.heartbeat_interval_s",
                                       client.heartbeat_interval_s));
  // A worker beating slower than the servers' timeout would be dropped
  // while healthy.
  if (client.heartbeat_interval_s >= server.heartbeat_timeout_s) {
    return Invalid(
        "client.heartbeat_interval_s: must be < server.heartbeat_timeout_s (",
        server.heartbeat_timeout_s, "), got ", client.heartbeat_interval_s);
  }
  return absl::OkStatus();
}

absl::Status ValidateMetrics(const MetricsConfig& metrics, int servers) {
  if (metrics.enabled && metrics.address.empty()) {
    return Invalid("metrics.address: empty (set metrics.enabled: false to ",
                   "serve no metrics)");
  }
  if (metrics.port < 0 || metrics.port + servers - 1 > 65535) {
    return Invalid("metrics.port: server r listens on port + r, so it must ",
                   "be in [0, ", 65536 - servers, "], got ", metrics.port);
  }
  return absl::OkStatus();
}

// Consistency only; whether the files exist is ResolveCredentials' business.
absl::Status ValidateAuth(const AuthConfig& auth) {
  if (!auth.token_file.empty() && !auth.token_env.empty()) {
    return Invalid(
        "auth.token_env: set auth.token_file or auth.token_env, "
        "not both");
  }
  const int tls_files =
      !auth.tls_ca.empty() + !auth.tls_cert.empty() + !auth.tls_key.empty();
  if (tls_files != 0 && tls_files != 3) {
    return Invalid(
        "auth.tls_ca, auth.tls_cert, auth.tls_key: set all three "
        "or none");
  }
  if (auth.tls_client_cert.empty() != auth.tls_client_key.empty()) {
    return Invalid(
        "auth.tls_client_cert, auth.tls_client_key: set both or "
        "neither");
  }
  if (!auth.tls_client_cert.empty() && tls_files == 0) {
    return Invalid(
        "auth.tls_client_cert: needs TLS (auth.tls_ca, "
        "auth.tls_cert, auth.tls_key)");
  }
  if (auth.require_client_cert && auth.tls_client_cert.empty()) {
    return Invalid(
        "auth.require_client_cert: needs TLS and the clients' "
        "certificate (auth.tls_client_cert, auth.tls_client_key)");
  }
  return absl::OkStatus();
}

absl::Status ValidateTrain(const TrainConfig& train) {
  CONFIG_RETURN_IF_ERROR(CheckAtLeast("train.epochs", train.epochs, 1));
  CONFIG_RETURN_IF_ERROR(CheckAtLeast("train.batch_size", train.batch_size, 1));
  CONFIG_RETURN_IF_ERROR(ValidateOptimizer("train.optimizer", train.optimizer));
  CONFIG_RETURN_IF_ERROR(
      ValidateOptimizer("train.dense_optimizer", train.dense_optimizer));
  CONFIG_RETURN_IF_ERROR(ValidateInit("train.init", train.init));
  CONFIG_RETURN_IF_ERROR(
      CheckAtLeast("train.embedding_dim", train.embedding_dim, 1));
  for (size_t i = 0; i < train.hidden.size(); ++i) {
    CONFIG_RETURN_IF_ERROR(
        CheckAtLeast(IndexPath("train.hidden", i), train.hidden[i], 1));
  }
  CONFIG_RETURN_IF_ERROR(
      CheckAtLeast("train.eval_every_epochs", train.eval_every_epochs, 1));
  CONFIG_RETURN_IF_ERROR(
      CheckNonNegative("train.eval_every_s", train.eval_every_s));
  CONFIG_RETURN_IF_ERROR(
      CheckAtLeast("train.warmup_rounds", train.warmup_rounds, 0));
  CONFIG_RETURN_IF_ERROR(
      CheckAtLeast("train.data.chunks", train.data.chunks, 0));
  CONFIG_RETURN_IF_ERROR(
      CheckOneOf("train.model", "model", train.model, kModels));
  CONFIG_RETURN_IF_ERROR(
      CheckOneOf("train.isa", "instruction-set level", train.isa, kIsas));
  CONFIG_RETURN_IF_ERROR(CheckOneOf("train.data.format", "format",
                                    train.data.format, kDataFormats));
  if (train.data.format != "synthetic" && train.data.path.empty()) {
    return Invalid("train.data.path: format '", train.data.format,
                   "' needs a path");
  }
  if (!(train.data.test_fraction >= 0 && train.data.test_fraction < 1)) {
    return Invalid("train.data.test_fraction: must be in [0, 1), got ",
                   train.data.test_fraction);
  }
  if (!(train.data.max_bad_fraction >= 0 && train.data.max_bad_fraction <= 1)) {
    return Invalid("train.data.max_bad_fraction: must be in [0, 1], got ",
                   train.data.max_bad_fraction);
  }
  if (train.data.format == "libfm") {
    CONFIG_RETURN_IF_ERROR(
        CheckAtLeast("train.data.libfm_slots", train.data.libfm_slots, 1));
  }
  CONFIG_RETURN_IF_ERROR(CheckAtLeast<uint64_t>("train.data.train_samples",
                                                train.data.train_samples, 1));
  CONFIG_RETURN_IF_ERROR(
      CheckAtLeast("train.data.fields", train.data.fields, 1));
  CONFIG_RETURN_IF_ERROR(CheckAtLeast<uint64_t>("train.data.ids_per_field",
                                                train.data.ids_per_field, 1));
  return absl::OkStatus();
}

constexpr absl::string_view kBatchPlans[] = {"fixed", "proportional", "auto"};
constexpr absl::string_view kCodecs[] = {
    "none", "fp16", "int8", "sparse", "sparse+fp16", "sparse+int8", "adaptive"};

// The ranks of profile `g` of `list` (device_profiles, server_profiles):
// each a `role` of the job's `count`, and in no earlier profile of the list
// (`group_of`, by rank, records which profile took it).
absl::Status ValidateProfileRanks(const std::string& list, size_t g,
                                  const std::vector<int>& ranks,
                                  const std::string& role, int count,
                                  std::vector<int>& group_of) {
  const std::string path = IndexPath(list, g);
  if (ranks.empty()) return Invalid(path, ".ranks: must list ", role, "s");
  for (int r : ranks) {
    if (r < 0 || r >= count) {
      return Invalid(path, ".ranks: ", role, " ", r,
                     " out of range (the job has ", count, " ", role, "s)");
    }
    if (group_of[r] >= 0) {
      return Invalid(path, ".ranks: ", role, " ", r, " is also in ", list, "[",
                     group_of[r], "]");
    }
    group_of[r] = static_cast<int>(g);
  }
  return absl::OkStatus();
}

// The slow-downs of the profile at `path` (a worker's or a server's).
absl::Status ValidateSlowdowns(const std::string& path,
                               const std::vector<SlowdownConfig>& slowdowns) {
  for (size_t i = 0; i < slowdowns.size(); ++i) {
    const std::string sp = IndexPath(JoinPath(path, "slowdowns"), i);
    const SlowdownConfig& d = slowdowns[i];
    CONFIG_RETURN_IF_ERROR(CheckNonNegative(JoinPath(sp, "from_s"), d.from_s));
    if (!(d.to_s > d.from_s)) {
      return Invalid(sp, ".to_s: must be > from_s (", d.from_s, "), got ",
                     d.to_s);
    }
    if (!(d.factor > 0 && d.factor <= 1)) {
      return Invalid(sp, ".factor: must be in (0, 1], got ", d.factor);
    }
  }
  return absl::OkStatus();
}

absl::Status ValidateHeterogeneity(const JobConfig& config) {
  const SemiAsyncConfig& sa = config.semi_async;
  CONFIG_RETURN_IF_ERROR(
      CheckAtLeast("semi_async.window_min", sa.window_min, 1));
  CONFIG_RETURN_IF_ERROR(
      CheckAtLeast("semi_async.window_max", sa.window_max, sa.window_min));
  CONFIG_RETURN_IF_ERROR(
      CheckPositive("semi_async.flush_after_s", sa.flush_after_s));
  CONFIG_RETURN_IF_ERROR(
      CheckPositive("semi_async.adapt_every_s", sa.adapt_every_s));
  CONFIG_RETURN_IF_ERROR(
      CheckNonNegative("semi_async.staleness_decay", sa.staleness_decay));
  if (!(sa.min_apply_fraction >= 0 && sa.min_apply_fraction <= 1)) {
    return Invalid("semi_async.min_apply_fraction: must be in [0, 1], got ",
                   sa.min_apply_fraction);
  }
  const CompressConfig& cc = config.compress;
  CONFIG_RETURN_IF_ERROR(
      CheckOneOf("compress.codec", "codec", cc.codec, kCodecs));
  if (!(cc.keep_fraction >= 0 && cc.keep_fraction <= 1)) {
    return Invalid("compress.keep_fraction: must be in [0, 1], got ",
                   cc.keep_fraction);
  }
  if (!(cc.max_transfer_fraction > 0 && cc.max_transfer_fraction <= 1)) {
    return Invalid("compress.max_transfer_fraction: must be in (0, 1], got ",
                   cc.max_transfer_fraction);
  }
  if (!(cc.overcompression_ratio > 1 &&
        std::isfinite(cc.overcompression_ratio))) {
    return Invalid("compress.overcompression_ratio: must be > 1, got ",
                   cc.overcompression_ratio);
  }
  CONFIG_RETURN_IF_ERROR(CheckOneOf("planner.batch_plan", "batch plan",
                                    config.planner.batch_plan, kBatchPlans));
  CONFIG_RETURN_IF_ERROR(CheckPositive("planner.replan_threshold",
                                       config.planner.replan_threshold));
  std::vector<int> group_of(config.num_workers(), -1);
  for (size_t g = 0; g < config.device_profiles.size(); ++g) {
    const std::string path = IndexPath("device_profiles", g);
    const DeviceProfileConfig& p = config.device_profiles[g];
    CONFIG_RETURN_IF_ERROR(ValidateProfileRanks("device_profiles", g, p.ranks,
                                                "worker", config.num_workers(),
                                                group_of));
    CONFIG_RETURN_IF_ERROR(
        CheckNonNegative(JoinPath(path, "throughput"), p.throughput));
    CONFIG_RETURN_IF_ERROR(
        CheckNonNegative(JoinPath(path, "memory_mb"), p.memory_mb));
    CONFIG_RETURN_IF_ERROR(
        CheckNonNegative(JoinPath(path, "bandwidth_mbps"), p.bandwidth_mbps));
    CONFIG_RETURN_IF_ERROR(
        CheckAtLeast(JoinPath(path, "batch_size"), p.batch_size, 0));
    CONFIG_RETURN_IF_ERROR(
        CheckAtLeast(JoinPath(path, "push_freq"), p.push_freq, 0));
    CONFIG_RETURN_IF_ERROR(ValidateSlowdowns(path, p.slowdowns));
    if (!p.slowdowns.empty() && p.throughput == 0) {
      return Invalid(IndexPath(JoinPath(path, "slowdowns"), 0),
                     ": a slow-down needs ", path,
                     ".throughput (the speed it slows down from)");
    }
  }
  std::vector<int> server_group(config.num_servers(), -1);
  for (size_t g = 0; g < config.server_profiles.size(); ++g) {
    const std::string path = IndexPath("server_profiles", g);
    const ServerProfileConfig& p = config.server_profiles[g];
    CONFIG_RETURN_IF_ERROR(ValidateProfileRanks("server_profiles", g, p.ranks,
                                                "server", config.num_servers(),
                                                server_group));
    if (!(p.speed > 0 && p.speed <= 1)) {
      return Invalid(path, ".speed: must be in (0, 1], got ", p.speed);
    }
    CONFIG_RETURN_IF_ERROR(ValidateSlowdowns(path, p.slowdowns));
  }
  return absl::OkStatus();
}

absl::Status ValidateSharding(const JobConfig& config) {
  const ShardingConfig& c = config.sharding;
  if (!(c.trigger >= 1 && std::isfinite(c.trigger))) {
    return Invalid("sharding.trigger: must be >= 1, got ", c.trigger);
  }
  if (!(c.target >= 1 && c.target <= c.trigger)) {
    return Invalid("sharding.target: must be in [1, trigger (", c.trigger,
                   ")], got ", c.target);
  }
  CONFIG_RETURN_IF_ERROR(CheckNonNegative("sharding.min_gain", c.min_gain));
  return CheckPositive("sharding.max_moved_mb", c.max_moved_mb);
}

absl::Status ValidateTables(const std::vector<TableConfig>& tables) {
  for (size_t i = 0; i < tables.size(); ++i) {
    const std::string path = IndexPath("tables", i);
    const TableConfig& table = tables[i];
    if (table.name.empty()) return Invalid(path, ".name: must not be empty");
    for (size_t j = 0; j < i; ++j) {
      if (tables[j].name == table.name) {
        return Invalid(path, ".name: duplicate table name '", table.name,
                       "' (also tables[", j, "])");
      }
    }
    CONFIG_RETURN_IF_ERROR(
        CheckAtLeast<uint64_t>(JoinPath(path, "dim"), table.dim, 1));
    CONFIG_RETURN_IF_ERROR(
        ValidateOptimizer(JoinPath(path, "optimizer"), table.optimizer));
    CONFIG_RETURN_IF_ERROR(ValidateInit(JoinPath(path, "init"), table.init));
  }
  return absl::OkStatus();
}

absl::Status ValidateCheckpoint(const CheckpointConfig& c) {
  CONFIG_RETURN_IF_ERROR(CheckAtLeast("checkpoint.keep", c.keep, 1));
  CONFIG_RETURN_IF_ERROR(
      CheckAtLeast("checkpoint.max_server_restarts", c.max_server_restarts, 0));
  if (c.dir.empty() && (c.every_rounds > 0 || c.resume)) {
    return Invalid("checkpoint.dir: must be set for ",
                   c.resume ? "checkpoint.resume" : "checkpoint.every_rounds");
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status ValidateJobConfig(JobConfig& config) {
  if (config.name.empty()) return Invalid("name: must not be empty");
  CONFIG_RETURN_IF_ERROR(ValidateCluster(config.cluster));
  CONFIG_RETURN_IF_ERROR(CheckAtLeast("window", config.window, 0));
  CONFIG_RETURN_IF_ERROR(ValidateServer(config.server, config.num_servers()));
  CONFIG_RETURN_IF_ERROR(ValidateClient(config.client, config.server));
  CONFIG_RETURN_IF_ERROR(ValidateHotRows(config.client.hot_rows, config.mode));
  CONFIG_RETURN_IF_ERROR(ValidateTrain(config.train));
  CONFIG_RETURN_IF_ERROR(ValidateAuth(config.auth));
  CONFIG_RETURN_IF_ERROR(ValidateMetrics(config.metrics, config.num_servers()));
  CONFIG_RETURN_IF_ERROR(ValidateHeterogeneity(config));
  CONFIG_RETURN_IF_ERROR(ValidateSharding(config));
  CONFIG_RETURN_IF_ERROR(CheckAtLeast("cluster.max_worker_failures",
                                      config.cluster.max_worker_failures, 0));
  CONFIG_RETURN_IF_ERROR(CheckAtLeast("cluster.max_worker_restarts",
                                      config.cluster.max_worker_restarts, 0));
  CONFIG_RETURN_IF_ERROR(
      CheckOneOf("log_level", "level", config.log_level, kLogLevels));
  CONFIG_RETURN_IF_ERROR(ValidateCheckpoint(config.checkpoint));
  if (!config.worker.command.empty() && config.worker.command[0].empty()) {
    return Invalid("worker.command: the program (first element) is empty");
  }

  return ValidateTables(config.tables);
}

absl::Status ValidateEndpoint(const std::string& endpoint) {
  absl::string_view host;
  absl::string_view port;
  if (!endpoint.empty() && endpoint.front() == '[') {
    // "[v6-address]:port"
    const size_t close = endpoint.find("]:");
    if (close == std::string::npos) {
      return Invalid("'", endpoint, "' is not host:port");
    }
    host = absl::string_view(endpoint).substr(1, close - 1);
    port = absl::string_view(endpoint).substr(close + 2);
  } else {
    const size_t colon = endpoint.rfind(':');
    if (colon == std::string::npos) {
      return Invalid("'", endpoint, "' is not host:port");
    }
    host = absl::string_view(endpoint).substr(0, colon);
    port = absl::string_view(endpoint).substr(colon + 1);
    if (host.find(':') != host.npos) {
      return Invalid(
          "'", endpoint,
          "' is not host:port (write IPv6 addresses as [addr]:port)");
    }
  }
  if (host.empty()) {
    return Invalid("'", endpoint, "' is not host:port (empty host)");
  }
  for (char c : host) {
    if (absl::ascii_isspace(static_cast<unsigned char>(c))) {
      return Invalid("'", endpoint, "' is not host:port (space in host)");
    }
  }
  int port_number = 0;
  const bool digits_only =
      !port.empty() && port.find_first_not_of("0123456789") == port.npos;
  if (!digits_only || !absl::SimpleAtoi(port, &port_number) ||
      port_number < 1 || port_number > 65535) {
    return Invalid("'", endpoint, "' is not host:port (port must be 1..65535)");
  }
  return absl::OkStatus();
}

}  // namespace hetps
