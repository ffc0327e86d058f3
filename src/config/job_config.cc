// Parsing, overriding and validating JobConfig (include/hetps/config.h).
//
// The YAML layout is the struct layout, so each struct lists its fields once
// (its Fields() below) and one generic decoder walks those lists. Overrides
// ("train.epochs=3") become a one-path YAML document decoded by the same
// decoder onto the existing config, so the file and the command line can
// never disagree about names or types. Adding a field is one line.

#include <array>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <set>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "common/file.h"
#include "hetps/config.h"
#include "yaml-cpp/yaml.h"

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
constexpr absl::string_view kDataFormats[] = {"synthetic", "movielens",
                                              "criteo", "libsvm", "libfm"};
constexpr absl::string_view kLogLevels[] = {"trace", "debug", "info", "warn",
                                            "error"};

template <typename... Args>
absl::Status Invalid(const Args&... args) {
  return absl::InvalidArgumentError(absl::StrCat(args...));
}

// ---------------------------------------------------------------------------
// Field lists: the YAML name is the C++ name.

template <typename Visit>
void Fields(OptimizerConfig& c, Visit&& visit) {
  visit("type", c.type);
  visit("learning_rate", c.learning_rate);
  visit("initial_accumulator", c.initial_accumulator);
  visit("epsilon", c.epsilon);
  visit("beta1", c.beta1);
  visit("beta2", c.beta2);
  visit("ftrl_beta", c.ftrl_beta);
  visit("l1", c.l1);
  visit("l2", c.l2);
}

template <typename Visit>
void Fields(InitializerConfig& c, Visit&& visit) {
  visit("type", c.type);
  visit("scale", c.scale);
  visit("seed", c.seed);
}

template <typename Visit>
void Fields(TableConfig& c, Visit&& visit) {
  visit("name", c.name);
  visit("kind", c.kind);
  visit("dim", c.dim);
  visit("optimizer", c.optimizer);
  visit("init", c.init);
}

template <typename Visit>
void Fields(ClusterConfig& c, Visit&& visit) {
  visit("servers", c.servers);
  visit("workers", c.workers);
  visit("host", c.host);
  visit("ps_endpoints", c.ps_endpoints);
  visit("worker_endpoints", c.worker_endpoints);
  visit("max_worker_failures", c.max_worker_failures);
  visit("max_worker_restarts", c.max_worker_restarts);
}

template <typename Visit>
void Fields(ServerOptions& c, Visit&& visit) {
  visit("num_buckets", c.num_buckets);
  visit("max_keys_per_request", c.max_keys_per_request);
  visit("max_message_bytes", c.max_message_bytes);
  visit("sync_wait_timeout_s", c.sync_wait_timeout_s);
  visit("heartbeat_timeout_s", c.heartbeat_timeout_s);
  visit("table_stripes", c.table_stripes);
}

template <typename Visit>
void Fields(ClientOptions& c, Visit&& visit) {
  visit("connect_deadline_s", c.connect_deadline_s);
  visit("rpc_timeout_s", c.rpc_timeout_s);
  visit("initial_backoff_s", c.initial_backoff_s);
  visit("max_backoff_s", c.max_backoff_s);
  visit("heartbeat_interval_s", c.heartbeat_interval_s);
}

template <typename Visit>
void Fields(DataConfig& c, Visit&& visit) {
  visit("format", c.format);
  visit("path", c.path);
  visit("test_fraction", c.test_fraction);
  visit("split_seed", c.split_seed);
  visit("max_bad_fraction", c.max_bad_fraction);
  visit("shuffle_buffer", c.shuffle_buffer);
  visit("chunks", c.chunks);
  visit("movielens_tags", c.movielens_tags);
  visit("libfm_slots", c.libfm_slots);
  visit("train_samples", c.train_samples);
  visit("test_samples", c.test_samples);
  visit("fields", c.fields);
  visit("ids_per_field", c.ids_per_field);
  visit("seed", c.seed);
}

template <typename Visit>
void Fields(SemiAsyncConfig& c, Visit&& visit) {
  visit("window_min", c.window_min);
  visit("window_max", c.window_max);
  visit("flush_after_s", c.flush_after_s);
  visit("adapt_window", c.adapt_window);
  visit("adapt_every_s", c.adapt_every_s);
  visit("staleness_decay", c.staleness_decay);
  visit("lookahead", c.lookahead);
  visit("min_apply_fraction", c.min_apply_fraction);
}

