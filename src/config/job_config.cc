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
#include "config/config_errors.h"
#include "hetps/config.h"
#include "yaml-cpp/yaml.h"

namespace hetps {
namespace {

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
  visit("rendezvous", c.rendezvous);
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
void Fields(HotRowsConfig& c, Visit&& visit) {
  visit("enabled", c.enabled);
  visit("hot_share", c.hot_share);
  visit("max_lag", c.max_lag);
  visit("max_rows", c.max_rows);
  visit("sample_drift", c.sample_drift);
}

template <typename Visit>
void Fields(ClientOptions& c, Visit&& visit) {
  visit("connect_deadline_s", c.connect_deadline_s);
  visit("rpc_timeout_s", c.rpc_timeout_s);
  visit("initial_backoff_s", c.initial_backoff_s);
  visit("max_backoff_s", c.max_backoff_s);
  visit("heartbeat_interval_s", c.heartbeat_interval_s);
  visit("hot_rows", c.hot_rows);
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
void Fields(ServerProfileConfig& c, Visit&& visit) {
  visit("ranks", c.ranks);
  visit("speed", c.speed);
  visit("slowdowns", c.slowdowns);
}

template <typename Visit>
void Fields(ShardingConfig& c, Visit&& visit) {
  visit("migrate", c.migrate);
  visit("trigger", c.trigger);
  visit("target", c.target);
  visit("min_gain", c.min_gain);
  visit("max_moved_mb", c.max_moved_mb);
  visit("hold_periods", c.hold_periods);
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
  visit("isa", c.isa);
  visit("optimizer", c.optimizer);
  visit("dense_optimizer", c.dense_optimizer);
  visit("init", c.init);
  visit("data", c.data);
  visit("eval_every_epochs", c.eval_every_epochs);
  visit("eval_every_s", c.eval_every_s);
  visit("warmup_rounds", c.warmup_rounds);
  visit("prefetch", c.prefetch);
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
void Fields(WorkerConfig& c, Visit&& visit) {
  visit("command", c.command);
}

template <typename Visit>
void Fields(MetricsConfig& c, Visit&& visit) {
  visit("enabled", c.enabled);
  visit("address", c.address);
  visit("port", c.port);
}

template <typename Visit>
void Fields(JobConfig& c, Visit&& visit) {
  visit("name", c.name);
  visit("cluster", c.cluster);
  visit("worker", c.worker);
  visit("mode", c.mode);
  visit("window", c.window);
  visit("semi_async", c.semi_async);
  visit("planner", c.planner);
  visit("device_profiles", c.device_profiles);
  visit("server_profiles", c.server_profiles);
  visit("sharding", c.sharding);
  visit("compress", c.compress);
  visit("tables", c.tables);
  visit("server", c.server);
  visit("client", c.client);
  visit("train", c.train);
  visit("checkpoint", c.checkpoint);
  visit("auth", c.auth);
  visit("metrics", c.metrics);
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

const std::string& JobConfig::coordinator_address() const {
  return cluster.ps_endpoints.empty() ? cluster.rendezvous
                                      : cluster.ps_endpoints[0];
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

const ServerProfileConfig* JobConfig::ServerProfileOf(uint32_t rank) const {
  for (const ServerProfileConfig& p : server_profiles) {
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

}  // namespace hetps
