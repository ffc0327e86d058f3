// JobConfig: everything one hetps job needs, parsed once from YAML, flags and
// the Paddle-style environment variables by the CLI, validated once, and then
// passed down by const reference. Nothing below the CLI reads the environment.
//
// Every field has its default and its meaning here; the YAML names are the
// field names below, nested as in the structs (`semi_async.window_max`,
// `device_profiles[0].throughput`).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace hetps {

enum class ConsistencyMode { kSync, kAsync, kSemiAsync };

const char* ConsistencyModeName(ConsistencyMode mode);
absl::StatusOr<ConsistencyMode> ParseConsistencyMode(const std::string& name);

// Server-side update rule of a table. Fields not used by `type` are ignored.
struct OptimizerConfig {
  std::string type = "adagrad";  // sgd | adagrad | adam | ftrl
  float learning_rate = 0.05f;
  // adagrad: accumulator starts here; epsilon keeps the division finite.
  float initial_accumulator = 0.0f;
  float epsilon = 1e-8f;
  // adam
  float beta1 = 0.9f;
  float beta2 = 0.999f;
  // ftrl (FTRL-proximal; learning_rate is alpha)
  float ftrl_beta = 1.0f;
  float l1 = 0.0f;
  float l2 = 0.0f;
};

// How rows (sparse) or the array (dense) start. Values depend only on
// (seed, key, column), never on arrival order or placement.
struct InitializerConfig {
  std::string type = "uniform";  // zero | uniform | normal
  float scale = 0.01f;           // uniform: [-scale, scale]; normal: stddev
  uint64_t seed = 2026;
};

enum class TableKind { kSparse, kDense };

struct TableConfig {
  std::string name;
  TableKind kind = TableKind::kSparse;
  // Sparse: floats per row. Dense: total floats (split across servers).
  uint64_t dim = 1;
  OptimizerConfig optimizer;
  InitializerConfig init;
};

// The coordinator's port where a launcher picks the rendezvous host itself.
inline constexpr int kDefaultRendezvousPort = 7100;

struct ClusterConfig {
  // Local launch: how many processes of each role to start on `host`.
  int servers = 2;
  int workers = 3;
  std::string host = "127.0.0.1";
  // Multi-host runs: explicit endpoints ("host:port"). When set they win over
  // the counts. ps_endpoints[0] hosts the coordinator.
  std::vector<std::string> ps_endpoints;
  std::vector<std::string> worker_endpoints;
  // Multi-host runs without endpoint lists: server 0's "host:port", where
  // the coordinator listens (like torchrun's master address). The other
  // servers listen on a free port of the address that reaches it and
  // register there; workers ask it for the server list. Start order does
  // not matter. Unused when ps_endpoints is given. `hetps run` under Slurm
  // defaults it to the job's first node, port kDefaultRendezvousPort.
  std::string rendezvous;
  // launch: how many workers may die (non-zero exit, killed) before the job
  // is stopped. The coordinator drops a dead worker from the live set after
  // server.heartbeat_timeout_s; rank 0 (it evaluates) must survive.
  int max_worker_failures = 0;
  // launch: how many times a worker that dies is started again; the new
  // process registers again, rejoins the live set and continues where the
  // job is (docs/CHECKPOINTS.md). Restarts come before failures.
  int max_worker_restarts = 0;
};

// One slow-down of an emulated device: from from_s to to_s seconds after
// the worker starts training it runs at `factor` of its throughput.
struct SlowdownConfig {
  double from_s = 0;
  double to_s = 0;
  double factor = 1;
};

// The factor of `slowdowns` in force `t` seconds after the start: the
// smallest of those whose [from_s, to_s) holds t, 1 when none does. One
// rule for a worker's DeviceProfile and a server's ServerPace.
inline double SlowdownFactorAt(const std::vector<SlowdownConfig>& slowdowns,
                               double t) {
  double factor = 1;
  for (const SlowdownConfig& d : slowdowns) {
    if (t >= d.from_s && t < d.to_s && d.factor < factor) factor = d.factor;
  }
  return factor;
}

// An emulated server machine for the servers in `ranks`: its table work
// takes 1 / speed as long on the CPU (time a handler spends off the CPU is
// not stretched), the extra time on one serial timeline per server, so its
// capacity shrinks, not only its latency (server/server_pace.h). Lets
// one computer reproduce a cluster whose servers differ; always labelled as
// emulation. Slow-downs (from_s, to_s: seconds after the server starts)
// multiply the speed by their factor, like a worker's.
struct ServerProfileConfig {
  std::vector<int> ranks;
  double speed = 1;  // (0, 1]: a fraction of this machine's speed
  std::vector<SlowdownConfig> slowdowns;
};