template <typename Visit>
void Fields(SlowdownConfig& c, Visit&& visit) {
  visit("from_s", c.from_s);
  visit("to_s", c.to_s);
  visit("factor", c.factor);
}

template <typename Visit>
void Fields(DeviceProfileConfig& c, Visit&& visit) {
  visit("ranks", c.ranks);
  visit("throughput", c.throughput);
  visit("memory_mb", c.memory_mb);
  visit("bandwidth_mbps", c.bandwidth_mbps);
  visit("batch_size", c.batch_size);
  visit("push_freq", c.push_freq);
  visit("slowdowns", c.slowdowns);
}

template <typename Visit>
void Fields(CompressConfig& c, Visit&& visit) {
  visit("codec", c.codec);
  visit("keep_fraction", c.keep_fraction);
  visit("int8_block", c.int8_block);
  visit("error_feedback", c.error_feedback);
  visit("max_transfer_fraction", c.max_transfer_fraction);
  visit("reference_summary", c.reference_summary);
  visit("overcompression_ratio", c.overcompression_ratio);
}

template <typename Visit>
void Fields(PlannerConfig& c, Visit&& visit) {
  visit("batch_plan", c.batch_plan);
  visit("replan_threshold", c.replan_threshold);
}

template <typename Visit>
void Fields(TrainConfig& c, Visit&& visit) {
  visit("model", c.model);
  visit("epochs", c.epochs);
  visit("batch_size", c.batch_size);
  visit("embedding_dim", c.embedding_dim);
  visit("hidden", c.hidden);
  visit("optimizer", c.optimizer);
  visit("dense_optimizer", c.dense_optimizer);
  visit("init", c.init);
  visit("data", c.data);
  visit("eval_every_epochs", c.eval_every_epochs);
  visit("eval_every_s", c.eval_every_s);
}

template <typename Visit>
void Fields(CheckpointConfig& c, Visit&& visit) {
  visit("dir", c.dir);
  visit("every_rounds", c.every_rounds);
  visit("keep", c.keep);
  visit("resume", c.resume);
  visit("max_server_restarts", c.max_server_restarts);
}

template <typename Visit>
void Fields(AuthConfig& c, Visit&& visit) {
  visit("token_file", c.token_file);
  visit("token_env", c.token_env);
  visit("tls_ca", c.tls_ca);
  visit("tls_cert", c.tls_cert);
  visit("tls_key", c.tls_key);
  visit("require_client_cert", c.require_client_cert);
  visit("tls_client_cert", c.tls_client_cert);
  visit("tls_client_key", c.tls_client_key);
}

template <typename Visit>
void Fields(JobConfig& c, Visit&& visit) {
  visit("name", c.name);
  visit("cluster", c.cluster);
  visit("mode", c.mode);
  visit("window", c.window);
  visit("semi_async", c.semi_async);
  visit("planner", c.planner);
  visit("device_profiles", c.device_profiles);
  visit("compress", c.compress);
  visit("tables", c.tables);
  visit("server", c.server);
  visit("client", c.client);
  visit("train", c.train);
  visit("checkpoint", c.checkpoint);
  visit("auth", c.auth);
  visit("log_level", c.log_level);
}

template <typename T>
concept ConfigStruct = requires(T& t) {
  Fields(t, [](absl::string_view, auto&) {});
};

// ---------------------------------------------------------------------------
// Decoding a YAML node into a field.

struct DecodeContext {
  // Names the input in errors that no single field explains ("config").
  std::string source;
  // Command-line overrides may write a list as "a,b" and address one list
  // element by index ("tables[1].dim=4"); a YAML file may not.
  bool from_command_line = false;
};

// Every overload is declared before any is defined so that the recursive
// calls inside the templates see all of them (ADL does not reach into this
// unnamed namespace).
absl::Status Decode(const YAML::Node& node, const std::string& path,
                    const DecodeContext& ctx, std::string& out);
absl::Status Decode(const YAML::Node& node, const std::string& path,
                    const DecodeContext& ctx, bool& out);
template <typename Int>
requires(std::is_integral_v<Int> && !std::is_same_v<Int, bool>) absl::Status
    Decode(const YAML::Node& node, const std::string& path,
           const DecodeContext& ctx, Int& out);
template <typename Float>
requires std::is_floating_point_v<Float> absl::Status Decode(
    const YAML::Node& node, const std::string& path, const DecodeContext& ctx,
    Float& out);
