// Server checkpoints (docs/CHECKPOINTS.md has the on-disk format).
//
// Each server writes its own checkpoints under
// `checkpoint.dir`/server-<rank>/ckpt-<seq>/: one file per table (rows with
// their optimizer state), rank 0 also the coordinator's data progress, and
// MANIFEST.json last, listing every file with its size and xxh64. A
// checkpoint is written to ckpt-<seq>.tmp/, every file fsynced, then renamed:
// a crash leaves either the old set or the new one, never a torn one.
//
// Loading verifies the manifest and every file before anything is read into
// a table; a checkpoint that fails (manifest missing or unreadable, file
// missing, wrong size, checksum mismatch) is refused with an error naming
// the file, and the one before it is tried.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "common/clock.h"
#include "hetps.pb.h"
#include "hetps/config.h"
#include "nlohmann/json.hpp"
#include "shard/shard_map.h"
#include "table/sparse_table.h"

namespace hetps {

class PsServer;

// What rank 0 keeps beside its tables: the coordinator's data progress. The
// node that runs both wires them; other ranks leave both empty.
struct JobProgressHooks {
  std::function<rpc::JobProgress()> save;
  std::function<void(const rpc::JobProgress&)> restore;
};

inline constexpr const char* kCheckpointFormat = "hetps-checkpoint-1";
inline constexpr const char* kManifestName = "MANIFEST.json";

// `root`/server-<rank>.
std::string ServerCheckpointDir(const std::string& root, uint32_t rank);

// A checkpoint that verified: its directory and manifest.
struct VerifiedCheckpoint {
  std::string path;
  uint64_t seq = 0;
  nlohmann::json manifest;
};

// Checks the manifest of the checkpoint at `path` and the size and checksum
// of every file it lists. The error names the file at fault.
absl::StatusOr<VerifiedCheckpoint> VerifyCheckpoint(const std::string& path);

// The newest checkpoint under `server_dir` that verifies. Each newer one
// that did not is described in `refused` (path and reason). NOT_FOUND when
// the directory holds no checkpoint at all; DATA_LOSS when it holds some and
// none verifies.
absl::StatusOr<VerifiedCheckpoint> NewestCheckpoint(
    const std::string& server_dir, std::vector<std::string>* refused);

// The bytes of `name` in a verified checkpoint, checked again against the
// manifest (the file may have changed since).
absl::StatusOr<std::string> ReadCheckpointFile(const VerifiedCheckpoint& ckpt,
                                               const std::string& name);

// Bucket moves (docs/CHECKPOINTS.md, "Bucket moves"). A server's checkpoint
// holds the buckets its shard map gives it (its manifest's "shard_map"; a
// save waits out the moves involving the server), and every TakeOver writes
// the rows moved to the server down as a move record under
// `server_dir`/moved-in/ (a checkpoint of those buckets: "map_version",
// "buckets", rows.pb) before installing them. A bucket's newest rows are
// then in the checkpoint or record of the highest map version that holds it.

// `server_dir`/moved-in.
std::string MoveRecordDir(const std::string& server_dir);

// Deletes the move records under `server_dir` that no restore reads: those
// each of whose buckets a newer record there (by map version, then
// sequence) holds too. A server whose buckets come and go between saves so
// keeps at most one record per bucket instead of one per move; a save
// deletes the records its checkpoint covers. Returns how many it deleted.
size_t DropCoveredMoveRecords(const std::string& server_dir);

// What of one server survives it: its newest checkpoint (none: nothing
// saved yet) and the move records newer than that checkpoint's map, by
// map version.
struct DurableRows {
  std::optional<VerifiedCheckpoint> checkpoint;
  std::vector<VerifiedCheckpoint> moved_in;
};

// `server_dir`'s durable rows. `verify_files`: every checkpoint and record
// verified whole (VerifyCheckpoint; a newer checkpoint that does not verify
// is described in `refused` and the one before it taken); otherwise their
// manifests only. DATA_LOSS when checkpoints exist and none verifies.
absl::StatusOr<DurableRows> ReadDurableRows(const std::string& server_dir,
                                            bool verify_files,
                                            std::vector<std::string>* refused);

// The shard map a resumed job starts from: each bucket owned by the server
// whose durable rows (under `root`) hold the newest rows of it, a bucket no
// server holds by the first map. The first map (ShardMap::Uniform) when
// that is where every bucket is; otherwise a map newer than any saved
// (ShardMap::Resumed). Manifests only are read.
absl::StatusOr<ShardMap> ResumedShardMap(const std::string& root,
                                         uint32_t num_servers,
                                         uint32_t num_buckets);

// Calls `row(key, update count, weights, state)` for each durable row of
// sparse table `table` (`file` in a checkpoint; rows of `dim` floats) whose
// bucket (of `num_buckets`) `keep` accepts: a bucket's rows from the newest
// of the checkpoint and the records that hold it. `*state_width`: the
// floats of optimizer state every row carries (unset: no file holds the
// table's rows); rows of another width are DATA_LOSS.
absl::Status ForEachDurableRow(
    const DurableRows& rows, const std::string& table, const std::string& file,
    uint64_t dim, uint32_t num_buckets,
    const std::function<bool(uint32_t)>& keep,
    std::optional<uint64_t>* state_width,
    const std::function<void(uint64_t, uint64_t, std::span<const float>,
                             std::span<const float>)>& row);

// Writes one checkpoint: files are added one by one (each streamed to disk
// and fsynced), Commit writes the manifest and renames the directory.
class CheckpointWriter {
 public:
  // Starts checkpoint `seq` in `server_dir`/ckpt-<seq>.tmp/.
  static absl::StatusOr<std::unique_ptr<CheckpointWriter>> Begin(
      const std::string& server_dir, uint64_t seq);
  ~CheckpointWriter();