// Placement of sparse rows by measured load (SPEC §4; src/shard/
// rebalancer.h). Every control period (semi_async.adapt_every_s) the
// coordinator plans which buckets to move so that the servers' service time
// evens out, and shows the plan in status: nothing moves while max/mean is
// at or below `trigger`; a plan stops at `target`, at `max_moved_mb` of
// rows, or when no move lowers the largest load; a plan that lowers
// max/mean by less than `min_gain` moves nothing; a bucket that moved
// stays for `hold_periods` periods. With `migrate` the coordinator carries
// each plan out by live migration (shard/bucket_mover.h) while the workers
// train; without it the plan is advice (docs/ARCHITECTURE.md, "Placement
// by load"). Off by default: measured in docs/BENCHMARKS.md §12 (1.66x
// the steps/s of static hash with one of 4 servers at half speed where the
// servers limit the job, and in the hetero job with slow servers the target
// AUC as soon or sooner, 1.5x sooner on generated Criteo; the p99 of the
// pulls that overlap a move is 1.5-1.75x the steady one at the median of
// runs, under 2x in 22 of 24). With checkpoint.dir,
// saves and whole-job resumes keep moved buckets exactly, and a server
// restarted mid-move rejoins it (docs/CHECKPOINTS.md, "Bucket moves").
struct ShardingConfig {
  bool migrate = false;
  double trigger = 1.10;
  double target = 1.05;
  double min_gain = 0.02;
  double max_moved_mb = 256;
  uint32_t hold_periods = 3;
};

struct ServerOptions {
  uint32_t num_buckets = 4096;               // ShardMap buckets
  uint64_t max_keys_per_request = 1u << 24;  // larger → RESOURCE_EXHAUSTED
  uint64_t max_message_bytes = 512ull << 20;
  double sync_wait_timeout_s = 300;  // a pull waiting on a round gives up
  double heartbeat_timeout_s = 10;   // a worker silent this long leaves
  int table_stripes = 64;            // lock stripes per sparse table
};

// A worker's hot-row cache (SPEC §4; src/client/hot_row_cache.h): rows
// in at least `hot_share` of the worker's recent pulls are kept, and read
// from the cache instead of the server while their version lags the
// server's by at most the servers' bound — `max_lag` applies; 0: one
// window (semi_async) or one push of every worker (async) — and by at most
// the row's own bound, from `sample_drift`. The servers enforce and record
// theirs (AggregatorStats.read_lag_*). Sync reads exact rows: no cache
// there. Off by default (`enabled`): on loopback it costs 1.5-2.5% of
// samples/s (the client's bookkeeping) and pays where links are narrower
// than the servers are slow. The other defaults are one setting for every
// data set: on the hetero reference cluster (semi_async), 9 runs a cell,
// they cut pulled bytes by 53-59% on MovieLens and on generated Criteo
// data with Zipf ids, DeepFM and FM, at median and mean AUCs within
// 0.0004 of the runs without the cache (docs/BENCHMARKS.md §10).
struct HotRowsConfig {
  bool enabled = false;
  double hot_share = 0.002;
  uint64_t max_lag = 0;
  uint64_t max_rows = 1 << 20;  // rows kept, per table
  // Each row's own bound. A kept row drifts (relative to its length) at
  // the pace it moved between the worker's last two reads of it; its
  // weight is its uses per sample in the worker's last push that carried
  // it, times that push's rows; it is read again before drift × weight
  // passes this. Were every row of a push at its bound, a sample's rows
  // would together have drifted this much: rows in every sample are read
  // fresh, rows used once or twice last longer. 0: every row has the
  // servers' bound (HotRowCache::Store, NotePush).
  double sample_drift = 4;
};

struct ClientOptions {
  double connect_deadline_s = 30;  // give up on an unreachable server
  double rpc_timeout_s = 600;      // per call (sync pulls may wait)
  double initial_backoff_s = 0.05;
  double max_backoff_s = 1.0;
  double heartbeat_interval_s = 1.0;
  HotRowsConfig hot_rows;
};