absl::Status Decode(const YAML::Node& node, const std::string& path,
                    const DecodeContext& ctx, ConsistencyMode& out);
absl::Status Decode(const YAML::Node& node, const std::string& path,
                    const DecodeContext& ctx, TableKind& out);
template <typename T>
absl::Status Decode(const YAML::Node& node, const std::string& path,
                    const DecodeContext& ctx, std::vector<T>& out);
template <ConfigStruct T>
absl::Status Decode(const YAML::Node& node, const std::string& path,
                    const DecodeContext& ctx, T& out);

std::string Describe(const YAML::Node& node) {
  switch (node.Type()) {
    case YAML::NodeType::Scalar:
      return absl::StrCat("'", node.Scalar(), "'");
    case YAML::NodeType::Sequence:
      return "a list";
    case YAML::NodeType::Map:
      return "a map";
    case YAML::NodeType::Null:
      return "nothing";
    case YAML::NodeType::Undefined:
      break;
  }
  return "an undefined value";
}

absl::Status TypeError(const std::string& path, absl::string_view expected,
                       const YAML::Node& node) {
  return Invalid(path, ": expected ", expected, ", got ", Describe(node));
}

// "train" + "epochs" -> "train.epochs"; list indices attach without a dot.
std::string JoinPath(const std::string& path, absl::string_view key) {
  if (path.empty()) return std::string(key);
  if (!key.empty() && key.front() == '[') return absl::StrCat(path, key);
  return absl::StrCat(path, ".", key);
}

std::string IndexPath(const std::string& path, size_t index) {
  return absl::StrCat(path, "[", index, "]");
}

std::vector<std::string> SplitCommaList(absl::string_view text) {
  std::vector<std::string> items;
  for (absl::string_view item :
       absl::StrSplit(text, ',', absl::SkipWhitespace())) {
    items.emplace_back(absl::StripAsciiWhitespace(item));
  }
  return items;
}

absl::Status Decode(const YAML::Node& node, const std::string& path,
                    const DecodeContext&, std::string& out) {
  if (!node.IsScalar()) return TypeError(path, "a string", node);
  out = node.Scalar();
  return absl::OkStatus();
}

absl::Status Decode(const YAML::Node& node, const std::string& path,
                    const DecodeContext&, bool& out) {
  if (node.IsScalar() &&
      (node.Scalar() == "true" || node.Scalar() == "false")) {
    out = node.Scalar() == "true";
    return absl::OkStatus();
  }
  return TypeError(path, "true or false", node);
}

template <typename Int>
requires(std::is_integral_v<Int> && !std::is_same_v<Int, bool>) absl::Status
    Decode(const YAML::Node& node, const std::string& path,
           const DecodeContext&, Int& out) {
  constexpr absl::string_view kExpected =
      std::is_signed_v<Int> ? "an integer" : "a non-negative integer";
  if (!node.IsScalar()) return TypeError(path, kExpected, node);
  Int value{};
  if (absl::SimpleAtoi(node.Scalar(), &value)) {
    out = value;
    return absl::OkStatus();
  }
  // Tell "not a number" apart from "a number that does not fit".
  absl::string_view digits = absl::StripAsciiWhitespace(node.Scalar());
  const bool negative = !digits.empty() && digits.front() == '-';
  if (!digits.empty() && (digits.front() == '-' || digits.front() == '+')) {
    digits.remove_prefix(1);
  }
  const bool all_digits =
      !digits.empty() &&
      digits.find_first_not_of("0123456789") == absl::string_view::npos;
  if (!all_digits || (negative && !std::is_signed_v<Int>)) {
    return TypeError(path, kExpected, node);
  }
  return Invalid(path, ": ", node.Scalar(), " is out of range (",
                 std::numeric_limits<Int>::min(), "..",
                 std::numeric_limits<Int>::max(), ")");
}

template <typename Float>
requires std::is_floating_point_v<Float> absl::Status Decode(
    const YAML::Node& node, const std::string& path, const DecodeContext&,
    Float& out) {
  if (!node.IsScalar()) return TypeError(path, "a number", node);
  bool ok = false;
  Float value{};
  if constexpr (std::is_same_v<Float, float>) {
    ok = absl::SimpleAtof(node.Scalar(), &value);
  } else {
    double wide = 0;
    ok = absl::SimpleAtod(node.Scalar(), &wide);
    value = static_cast<Float>(wide);
  }
  if (!ok) return TypeError(path, "a number", node);
  out = value;
  return absl::OkStatus();
}

