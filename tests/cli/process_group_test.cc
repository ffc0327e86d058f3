#include "cli/process_group.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <condition_variable>
#include <csignal>
#include <fstream>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_split.h"
#include "support/fake_clock.h"
#include "support/test_support.h"

namespace hetps {
namespace {

using ::hetps::testing::StatusIs;
using std::chrono::milliseconds;
using std::chrono::seconds;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

// Collects on_line calls, which come from the pump threads.
class LineLog {
 public:
  ProcessGroup::LineCallback Callback() {
    return [this](const std::string& label, const std::string& line) {
      std::lock_guard<std::mutex> lock(mu_);
      lines_.emplace_back(label, line);
      cv_.notify_all();
    };
  }
  bool WaitFor(const std::string& label, const std::string& line,
               milliseconds timeout) {
    std::unique_lock<std::mutex> lock(mu_);
    return cv_.wait_for(lock, timeout, [&] {
      for (const auto& entry : lines_) {
        if (entry.first == label && entry.second == line) return true;
      }
      return false;
    });
  }
  std::vector<std::pair<std::string, std::string>> lines() {
    std::lock_guard<std::mutex> lock(mu_);
    return lines_;
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<std::pair<std::string, std::string>> lines_;
};

TEST(ProcessGroupTest, ReportsExitCodeAndPrefixesOutput) {
  LineLog log;
  ::testing::internal::CaptureStdout();
  {
    ProcessGroup group(log.Callback());
    absl::StatusOr<pid_t> pid = group.Spawn(
        "greeter", {"/bin/sh", "-c", "echo hi; echo oops >&2; exit 3"});
    ASSERT_TRUE(pid.ok()) << pid.status();
    EXPECT_THAT(group.RunningLabels(), ElementsAre("greeter"));
    std::optional<ChildExit> exit = group.WaitAny(absl::Seconds(10));
    ASSERT_TRUE(exit.has_value());
    EXPECT_EQ(exit->label, "greeter");
    EXPECT_EQ(exit->pid, *pid);
    EXPECT_EQ(exit->exit_code, 3);
    EXPECT_FALSE(exit->signaled);
    EXPECT_TRUE(group.RunningLabels().empty());
    EXPECT_FALSE(ProcessGroup::interrupted());
  }  // joins the pumps: every line has been delivered
  const std::string out = ::testing::internal::GetCapturedStdout();
  EXPECT_THAT(out, HasSubstr("[greeter] hi\n"));
  EXPECT_THAT(out, HasSubstr("[greeter] oops\n"));  // stderr too
  EXPECT_THAT(
      log.lines(),
      ElementsAre(std::pair<std::string, std::string>("greeter", "hi"),
                  std::pair<std::string, std::string>("greeter", "oops")));
}

// On a clock that never moves the grace cannot run out: the child ends by
// the SIGTERM alone.
TEST(ProcessGroupTest, StopAllTerminatesWithinTheGrace) {
  testing::FakeClock clock;
  ProcessGroup group(nullptr, clock);
  ASSERT_TRUE(group.Spawn("sleeper", {"/bin/sleep", "30"}).ok());
  std::vector<ChildExit> exits = group.StopAll(absl::Seconds(5));
  ASSERT_EQ(exits.size(), 1u);
  EXPECT_EQ(exits[0].label, "sleeper");
  EXPECT_TRUE(exits[0].signaled);
  EXPECT_EQ(exits[0].exit_code, 128 + SIGTERM);
  EXPECT_TRUE(group.RunningLabels().empty());
}

TEST(ProcessGroupTest, StopAllKillsAChildIgnoringSigterm) {
  LineLog log;
  ProcessGroup group(log.Callback());
  ASSERT_TRUE(group
                  .Spawn("stubborn", {"/bin/sh", "-c",
                                      "trap '' TERM; echo ready; sleep 30"})
                  .ok());
  ASSERT_TRUE(log.WaitFor("stubborn", "ready", seconds(10)));
  const absl::Time start = Clock::Real().Now();
  std::vector<ChildExit> exits = group.StopAll(absl::Milliseconds(200));
  // The grace was given in full before the SIGKILL.
  EXPECT_GE(Clock::Real().Now() - start, absl::Milliseconds(200));
  ASSERT_EQ(exits.size(), 1u);
  EXPECT_TRUE(exits[0].signaled);
  EXPECT_EQ(exits[0].exit_code, 128 + SIGKILL);
}

TEST(ProcessGroupTest, KilledChildReportsSignal) {
  ProcessGroup group;
  ASSERT_TRUE(group.Spawn("suicide", {"/bin/sh", "-c", "kill -9 $$"}).ok());
  std::optional<ChildExit> exit = group.WaitAny(absl::Seconds(10));
  ASSERT_TRUE(exit.has_value());
  EXPECT_TRUE(exit->signaled);
  EXPECT_EQ(exit->exit_code, 137);
}

TEST(ProcessGroupTest, BadPathIsASpawnError) {
  ProcessGroup group;
  EXPECT_THAT(group.Spawn("ghost", {"/nonexistent/hetps-binary", "x"}),
              StatusIs(absl::StatusCode::kNotFound,
                       HasSubstr("'/nonexistent/hetps-binary'")));
  EXPECT_THAT(group.Spawn("dir", {"/"}),
              StatusIs(absl::StatusCode::kPermissionDenied, HasSubstr("'/'")));
  EXPECT_THAT(group.Spawn("empty", {}),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("empty")));
  EXPECT_TRUE(group.RunningLabels().empty());
  EXPECT_FALSE(group.WaitAny(absl::Milliseconds(10)).has_value());
}

TEST(ProcessGroupTest, PassesEnvironmentAdditions) {
  LineLog log;
  {
    ProcessGroup group(log.Callback());
    ASSERT_TRUE(group
                    .Spawn("env",
                           {"/bin/sh", "-c", "echo \"$FOO $HETPS_PG_TEST\""},
                           {{"FOO", "bar"}, {"HETPS_PG_TEST", "second"}})
                    .ok());
    // An addition replaces a variable we already have.
    ASSERT_TRUE(group
                    .Spawn("path", {"/bin/sh", "-c", "echo \"$PATH\""},
                           {{"PATH", "/custom/bin"}})
                    .ok());
    for (int i = 0; i < 2; ++i) {
      std::optional<ChildExit> exit = group.WaitAny(absl::Seconds(10));
      ASSERT_TRUE(exit.has_value());
      EXPECT_EQ(exit->exit_code, 0);
    }
  }
  EXPECT_TRUE(log.WaitFor("env", "bar second", milliseconds(0)));
  EXPECT_TRUE(log.WaitFor("path", "/custom/bin", milliseconds(0)));
}

TEST(ProcessGroupTest, WaitAnyTimesOut) {
  ProcessGroup group;
  ASSERT_TRUE(group.Spawn("sleeper", {"/bin/sleep", "30"}).ok());
  const absl::Time start = Clock::Real().Now();
  EXPECT_FALSE(group.WaitAny(absl::Milliseconds(100)).has_value());
  EXPECT_GE(Clock::Real().Now() - start, absl::Milliseconds(100));
  EXPECT_FALSE(ProcessGroup::interrupted());
  EXPECT_THAT(group.RunningLabels(), ElementsAre("sleeper"));
}  // the destructor stops it

TEST(ProcessGroupTest, LastLineWithoutNewlineAndNoInterleaving) {
  LineLog log;
  ::testing::internal::CaptureStdout();
  {
    ProcessGroup group(log.Callback());
    const std::string loop =
        "i=0; while [ $i -lt 300 ]; do echo line-$i-abcdefghijklmnop; "
        "i=$((i+1)); done; printf tail";
    ASSERT_TRUE(group.Spawn("a", {"/bin/sh", "-c", loop}).ok());
    ASSERT_TRUE(group.Spawn("b", {"/bin/sh", "-c", loop}).ok());
    for (int i = 0; i < 2; ++i) ASSERT_TRUE(group.WaitAny(absl::Seconds(20)));
  }
  const std::string out = ::testing::internal::GetCapturedStdout();
  int lines = 0;
  for (absl::string_view line : absl::StrSplit(out, '\n', absl::SkipEmpty())) {
    ++lines;
    EXPECT_TRUE(line.rfind("[a] ", 0) == 0 || line.rfind("[b] ", 0) == 0)
        << line;
    EXPECT_TRUE(line.substr(4) == "tail" ||
                (line.substr(4, 5) == "line-" &&
                 line.substr(line.size() - 16) == "abcdefghijklmnop"))
        << line;
  }
  EXPECT_EQ(lines, 2 * 301);
  EXPECT_TRUE(log.WaitFor("a", "tail", milliseconds(0)));
  EXPECT_TRUE(log.WaitFor("b", "tail", milliseconds(0)));
}

// A child that leaves a background job holding its output pipe must not keep
// the destructor waiting for that job: the job goes with its parent's
// process group, so when the destructor returns it is gone.
TEST(ProcessGroupTest, LeftoverGrandchildDoesNotBlockShutdown) {
  LineLog log;
  pid_t grandchild = 0;
  {
    ProcessGroup group(log.Callback());
    ASSERT_TRUE(
        group.Spawn("parent", {"/bin/sh", "-c", "sleep 30 & echo $!"}).ok());
    std::optional<ChildExit> exit = group.WaitAny(absl::Seconds(10));
    ASSERT_TRUE(exit.has_value());
    EXPECT_EQ(exit->exit_code, 0);
  }
  const auto lines = log.lines();
  ASSERT_EQ(lines.size(), 1u);
  grandchild = std::stoi(lines[0].second);
  ASSERT_GT(grandchild, 0);
  // It was sent SIGKILL: it ends (gone, or a zombie its new parent has not
  // reaped yet) long before the 30 s it would sleep.
  const auto dead = [&] {
    std::ifstream stat("/proc/" + std::to_string(grandchild) + "/stat");
    std::string pid, name, state;
    return !(stat >> pid >> name >> state) || state == "Z";
  };
  const absl::Time limit = Clock::Real().Now() + absl::Seconds(10);
  while (!dead() && Clock::Real().Now() < limit) {
    Clock::Real().SleepFor(absl::Milliseconds(5));
  }
  EXPECT_TRUE(dead());
}

// Runs in a death-test child so the process-wide interrupt flag does not
// leak into the other tests.
TEST(ProcessGroupDeathTest, InterruptEndsWaitAny) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(
      {
        bool ok = false;
        {
          // On a clock that never moves only the interrupt can end the wait.
          testing::FakeClock clock;
          ProcessGroup group(nullptr, clock);
          if (!group.Spawn("sleeper", {"/bin/sleep", "30"}).ok()) _exit(2);
          std::raise(SIGINT);
          std::optional<ChildExit> exit = group.WaitAny(absl::Seconds(20));
          ok = !exit.has_value() && ProcessGroup::interrupted() &&
               group.StopAll(absl::Seconds(5)).size() == 1;
        }  // the output pumps are joined before the exit
        _exit(ok ? 0 : 1);
      },
      ::testing::ExitedWithCode(0), "");
}

}  // namespace
}  // namespace hetps