// Where samples come from and how they are split (data/reader.h).
struct DataConfig {
  // synthetic | movielens | criteo | libsvm | libfm
  std::string format = "synthetic";
  // movielens: the directory holding ratings.csv, movies.csv, tags.csv;
  // criteo, libsvm, libfm: the file.
  std::string path;
  double test_fraction = 0.1;  // records hashed into the test split
  uint64_t split_seed = 1;
  double max_bad_fraction = 0.05;  // more malformed records stop the job
  // Train samples are read in blocks of this many and handed out in a
  // seeded random order, a new one each epoch (0 = file order). Data sorted
  // by user or by time trains badly in file order. Files only: synthetic
  // samples are independent draws already.
  uint64_t shuffle_buffer = 65536;
  // The train split is cut into this many chunks that workers take from
  // the coordinator one at a time, so a fast worker trains on more of the
  // data than a slow one and nobody idles at the end of an epoch
  // (0 = 16 per worker).
  int chunks = 0;
  bool movielens_tags = false;  // movielens: tags as a fourth slot
  int libfm_slots = 0;          // libfm ("label slot:index:value"): slots
  // synthetic: an in-memory LR teacher, no file needed.
  uint64_t train_samples = 40000;
  uint64_t test_samples = 5000;
  int fields = 8;                 // categorical fields per sample
  uint64_t ids_per_field = 1000;  // distinct ids in each field
  uint64_t seed = 7;
};

// semi_async (DESIGN.md "Consistency, precisely"): the servers' gradient
// queue and the window that bounds both the queue and how far a worker may
// run ahead of the slowest live one.
struct SemiAsyncConfig {
  int window_min = 2;
  int window_max = 256;
  // A queue holding a push older than this is applied whatever its length
  // (the time bound).
  double flush_after_s = 0.5;
  // The WindowController re-reads the servers' queue statistics this often
  // and adjusts the window (false: the initial window stays).
  bool adapt_window = true;
  double adapt_every_s = 2.0;
  // A gradient computed on parameters `s` applies old takes
  // 1 / (1 + staleness_decay * s) of a full optimizer step (its share of
  // the merged gradient and the step's length; see Optimizer::Update).
  double staleness_decay = 0.5;
  // Pulls of a live worker are answered ahead of the queue: with the rows
  // the queue's apply would leave if it were applied now (the mean gradient
  // of the pushes queued so far, with the share of a step their samples
  // give it: queued samples / a full round's, at most one; a full round is
  // the last apply of one push from every worker). Without it, a worker
  // that pushed and pulls again computes on parameters that lack the queue
  // it just joined: on a balanced cluster almost every gradient is one
  // apply stale, which costs accuracy at high learning rates
  // (docs/ARCHITECTURE.md, "Why semi_async lost accuracy").
  bool lookahead = true;
  // "Every live worker contributed" applies the queue only once it holds
  // this fraction of a full round's samples (before the first full round:
  // train.batch_size × cluster.workers), so a few workers left at the end
  // of the data do not make an apply of every push. The window and the
  // time bound still apply a smaller queue; with nobody live it applies at
  // once. Any apply smaller than a full round takes that share of a step
  // (as sync's last rounds of an epoch do).
  double min_apply_fraction = 0.5;
};

// An emulated machine for the workers in `ranks` (DESIGN.md: DeviceProfile).
// Lets one computer reproduce a mixed cluster; always labelled as emulation.
struct DeviceProfileConfig {
  std::vector<int> ranks;
  double throughput = 0;      // samples/s; 0 = as fast as this machine runs
  double memory_mb = 0;       // a larger batch fails as out of memory; 0 = ∞
  double bandwidth_mbps = 0;  // pushes and pulls are throttled; 0 = ∞
  int batch_size = 0;         // fixed batch for these workers (0 = planned)
  int push_freq = 0;          // fixed push_freq (0 = planned)
  std::vector<SlowdownConfig> slowdowns;
};

// Gradient compression on the push path (src/compress/, SPEC §5).
struct CompressConfig {
  // none | fp16 | int8 | sparse | sparse+fp16 | sparse+int8 | adaptive
  std::string codec = "none";
  double keep_fraction =
      0;  // sparse kinds: share kept by magnitude (0 = non-zeros)
  uint32_t int8_block = 0;  // int8 kinds: values per scale (0 = 256)
  // Keep each lossy encode's residual and add it to the next gradient.
  bool error_feedback = true;
  // adaptive: the transfer of a push may take at most this share of the
  // batch's compute time.
  double max_transfer_fraction = 0.25;
  // Over-compression check: the summary JSON of an uncompressed reference
  // run (its loss_curve); when this run needs more than
  // overcompression_ratio × the reference's steps to reach the same loss,
  // the worker warns. Empty: no check.
  std::string reference_summary;
  double overcompression_ratio = 1.3;
};