absl::StatusOr<ConsistencyMode> ParseMode(absl::string_view name,
                                          absl::string_view path) {
  for (ConsistencyMode mode : {ConsistencyMode::kSync, ConsistencyMode::kAsync,
                               ConsistencyMode::kSemiAsync}) {
    if (name == ConsistencyModeName(mode)) return mode;
  }
  return Invalid(path, ": unknown mode '", name,
                 "' (expected sync, async, semi_async)");
}

absl::Status Decode(const YAML::Node& node, const std::string& path,
                    const DecodeContext&, ConsistencyMode& out) {
  if (!node.IsScalar()) return TypeError(path, "a mode", node);
  absl::StatusOr<ConsistencyMode> mode = ParseMode(node.Scalar(), path);
  if (!mode.ok()) return mode.status();
  out = *mode;
  return absl::OkStatus();
}

absl::Status Decode(const YAML::Node& node, const std::string& path,
                    const DecodeContext&, TableKind& out) {
  if (!node.IsScalar()) return TypeError(path, "a table kind", node);
  if (node.Scalar() == "sparse") {
    out = TableKind::kSparse;
  } else if (node.Scalar() == "dense") {
    out = TableKind::kDense;
  } else {
    return Invalid(path, ": unknown kind '", node.Scalar(),
                   "' (expected sparse, dense)");
  }
  return absl::OkStatus();
}

// Overlays elements addressed by index ({"[1]": ...}) onto existing ones;
// only overrides produce such maps.
template <typename T>
absl::Status DecodeElements(const YAML::Node& node, const std::string& path,
                            const DecodeContext& ctx, std::vector<T>& out) {
  for (auto it = node.begin(); it != node.end(); ++it) {
    absl::string_view key = it->first.Scalar();
    size_t index = 0;
    if (key.size() < 3 || key.front() != '[' || key.back() != ']' ||
        !absl::SimpleAtoi(key.substr(1, key.size() - 2), &index)) {
      return TypeError(path, "a list", node);
    }
    if (index >= out.size()) {
      return Invalid(IndexPath(path, index), ": no such entry (", path, " has ",
                     out.size(), ")");
    }
    absl::Status status =
        Decode(it->second, IndexPath(path, index), ctx, out[index]);
    if (!status.ok()) return status;
  }
  return absl::OkStatus();
}

template <typename T>
absl::Status Decode(const YAML::Node& node, const std::string& path,
                    const DecodeContext& ctx, std::vector<T>& out) {
  if (node.IsNull()) {  // "ps_endpoints:" with nothing means none
    out.clear();
    return absl::OkStatus();
  }
  if (ctx.from_command_line) {
    if constexpr (std::is_same_v<T, std::string>) {
      if (node.IsScalar()) {
        out = SplitCommaList(node.Scalar());
        return absl::OkStatus();
      }
    }
    if (node.IsMap()) return DecodeElements(node, path, ctx, out);
  }
  if (!node.IsSequence()) return TypeError(path, "a list", node);
  // A list replaces the old one whole; elements start from their defaults.
  std::vector<T> items;
  items.reserve(node.size());
  for (auto it = node.begin(); it != node.end(); ++it) {
    items.emplace_back();
    absl::Status status =
        Decode(*it, IndexPath(path, items.size() - 1), ctx, items.back());
    if (!status.ok()) return status;
  }
  out = std::move(items);
  return absl::OkStatus();
}

// Decodes the fields present in `node` onto `out`; absent fields keep their
// current values, which is what makes overrides work.
template <ConfigStruct T>
absl::Status Decode(const YAML::Node& node, const std::string& path,
                    const DecodeContext& ctx, T& out) {
  const std::string& where = path.empty() ? ctx.source : path;
  if (node.IsNull()) return absl::OkStatus();  // "server:" keeps defaults
  if (!node.IsMap()) return TypeError(where, "a map", node);
  std::set<std::string, std::less<>> seen;
  for (auto it = node.begin(); it != node.end(); ++it) {
    if (!it->first.IsScalar()) {
      return Invalid(where, ": field names must be plain words, got ",
                     Describe(it->first));
    }
    const std::string& key = it->first.Scalar();
    const std::string field_path = JoinPath(path, key);
    // yaml-cpp keeps both copies of a repeated key and lookups see only the
    // first, so a repeat would silently lose a value.
    if (!seen.insert(key).second) {
      return Invalid(ctx.source, ": field '", field_path, "' is given twice");
    }
    bool known = false;
    absl::Status status;
    Fields(out, [&](absl::string_view name, auto& field) {
      if (known || name != key) return;
      known = true;
      status = Decode(it->second, field_path, ctx, field);
    });
    if (!known) {
      return Invalid(ctx.source, ": unknown field '", field_path, "'");
    }
    if (!status.ok()) return status;
  }
  return absl::OkStatus();
}

