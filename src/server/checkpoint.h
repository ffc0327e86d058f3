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

  // With checkpoint.resume: loads the newest checkpoint that verifies.
  // No checkpoint yet: starts from the initial values (logged). Checkpoints
  // exist but none verifies, or one does not fit this job: the error.
  absl::Status Restore();

  // Saves now, between two applies; returns the checkpoint's path.
  absl::StatusOr<std::string> Save();

  // Starts / stops the periodic saves (checkpoint.every_rounds > 0).
  void Start();
  void Stop();

 private:
  absl::StatusOr<std::string> SaveLocked(uint64_t applied);

  const JobConfig config_;
  const uint32_t rank_;
  const std::string server_dir_;
  PsServer* const server_;
  const JobProgressHooks progress_;
  Clock& clock_;

  absl::Mutex mu_;  // one save at a time
  uint64_t next_seq_ ABSL_GUARDED_BY(mu_) = 1;

  absl::Mutex stop_mu_;
  absl::CondVar stop_cv_;
  bool stop_ ABSL_GUARDED_BY(stop_mu_) = false;
  std::thread thread_;
};

}  // namespace hetps