// The BatchPlanner (coordinator): batch sizes from measured throughput.
struct PlannerConfig {
  // fixed: every worker uses train.batch_size. proportional: batch ∝
  // throughput, the sum kept at train.batch_size × workers, capped by
  // memory. auto: proportional in semi_async, fixed otherwise.
  std::string batch_plan = "auto";
  // Re-plan when a worker's throughput moved by more than this fraction
  // since the last plan.
  double replan_threshold = 0.2;
};

struct TrainConfig {
  std::string model = "lr";  // lr | fm | deepfm | none (no built-in trainer)
  int epochs = 2;
  int batch_size = 256;
  int embedding_dim = 8;                      // fm, deepfm
  std::vector<int> hidden = {400, 400, 400};  // deepfm MLP layer widths
  // The instruction-set level the models' arithmetic runs at (see
  // model/model.h, Isa): auto (the highest this CPU has: avx512, avx2 or
  // sse2) | sse2 | avx2 | avx512. Naming a level the worker's CPU lacks
  // fails the worker's start, naming what the CPU has.
  std::string isa = "auto";
  OptimizerConfig optimizer;                  // the sparse table
  OptimizerConfig dense_optimizer = {.type = "adam", .learning_rate = 0.001f};
  InitializerConfig init;  // sparse rows (dense weights: the model's own)
  // sync and semi_async: the first warmup_rounds full rounds of samples
  // (train.batch_size × workers each) take a growing share of a step: an
  // apply that brings the samples applied so far to s takes
  // min(1, s / (warmup_rounds · full round)) of it. Early adaptive steps
  // are ±learning_rate whatever the gradient, and a gradient computed one
  // apply late overshoots at half the step a fresh one tolerates
  // (docs/ARCHITECTURE.md, "Why semi_async lost accuracy"). A server that
  // resumes from a checkpoint does not warm up again. 0: off.
  int warmup_rounds = 20;
  DataConfig data;
  int eval_every_epochs = 1;  // rank 0 evaluates then and at the end
  // Also evaluate every this many seconds while training (0 = off), from a
  // separate thread of rank 0: AUC over wall time for benchmarks.
  double eval_every_s = 0;
  // Ask for the next batch's rows and dense weights while the current
  // batch computes (PullSparseRequest.ahead), so that after its push a
  // step does not wait another round trip for its parameters. sync and
  // semi_async servers answer once the step's push has arrived (and the
  // round closed / the window allows): the rows a pull sent after the push
  // reads, without that pull's round trip. async answers at once, so there
  // the rows lack the worker's own last push (one step more staleness, in
  // the mode without a bound). It reads kept rows of a hot-row cache
  // (client.hot_rows) as a pull at the next clock would. Not across a data
  // chunk's end (the next chunk is asked for then).
  bool prefetch = true;
};

// Server checkpoints (docs/CHECKPOINTS.md): each server writes its tables
// with their optimizer state (rank 0 also the job's data progress) to
// `dir`/server-<rank>/ckpt-<seq>/, atomically and with a checksum per file.
struct CheckpointConfig {
  std::string dir;  // empty: no checkpoints
  // Save after every this many applied rounds (sync: rounds; async: pushes;
  // semi_async: queue applies). 0: only when asked (`hetps save`).
  uint64_t every_rounds = 0;
  int keep = 2;  // newest checkpoints kept per server; older ones deleted
  // Servers start from the newest checkpoint that verifies (a corrupt or
  // partial one is refused, naming the file, and the one before is used).
  bool resume = false;
  // launch: how many times a server that dies (killed, crashed) is
  // restarted from its checkpoint before the job is stopped. Needs `dir`.
  int max_server_restarts = 3;
};

// Who may call the job's servers (README.md, "Authentication and TLS"). Paths
// and names only: the CLI reads them into Credentials (config/credentials.h)
// before anything connects. Every process of a job uses the same section, so
// one file serves servers, workers and `hetps status`. Relative paths in a
// config file are relative to that file.
struct AuthConfig {
  // A shared token that every call must carry (`authorization: Bearer
  // <token>`), read from this file (surrounding whitespace trimmed)...
  std::string token_file;
  // ...or from the environment variable of this name. At most one of the two;
  // neither: calls carry no token and servers ask for none.
  std::string token_env;
  // TLS: the CA that signed the servers' (and, for mutual TLS, the clients')
  // certificates, and the servers' certificate chain and private key (PEM).
  // All three or none; none: plaintext.
  std::string tls_ca;
  std::string tls_cert;
  std::string tls_key;
  // Mutual TLS: servers refuse a client without a certificate signed by
  // tls_ca; clients (workers, the coordinator, `hetps status`) present this
  // one. Needs TLS and both client files.
  bool require_client_cert = false;
  std::string tls_client_cert;
  std::string tls_client_key;
};

