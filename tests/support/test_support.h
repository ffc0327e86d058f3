// Shared test helpers: status matchers, loopback ports, temporary files,
// running the hetps binary, and a local cluster of server processes.
#pragma once

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/types.h>

#include <atomic>
#include <chrono>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "cli/process_group.h"
#include "hetps/config.h"
#include "nlohmann/json.hpp"

namespace hetps::testing {

inline const absl::Status& internal_status(const absl::Status& s) { return s; }
template <typename T>
const absl::Status& internal_status(const absl::StatusOr<T>& s) {
  return s.status();
}

// EXPECT_THAT(status, StatusIs(absl::StatusCode::kNotFound, HasSubstr("x")))
MATCHER_P2(StatusIs, code, message_matcher, "") {
  const absl::Status& s = internal_status(arg);
  if (s.code() != code) {
    *result_listener << "code " << absl::StatusCodeToString(s.code()) << " ("
                     << s.message() << ")";
    return false;
  }
  return ::testing::ExplainMatchResult(
      message_matcher, std::string(s.message()), result_listener);
}

// The code of a refused argument, config field or request.
inline constexpr absl::StatusCode kInvalid = absl::StatusCode::kInvalidArgument;

// `n` values drawn from N(0, scale²), the same for the same `seed`.
std::vector<float> RandomValues(size_t n, uint64_t seed, float scale = 1);

// A job of one server ("127.0.0.1:1", a placeholder) and one worker in
// `mode`, without warm-up rounds, with one sparse table "emb" of dim 2 (sgd
// at learning rate 1, rows starting at zero: a row reads as minus the sum
// of the gradients pushed to it).
JobConfig OneTableJob(ConsistencyMode mode);

// `count` distinct "127.0.0.1:port" endpoints free a moment ago.
std::vector<std::string> FreeEndpoints(int count);

// A fresh directory under the test's temp dir, removed at destruction.
class TempDir {
 public:
  TempDir();
  ~TempDir();
  const std::string& path() const { return path_; }
  // Writes `text` to path()/name and returns the full path.
  std::string Write(const std::string& name, const std::string& text) const;

 private:
  std::string path_;
};

struct CommandResult {
  int exit_code = -1;  // 124 when the time limit killed it
  std::string output;  // stdout and stderr together
  double seconds = 0;
};

// Runs `args` (args[0] is the program) with a time limit; never throws.
CommandResult RunCommand(const std::vector<std::string>& args,
                         std::chrono::seconds limit);

// The pid of a running process whose command line contains `args` in this
// order, one after the other (e.g. {"worker", "--config", path, "--rank",
// "2"}), read from /proc; looked for again every 20 ms until `wait` passed.
std::optional<pid_t> FindProcess(
    const std::vector<std::string>& args,
    std::chrono::milliseconds wait = std::chrono::milliseconds(0));

// `hetps launch config --no-status -v --run-dir <dir>/run --summary-json
// <dir>/summary.json --set ...` and the summary it wrote (null when it wrote
// none).
struct LaunchedJob {
  CommandResult result;
  nlohmann::json summary;
};
LaunchedJob LaunchJob(const TempDir& dir, const std::string& config,
                      const std::vector<std::string>& sets = {},
                      std::chrono::seconds limit = std::chrono::seconds(300));

// The built hetps binary and the source tree.
std::string HetpsBinary();
std::string SourcePath(const std::string& relative);

// Threads of this process now (/proc/self/status); -1 if unreadable.
int ThreadsOfThisProcess();

// Polls `condition` every millisecond until it holds (true) or `limit`
// has passed (false): for conditions nothing signals, e.g. a counter of
// another process or library.
bool WaitFor(const std::function<bool()>& condition,
             absl::Duration limit = absl::Seconds(30));

// `hetps server` processes for a config file whose cluster.ps_endpoints are
// set. Start() returns once every server printed its listening line. The
// children are killed when this object goes away.
class ServerProcesses {
 public:
  ServerProcesses();
  ::testing::AssertionResult Start(const std::string& config_path, int count,
                                   std::chrono::seconds limit,
                                   const std::vector<std::string>& extra = {});
  ProcessGroup& group() { return group_; }

 private:
  std::atomic<int> listening_{0};
  ProcessGroup group_;
};

}  // namespace hetps::testing