  // Streams a file: `write(append)` calls `append` with consecutive pieces.
  using Append = std::function<void(const void* data, size_t bytes)>;
  absl::Status AddFile(const std::string& name,
                       const std::function<void(const Append&)>& write);

  // Writes MANIFEST.json (`manifest` plus the "files" list), fsyncs and
  // renames to ckpt-<seq>/. Returns the final path.
  absl::StatusOr<std::string> Commit(nlohmann::json manifest);

 private:
  CheckpointWriter(std::string server_dir, uint64_t seq);
  const std::string server_dir_;
  const uint64_t seq_;
  const std::string tmp_path_;
  nlohmann::json files_ = nlohmann::json::array();
  bool committed_ = false;
};

// Writes the model held by the newest verified checkpoint of every server
// under `root` to `out_dir` for serving: per table one file of weights
// (sparse rows sorted by key, dense arrays whole), no optimizer state, and
// model.json describing them (docs/CHECKPOINTS.md, "Export"). Returns
// model.json's content.
absl::StatusOr<nlohmann::json> ExportModel(const std::string& root,
                                           const std::string& out_dir);

// Saves and restores one server: its PsServer's tables (and, on rank 0,
// the coordinator's data progress through JobProgressHooks), every
// `checkpoint.every_rounds` applied rounds from a background thread and
// whenever Save is called.
class Checkpointer {
 public:
  // `progress`: rank 0's hooks to the coordinator's data progress.
  // Timing and the manifest's creation time come from `clock`.
  Checkpointer(const JobConfig& config, uint32_t rank, PsServer* server,
               JobProgressHooks progress = {}, Clock& clock = Clock::Real());
  ~Checkpointer();

  // With checkpoint.resume: loads the newest checkpoint that verifies and
  // the rows moved here after it (DurableRows), keeping those of the
  // buckets this server owns in `job_map()` (unset: ResumedShardMap of the
  // checkpoint root; a server joining a running job asks the coordinator),
  // and adopts that map. No checkpoint yet: starts from the initial values
  // (logged). Checkpoints exist but none verifies, or one does not fit this
  // job: the error.
  absl::Status Restore(
      const std::function<absl::StatusOr<ShardMap>()>& job_map = {});

  // Writes the rows TakeOver moved here under shard map `map_version` down
  // as a move record (PsServer::SetMovedInRecorder).
  absl::Status RecordMovedIn(const rpc::MovedRows& rows, uint64_t map_version);

  // Saves now; returns the checkpoint's path. Applies wait only while the
  // tables are snapshotted (SparseTable::TakeSnapshot copies nothing; a
  // stripe is copied when a write first touches it or the save reaches
  // it), not while the files are written.
  absl::StatusOr<std::string> Save();
  // How long the last save held applies.
  absl::Duration last_pause() {
    absl::MutexLock lock(&mu_);
    return last_pause_;
  }

  // Starts / stops the periodic saves (checkpoint.every_rounds > 0).
  void Start();
  void Stop();

 private:
  struct Frozen;
  // Writes what Save froze (under mu_).
  absl::StatusOr<std::string> Write(Frozen& frozen)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Drops the move records a checkpoint kept now holds (saved under a map
  // older than `map_version`) and any record a crash left half written.
  void DropMoveRecordsBefore(uint64_t map_version)
      ABSL_LOCKS_EXCLUDED(records_mu_);

  const JobConfig config_;
  const uint32_t rank_;
  const std::string server_dir_;
  PsServer* const server_;
  const JobProgressHooks progress_;
  Clock& clock_;

  absl::Mutex mu_;  // one save at a time
  uint64_t next_seq_ ABSL_GUARDED_BY(mu_) = 1;
  absl::Duration last_pause_ ABSL_GUARDED_BY(mu_);
  absl::Mutex records_mu_;
  uint64_t next_record_ ABSL_GUARDED_BY(records_mu_) = 1;

  absl::Mutex stop_mu_;
  absl::CondVar stop_cv_;
  bool stop_ ABSL_GUARDED_BY(stop_mu_) = false;
  std::thread thread_;
};

}  // namespace hetps