absl::Status DecodeJob(const YAML::Node& root, const DecodeContext& ctx,
                       JobConfig& config) {
  // yaml-cpp reports misuse by exceptions; keep them inside this file.
  try {
    return Decode(root, "", ctx, config);
  } catch (const YAML::Exception& e) {
    return Invalid(ctx.source, ": ", e.what());
  }
}

absl::Status YamlSyntaxError(absl::string_view source,
                             const YAML::Exception& e) {
  if (e.mark.is_null()) return Invalid(source, ": YAML error: ", e.msg);
  return Invalid(source, ": YAML error at line ", e.mark.line + 1, ", column ",
                 e.mark.column + 1, ": ", e.msg);
}

absl::StatusOr<JobConfig> ParseYaml(const std::string& text,
                                    absl::string_view source) {
  YAML::Node root;
  try {
    root = YAML::Load(text);
  } catch (const YAML::Exception& e) {
    return YamlSyntaxError(source, e);
  }
  JobConfig config;
  absl::Status status =
      DecodeJob(root, DecodeContext{std::string(source), false}, config);
  if (!status.ok()) return status;
  return config;
}

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
#define CONFIG_RETURN_IF_ERROR(expr)               \
  do {                                             \
    absl::Status hetps_status_ = (expr);           \
    if (!hetps_status_.ok()) return hetps_status_; \
  } while (false)

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
      CheckAtLeast("train.data.chunks", train.data.chunks, 0));
  CONFIG_RETURN_IF_ERROR(
      CheckOneOf("train.model", "model", train.model, kModels));
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
    if (p.ranks.empty()) return Invalid(path, ".ranks: must list workers");
    for (int r : p.ranks) {
      if (r < 0 || r >= config.num_workers()) {
        return Invalid(path, ".ranks: worker ", r,
                       " out of range (the job has ", config.num_workers(),
                       " workers)");
      }
      if (group_of[r] >= 0) {
        return Invalid(path, ".ranks: worker ", r,
                       " is also in device_profiles[", group_of[r], "]");
      }
      group_of[r] = static_cast<int>(g);
    }
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
    for (size_t i = 0; i < p.slowdowns.size(); ++i) {
      const std::string sp = IndexPath(JoinPath(path, "slowdowns"), i);
      const SlowdownConfig& d = p.slowdowns[i];
      CONFIG_RETURN_IF_ERROR(
          CheckNonNegative(JoinPath(sp, "from_s"), d.from_s));
      if (!(d.to_s > d.from_s)) {
        return Invalid(sp, ".to_s: must be > from_s (", d.from_s, "), got ",
                       d.to_s);
      }
      if (!(d.factor > 0 && d.factor <= 1)) {
        return Invalid(sp, ".factor: must be in (0, 1], got ", d.factor);
      }
      if (p.throughput == 0) {
        return Invalid(sp, ": a slow-down needs ", path,
                       ".throughput (the speed it slows down from)");
      }
    }
  }
  return absl::OkStatus();
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

// ---------------------------------------------------------------------------
// Public API.

const char* ConsistencyModeName(ConsistencyMode mode) {
  switch (mode) {
    case ConsistencyMode::kSync:
      return "sync";
    case ConsistencyMode::kAsync:
      return "async";
    case ConsistencyMode::kSemiAsync:
      return "semi_async";
  }
  return "unknown";
}

absl::StatusOr<ConsistencyMode> ParseConsistencyMode(const std::string& name) {
  return ParseMode(name, "mode");
}

int JobConfig::num_servers() const {
  return cluster.ps_endpoints.empty()
             ? cluster.servers
             : static_cast<int>(cluster.ps_endpoints.size());
}

int JobConfig::num_workers() const {
  return cluster.worker_endpoints.empty()
             ? cluster.workers
             : static_cast<int>(cluster.worker_endpoints.size());
}

