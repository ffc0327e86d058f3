// ProcessGroup: the local launcher's children. Starts processes, gathers their
// output line by line (onto our stdout with a "[label] " prefix, unless told
// not to echo), and stops them
// all on request, on Ctrl-C (SIGINT/SIGTERM forwarded), and when the launcher
// itself dies (children get PR_SET_PDEATHSIG, so none outlive it).
//
// Thread-safety: Spawn/Wait*/Stop from one thread (the launcher's); the
// output pumps run on their own threads.
#pragma once

#include <sys/types.h>

#include <atomic>
#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/clock.h"

namespace hetps {

struct ChildExit {
  std::string label;
  pid_t pid = -1;
  int exit_code = 0;  // exit status, or 128 + signal number
  bool signaled = false;
};

class ProcessGroup {
 public:
  // `on_line` (optional) sees every output line of every child (after it is
  // printed), e.g. to pick up "listening on" announcements.
  using LineCallback =
      std::function<void(const std::string& label, const std::string& line)>;

  // Deadlines of WaitAny and StopAll are on `clock`. Without `echo` the
  // lines only go to `on_line` (a quiet launch keeps them in files).
  explicit ProcessGroup(LineCallback on_line = nullptr,
                        Clock& clock = Clock::Real(), bool echo = true);
  // Stops (SIGTERM, then SIGKILL after the grace period) any child still
  // running and joins the output pumps.
  ~ProcessGroup();
  ProcessGroup(const ProcessGroup&) = delete;
  ProcessGroup& operator=(const ProcessGroup&) = delete;

  // Starts argv[0] (a path) with argv; stdout and stderr are piped and
  // prefixed with "[label] ". Extra environment variables are added to ours.
  absl::StatusOr<pid_t> Spawn(
      const std::string& label, const std::vector<std::string>& argv,
      const std::vector<std::pair<std::string, std::string>>& env = {});

  // Waits until any running child exits, or `timeout` passes (nullopt), or an
  // interrupt arrives (SIGINT/SIGTERM to this process; then returns nullopt
  // and interrupted() is true).
  std::optional<ChildExit> WaitAny(absl::Duration timeout);

  // Sends SIGTERM to every running child, waits up to `grace`, then SIGKILLs
  // the rest; returns the exits of the children it reaped.
  std::vector<ChildExit> StopAll(absl::Duration grace);

  // Children started and not yet reaped.
  std::vector<std::string> RunningLabels() const;

  // True once SIGINT or SIGTERM reached this process (handlers installed by
  // the first ProcessGroup constructed).
  static bool interrupted();

 private:
  struct Child;
  void Pump(int fd, std::string label);

  LineCallback on_line_;
  Clock& clock_;
  const bool echo_;
  mutable absl::Mutex mu_;  // guards children_ and stdout writes
  std::map<pid_t, std::unique_ptr<Child>> children_ ABSL_GUARDED_BY(mu_);
  std::vector<std::thread> pumps_;
};

}  // namespace hetps