// The secrets AuthConfig points at, read once by the CLI
// (ResolveCredentials) and passed down with the JobConfig to
// common/channel.h, the only code that uses them. Never decoded from YAML,
// never printed. Empty strings: not configured.
struct Credentials {
  std::string token;
  std::string ca_pem;  // non-empty: TLS
  std::string cert_pem;
  std::string key_pem;
  std::string client_cert_pem;  // presented by clients when non-empty
  std::string client_key_pem;
  bool require_client_cert = false;
};

// The workers' program. Empty: the built-in trainer (`hetps worker`).
// Otherwise `hetps launch` starts this command for every worker rank, e.g.
// [python3, examples/torch/deepfm_movielens.py], passing the job through the
// environment: HETPS_CONFIG (the config file), HETPS_SET (the --set
// overrides, one per line), HETPS_RANK, and the Paddle-style variables
// (config/environment.h) with the servers' endpoints. The hetps Python
// module reads them (hetps.Worker.from_env, docs/PYTHON.md). A program not
// given as a path is looked up on PATH.
struct WorkerConfig {
  std::vector<std::string> command;
};

// Prometheus metrics and the live dashboard (docs/OPERATING.md). Every server
// serves http://address:port/metrics with its own series; server 0 (the
// coordinator) also the job's (window, workers, data) and the dashboard at
// "/". With auth.token_* set, every request must carry the token
// (`Authorization: Bearer`).
struct MetricsConfig {
  bool enabled = true;
  // Where to listen: loopback by default; "0.0.0.0" for a scraper elsewhere.
  std::string address = "127.0.0.1";
  // Server r listens on port + r; 0: a free port each, shown in the server's
  // log and `hetps status`.
  int port = 0;
};

struct JobConfig {
  std::string name = "hetps-job";
  ClusterConfig cluster;
  WorkerConfig worker;
  ConsistencyMode mode = ConsistencyMode::kSync;
  int window = 0;  // semi_async initial window; 0 = choose from throughputs
  SemiAsyncConfig semi_async;
  PlannerConfig planner;
  std::vector<DeviceProfileConfig> device_profiles;
  std::vector<ServerProfileConfig> server_profiles;
  ShardingConfig sharding;
  CompressConfig compress;
  // Tables of the job. When empty, the model's own (ResolveModelTables).
  std::vector<TableConfig> tables;
  ServerOptions server;
  ClientOptions client;
  TrainConfig train;
  CheckpointConfig checkpoint;
  AuthConfig auth;
  MetricsConfig metrics;
  std::string log_level = "info";
  // Filled from `auth` by ResolveCredentials; not a YAML field.
  Credentials credentials;

  int num_servers() const;
  int num_workers() const;
  // Where the coordinator listens: ps_endpoints[0], or cluster.rendezvous
  // while the server list is not known yet.
  const std::string& coordinator_address() const;
  // The emulated profile of worker `rank`, or nullptr (a real machine).
  const DeviceProfileConfig* ProfileOf(uint32_t rank) const;
  // The emulated profile of server `rank`, or nullptr (a real machine).
  const ServerProfileConfig* ServerProfileOf(uint32_t rank) const;
  // Whether batches follow throughput (planner.batch_plan resolved).
  bool ProportionalBatches() const;
};

// Checks every field; the error names the field ("cluster.workers: must be
// >= 1, got 0"). A built-in model's tables are filled in afterwards by
// ResolveModelTables (model/model.h).
absl::Status ValidateJobConfig(JobConfig& config);

// Parses a YAML document. Unknown fields are errors naming the field path.
absl::StatusOr<JobConfig> ParseJobConfigYaml(const std::string& yaml_text);
absl::StatusOr<JobConfig> LoadJobConfigFile(const std::string& path);

// A job's config as every front end (the CLI, the Python module) builds it:
// the YAML file at `path` (empty: all defaults), then the overrides in
// order. Relative paths (train.data.path, the auth files) become absolute:
// the file's relative to its directory, the overrides' to the working
// directory. Not validated yet.
absl::StatusOr<JobConfig> BuildJobConfig(
    const std::string& path, const std::vector<std::string>& overrides);

// Applies one "path=value" override (e.g. "train.epochs=3", "mode=async"),
// as given by the CLI's --set flag.
absl::Status ApplyOverride(JobConfig& config, const std::string& assignment);

// "host:port" with a non-empty host and a port in 1..65535.
absl::Status ValidateEndpoint(const std::string& endpoint);

}  // namespace hetps