const DeviceProfileConfig* JobConfig::ProfileOf(uint32_t rank) const {
  for (const DeviceProfileConfig& p : device_profiles) {
    for (int r : p.ranks) {
      if (static_cast<uint32_t>(r) == rank) return &p;
    }
  }
  return nullptr;
}

bool JobConfig::ProportionalBatches() const {
  if (planner.batch_plan == "auto") return mode == ConsistencyMode::kSemiAsync;
  return planner.batch_plan == "proportional";
}

absl::Status ValidateJobConfig(JobConfig& config) {
  if (config.name.empty()) return Invalid("name: must not be empty");
  CONFIG_RETURN_IF_ERROR(ValidateCluster(config.cluster));
  CONFIG_RETURN_IF_ERROR(CheckAtLeast("window", config.window, 0));
  CONFIG_RETURN_IF_ERROR(ValidateServer(config.server, config.num_servers()));
  CONFIG_RETURN_IF_ERROR(ValidateClient(config.client, config.server));
  CONFIG_RETURN_IF_ERROR(ValidateTrain(config.train));
  CONFIG_RETURN_IF_ERROR(ValidateAuth(config.auth));
  CONFIG_RETURN_IF_ERROR(ValidateHeterogeneity(config));
  CONFIG_RETURN_IF_ERROR(CheckAtLeast("cluster.max_worker_failures",
                                      config.cluster.max_worker_failures, 0));
  CONFIG_RETURN_IF_ERROR(CheckAtLeast("cluster.max_worker_restarts",
                                      config.cluster.max_worker_restarts, 0));
  CONFIG_RETURN_IF_ERROR(
      CheckOneOf("log_level", "level", config.log_level, kLogLevels));
  CONFIG_RETURN_IF_ERROR(ValidateCheckpoint(config.checkpoint));

  return ValidateTables(config.tables);
}

absl::StatusOr<JobConfig> ParseJobConfigYaml(const std::string& yaml_text) {
  return ParseYaml(yaml_text, "config");
}

absl::StatusOr<JobConfig> LoadJobConfigFile(const std::string& path) {
  absl::StatusOr<std::string> text = ReadFile(path);
  if (!text.ok()) {
    return absl::NotFoundError(
        absl::StrCat("config file: ", text.status().message()));
  }
  return ParseYaml(*text, path);
}

absl::Status ApplyOverride(JobConfig& config, const std::string& assignment) {
  const std::string source = absl::StrCat("override '", assignment, "'");
  const size_t eq = assignment.find('=');
  if (eq == std::string::npos) {
    return Invalid(source, ": expected path=value");
  }
  const absl::string_view path =
      absl::StripAsciiWhitespace(absl::string_view(assignment).substr(0, eq));
  const std::string value(
      absl::StripAsciiWhitespace(absl::string_view(assignment).substr(eq + 1)));
  if (path.empty()) return Invalid(source, ": empty field path");

  // The value: a flow list or map ("[a, b]", "{dim: 4}") is YAML; anything
  // else is one scalar, decoded by the field's own type.
  YAML::Node node;
  if (!value.empty() && (value.front() == '[' || value.front() == '{')) {
    try {
      node = YAML::Load(value);
    } catch (const YAML::Exception& e) {
      return YamlSyntaxError(source, e);
    }
  } else {
    node = YAML::Node(value);
  }

  // Wrap the value in one map per path component, innermost first, so that
  // "tables[1].dim" becomes {tables: {"[1]": {dim: value}}}.
  std::vector<std::string> keys;
  for (absl::string_view part : absl::StrSplit(path, '.')) {
    absl::string_view name = part;
    absl::string_view index;
    if (const size_t bracket = part.find('['); bracket != part.npos) {
      name = part.substr(0, bracket);
      index = part.substr(bracket);
    }
    if (name.empty() || name.find(']') != name.npos) {
      return Invalid(source, ": malformed field path '", path, "'");
    }
    keys.emplace_back(name);
    if (!index.empty()) keys.emplace_back(index);
  }
  for (auto key = keys.rbegin(); key != keys.rend(); ++key) {
    YAML::Node parent(YAML::NodeType::Map);
    parent[*key] = node;
    node = parent;
  }

  // Decode onto a copy so a failed override leaves `config` untouched.
  JobConfig updated = config;
  CONFIG_RETURN_IF_ERROR(DecodeJob(
      node, DecodeContext{source, /*from_command_line=*/true}, updated));
  config = std::move(updated);
  return absl::OkStatus();
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

#undef CONFIG_RETURN_IF_ERROR

}  // namespace hetps
