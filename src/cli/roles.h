// The `hetps` subcommands. Each takes a validated JobConfig (the CLI turned
// file, --set flags and environment into it) and, where it trains or
// serves, the JobShape resolved from it, and returns the process exit code.
#pragma once

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "hetps.pb.h"
#include "hetps/config.h"
#include "model/criteo_gen.h"
#include "model/job_shape.h"

namespace hetps {

inline constexpr int kExitOk = 0;
inline constexpr int kExitFailure = 1;
inline constexpr int kExitConfigError = 2;
inline constexpr int kExitInterrupted = 130;

// Printed by a server on stdout once it accepts calls.
inline constexpr const char* kListeningPrefix = "HETPS_LISTENING ";

// Serves rank `rank` until SIGINT/SIGTERM, then shuts down gracefully. With
// `until_done` (`hetps run`: no launcher stops it) also once the job is
// over: every worker done (kDoneBarrier) or gone; server 0, whose
// coordinator the others watch, waits up to 10 s for them to stop first.
// Exits 1 when the coordinator stays unreachable meanwhile.
int RunServerRole(const JobConfig& config, const JobShape& shape, int rank,
                  bool until_done = false);

// Checks the config, resolves the job's shape (and fills in the model's
// tables) and reads the secrets that `auth` points at.
absl::StatusOr<JobShape> ValidateAndResolve(JobConfig& config);

// Trains as worker `rank`; prints its report line on stdout. With
// `tell_done` (`hetps run`) it then passes kDoneBarrier. With
// `calibrate_s` > 0 it calibrates for that long instead of training its
// share (worker/calibration.h; `hetps calibrate` starts such workers).
int RunWorkerRole(const JobConfig& config, const JobShape& shape, int rank,
                  bool tell_done = false, double calibrate_s = 0);

struct LaunchOptions {
  std::string self_path;               // the hetps binary, for the children
  std::string config_path;             // passed on to the children
  std::vector<std::string> overrides;  // --set assignments, passed on too
  std::string summary_json;            // write the summary here when non-empty
  bool live_status = true;             // progress while the job runs
  // Every role's output in the terminal too (else only in the run
  // directory; a failing role's last lines are shown either way).
  bool verbose = false;
  // Where the roles' logs, the launcher's log and summary.json go (created);
  // empty: runs/<job>-<UTC date and time>.
  std::string run_dir;
  // Passed to every `hetps worker` after the others (`hetps calibrate`:
  // --calibrate-seconds).
  std::vector<std::string> worker_args;
};

// Runs a whole job on this machine: servers first (once all listen), then
// workers, one process each; gathers their output into the run directory
// (one log per role, launch.log, summary.json); shows one progress line
// (on a terminal) and the summary; stops everything on Ctrl-C or when the
// workers are done. Non-zero when any role failed.
int RunLaunch(JobConfig config, const LaunchOptions& options);

// The one-line summary `launch` prints while a job runs.
std::string FormatStatusLine(const rpc::StatusResponse& status);

// Writes generated Criteo-format data to `path` and prints the teacher's
// AUC on it (the best any model can reach) as text and one JSON line.
int RunGenData(const CriteoGenConfig& config, const std::string& path);

// Prints the coordinator's view of a running job, connecting with the job's
// `credentials`.
int RunStatus(const std::string& coordinator_endpoint, bool json,
              const Credentials& credentials);

// Asks every server of a running job to write a checkpoint now; prints the
// paths.
int RunSave(const std::string& coordinator_endpoint,
            const Credentials& credentials);

// Writes the model of the newest verified checkpoints under
// `checkpoint_dir` to `out_dir` (docs/CHECKPOINTS.md, "Export").
int RunExport(const std::string& checkpoint_dir, const std::string& out_dir);

}  // namespace hetps
