// Starts `hetps server` processes on loopback for the benchmarks that drive
// servers directly (push_pull_bench, migration_bench). Header-only.
#pragma once

#include <atomic>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "cli/process_group.h"

namespace hetps::bench {

// Starts servers 0..count-1 of the job at `config_path` (`hetps` is the
// binary) in `group`, whose line callback counts `listening` up at each
// kListeningPrefix line, and waits until every one listens; returns their
// pids by rank. An error names a server that did not start or exited first.
inline absl::StatusOr<std::vector<pid_t>> StartServers(
    ProcessGroup& group, const std::string& hetps,
    const std::string& config_path, int count,
    const std::atomic<int>& listening) {
  std::vector<pid_t> pids;
  for (int s = 0; s < count; ++s) {
    auto pid = group.Spawn(absl::StrCat("server ", s),
                           {hetps, "server", "--config", config_path, "--rank",
                            std::to_string(s)});
    if (!pid.ok()) return pid.status();
    pids.push_back(*pid);
  }
  while (listening < count) {
    if (auto exit = group.WaitAny(absl::Milliseconds(20))) {
      return absl::UnavailableError(
          absl::StrCat(exit->label, " exited before it listened"));
    }
  }
  return pids;
}

}  // namespace hetps::bench
