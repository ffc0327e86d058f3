// PsClient: a worker's connection to every parameter server of a job.
//
// It routes keys to servers through the job's ShardMap, talks to all servers
// of a request in parallel, and retries calls that fail with UNAVAILABLE
// (server not up yet, restarting, connection dropped) with exponential
// back-off until `connect_deadline_s` has passed since the failures began;
// then it fails with UNAVAILABLE naming the endpoint. Any other error is
// returned at once with the server's code and message.
//
// One PsClient stands for one worker: its pushes carry the worker id and a
// clock (pushes made so far) that the servers use for consistency and to drop
// retried duplicates. Calls from several threads are safe, but pushes are
// meant to come from one training loop.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "hetps/codec.h"
#include "hetps/config.h"

namespace hetps {

// The worker id of a client that only reads (rank 0's evaluator, a serving
// reader): not a worker of the job, so no consistency mode counts it, waits
// for it or holds it; servers refuse its pushes.
inline constexpr uint32_t kReaderId = 0xFFFFFFFFu;

struct PsClientOptions {
  std::vector<std::string> endpoints;  // server rank i at endpoints[i]
  // The job's worker rank (< cluster.workers), or kReaderId.
  uint32_t worker_id = 0;
  // The worker's registration count (RegisterResponse.incarnation); 0 for
  // a client that does not register. A restarted worker's higher one tells
  // the servers that its clocks start again at 0.
  uint32_t incarnation = 0;
  ClientOptions rpc;
  uint64_t max_message_bytes = 512ull << 20;
  Credentials credentials;  // the job's (JobConfig::credentials)
  // Sync mode needs every server to see every push (rounds close per
  // server); in async mode servers without keys in a push are skipped.
  bool push_to_all_servers = true;
  // Error feedback (compress.error_feedback): the residual of every lossy
  // encode is kept, per table row (per table and server slice for dense
  // tables), and added to the next push that carries it.
  bool error_feedback = false;
};

// How Push encodes its gradients (hetps/codec.h, docs/PROTOCOL.md) and what
// it sent. Each server's part is encoded on its own.
struct PushEncoding {
  CodecSpec spec;           // kNone: raw fp32
  uint64_t raw_bytes = 0;   // out: the gradient payloads as fp32 keys+values
  uint64_t sent_bytes = 0;  // out: as sent
  // out: the same without keys and payload headers: the gradient itself
  uint64_t raw_value_bytes = 0;
  uint64_t sent_value_bytes = 0;
};

// What a client's sparse pulls cost: rows pulled from the servers and the
// bytes of their keys and values, rows read from the hot-row cache
// (client.hot_rows) instead, cached rows pulled again because their copy
// lagged the server by more than the bound, and requests to a server asked
// again because it refused them as "moved" (a bucket moving between
// servers). Totals since Connect.
struct PullStats {
  uint64_t pulled_rows = 0;
  uint64_t pulled_bytes = 0;
  uint64_t cached_rows = 0;
  uint64_t refetched_rows = 0;
  uint64_t moved_retries = 0;
};

// Whether the caller promises that a key list has no duplicates.
enum class KeySet { kMayRepeat, kUnique };

// Where a sparse pull may read rows from: a training step may read the
// hot-row cache (client.hot_rows); an evaluation of the model reads the
// servers' rows.
enum class RowSource { kCacheAllowed, kServers };

struct TableGrad {
  std::string table;
  std::span<const uint64_t> keys;  // sparse rows; empty for a dense table
  std::span<const float> values;   // keys.size() * dim, or the dense size
  // Optional, per key: how many of the batch's feature slots used the row
  // (the hot-row cache weighs a kept row's staleness by its share).
  std::span<const uint32_t> uses = {};
};

class PsClient {
 public:
  // Connects to every server, waiting for those not up yet (see above), and
  // reads their table schemas and shard map. Fails with UNAVAILABLE naming
  // the first endpoint that stayed unreachable, or FAILED_PRECONDITION when
  // servers disagree about the shard map.
  static absl::StatusOr<std::unique_ptr<PsClient>> Connect(
      const PsClientOptions& options);
  ~PsClient();

  // Row width of a sparse table / size of a dense table; NOT_FOUND if the
  // servers have no such table.
  absl::StatusOr<uint64_t> TableDim(const std::string& table) const;

  // Fills `out` (keys.size() * dim floats) with the rows of `keys`; rows are
  // created on first touch. Duplicates are fetched once unless the caller
  // says the keys are unique (skipping the dedup pass). With `dense`, the
  // same requests also fill dense table `dense->table` into `dense->out`
  // (as PullDense would): a step's rows and dense weights in one call per
  // server instead of two in a row.
  struct DenseAlong {
    std::string table;
    std::span<float> out;
  };
  //
  // `for_push`: the clock() of the push these rows will serve (default:
  // the current one). clock() + 1 asks for the next step's rows while the
  // current one computes, before its push (train.prefetch): sync and
  // semi_async servers answer once that push has arrived (so the pushes
  // must go to every server: PsClientOptions::push_to_all_servers), as a
  // pull at the next clock; async at once. Made once the clock has reached
  // it, it is an ordinary pull. Anything else is INVALID_ARGUMENT. Kept
  // rows a pull ahead reads count for the push it serves (the servers
  // record that push's lag against that pull).
  absl::Status PullSparse(const std::string& table,
                          std::span<const uint64_t> keys, std::span<float> out,
                          KeySet key_set = KeySet::kMayRepeat,
                          RowSource source = RowSource::kCacheAllowed,
                          const DenseAlong* dense = nullptr,
                          std::optional<uint64_t> for_push = std::nullopt);

  // Fills `out` with the whole dense table (assembled from every server).
  absl::Status PullDense(const std::string& table, std::span<float> out);

  // Pushes one step's gradients (any mix of tables) computed on
  // `batch_size` samples, then advances the clock. Duplicate sparse keys are
  // summed into one row unless `key_set` says they are unique.
  // `encoding` (optional) selects a codec and receives the byte counts.
  absl::Status Push(std::span<const TableGrad> grads, uint32_t batch_size,
                    KeySet key_set = KeySet::kMayRepeat,
                    PushEncoding* encoding = nullptr);

  // Pushes made so far.
  uint64_t clock() const;

  // The worker registered again (RegisterResponse.incarnation) after the
  // coordinator had dropped it: requests carry the new incarnation from
  // now on, and the servers move this client's clock to where the job is.
  void Rejoined(uint32_t incarnation);

  const std::vector<std::string>& endpoints() const;
  PullStats pull_stats() const;

 private:
  // src/client/ps_client_factory.h: builds clients on an injected clock
  // and transport (the tests' fakes).
  friend class PsClientFactory;
  struct Impl;
  explicit PsClient(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace hetps
