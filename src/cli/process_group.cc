// ProcessGroup (process_group.h), Linux only.
//
// Each child runs in its own process group, so stopping it also stops what it
// started (a shell's background jobs), and nothing is left holding the write
// end of its output pipe: the pump threads then reach EOF and the destructor
// can join them. Because the children are not in the terminal's foreground
// group, Ctrl-C reaches only the launcher, which stops them through StopAll.
//
// PR_SET_PDEATHSIG fires when the *thread* that forked exits, not the process;
// so Spawn must be called from a thread that outlives the children (the
// launcher's own, as the header requires).

#include "cli/process_group.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <mutex>  // std::call_once
#include <utility>

#include "absl/strings/str_cat.h"

extern char** environ;

namespace hetps {
namespace {

// Interrupt state shared by every ProcessGroup: a signal is process-wide.
std::atomic<bool> g_interrupted{false};
// Self-pipe the handler writes to so that WaitAny wakes at once. Both ends
// are non-blocking and close-on-exec.
int g_interrupt_pipe[2] = {-1, -1};

void OnInterrupt(int) {
  const int saved_errno = errno;
  g_interrupted.store(true);
  if (g_interrupt_pipe[1] >= 0) {
    const char byte = 1;
    // A full pipe already holds a wake-up; nothing else to do on failure.
    [[maybe_unused]] ssize_t n = write(g_interrupt_pipe[1], &byte, 1);
  }
  errno = saved_errno;
}

void InstallInterruptHandlers() {
  if (pipe2(g_interrupt_pipe, O_CLOEXEC | O_NONBLOCK) != 0) {
    // Without the pipe WaitAny still sees the flag on its next poll slice.
    g_interrupt_pipe[0] = g_interrupt_pipe[1] = -1;
  }
  struct sigaction action {};
  action.sa_handler = &OnInterrupt;
  sigemptyset(&action.sa_mask);
  action.sa_flags = SA_RESTART;
  sigaction(SIGINT, &action, nullptr);
  sigaction(SIGTERM, &action, nullptr);
}

void DrainInterruptPipe() {
  char buf[64];
  while (g_interrupt_pipe[0] >= 0 &&
         read(g_interrupt_pipe[0], buf, sizeof(buf)) > 0) {
  }
}

// Sleeps up to `ms` milliseconds, waking early when an interrupt arrives.
void WaitForInterrupt(int ms) {
  if (g_interrupt_pipe[0] < 0) {
    poll(nullptr, 0, ms);
    return;
  }
  pollfd fd{g_interrupt_pipe[0], POLLIN, 0};
  if (poll(&fd, 1, ms) > 0) DrainInterruptPipe();
}

// How long WaitAny/StopAll sleep between waitpid checks.
constexpr int kReapPollMs = 10;
// A child line longer than this is printed in pieces, so a child that never
// writes a newline cannot grow our memory without bound.
constexpr size_t kMaxLineBytes = 64 * 1024;

ChildExit MakeExit(const std::string& label, pid_t pid, int wait_status) {
  ChildExit exit;
  exit.label = label;
  exit.pid = pid;
  if (WIFSIGNALED(wait_status)) {
    exit.signaled = true;
    exit.exit_code = 128 + WTERMSIG(wait_status);
  } else {
    exit.exit_code = WEXITSTATUS(wait_status);
  }
  return exit;
}

// Signals the child's whole process group; falls back to the child alone in
// case its group does not exist (it cannot once Spawn has returned, but the
// fallback costs nothing).
void SignalChild(pid_t pid, int sig) {
  if (kill(-pid, sig) != 0) kill(pid, sig);
}

// Runs in the forked child: only async-signal-safe calls until execve, since
// other threads of the parent may have held locks (malloc's included) at the
// fork. Never returns.
[[noreturn]] void RunChild(pid_t parent, int out_fd, int status_fd,
                           char* const* argv, char* const* envp) {
  auto fail = [status_fd](int error) {
    [[maybe_unused]] ssize_t n = write(status_fd, &error, sizeof(error));
    _exit(127);
  };
  // Our own handlers and ignored signals (e.g. SIGPIPE) must not leak into
  // the child; every signal is still blocked, as the parent arranged.
  for (int sig = 1; sig < NSIG; ++sig) {
    if (sig == SIGKILL || sig == SIGSTOP) continue;
    struct sigaction action {};
    action.sa_handler = SIG_DFL;
    sigemptyset(&action.sa_mask);
    sigaction(sig, &action, nullptr);  // fails harmlessly for reserved ones
  }
  if (prctl(PR_SET_PDEATHSIG, SIGKILL) != 0) fail(errno);
  // The launcher may have died before prctl took effect.
  if (getppid() != parent) _exit(127);
  setpgid(0, 0);
  if (dup2(out_fd, STDOUT_FILENO) < 0 || dup2(out_fd, STDERR_FILENO) < 0) {
    fail(errno);
  }
  // Children are daemons of the launcher: they must not read its terminal.
  const int null_fd = open("/dev/null", O_RDONLY);
  if (null_fd >= 0) {
    dup2(null_fd, STDIN_FILENO);
    if (null_fd != STDIN_FILENO) close(null_fd);
  }
  sigset_t none;
  sigemptyset(&none);
  sigprocmask(SIG_SETMASK, &none, nullptr);
  execve(argv[0], argv, envp);
  fail(errno);
  _exit(127);  // not reached; fail() exits
}

}  // namespace

struct ProcessGroup::Child {
  std::string label;
  pid_t pid = -1;
};

ProcessGroup::ProcessGroup(LineCallback on_line, Clock& clock, bool echo)
    : on_line_(std::move(on_line)), clock_(clock), echo_(echo) {
  static std::once_flag installed;
  std::call_once(installed, &InstallInterruptHandlers);
}

ProcessGroup::~ProcessGroup() {
  StopAll(absl::Seconds(5));
  for (std::thread& pump : pumps_) pump.join();
}

bool ProcessGroup::interrupted() { return g_interrupted.load(); }

absl::StatusOr<pid_t> ProcessGroup::Spawn(
    const std::string& label, const std::vector<std::string>& argv,
    const std::vector<std::pair<std::string, std::string>>& env) {
  if (argv.empty() || argv[0].empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("spawn '", label, "': empty command"));
  }
  // Everything the child needs is built here: after fork it may not
  // allocate.
  std::vector<char*> child_argv;
  for (const std::string& arg : argv) {
    child_argv.push_back(const_cast<char*>(arg.c_str()));
  }
  child_argv.push_back(nullptr);
  std::vector<std::string> env_strings;
  for (char** var = environ; *var != nullptr; ++var) {
    const std::string_view entry(*var);
    bool replaced = false;
    for (const auto& [name, value] : env) {
      if (entry.size() > name.size() && entry.substr(0, name.size()) == name &&
          entry[name.size()] == '=') {
        replaced = true;
        break;
      }
    }
    if (!replaced) env_strings.emplace_back(entry);
  }
  for (const auto& [name, value] : env) {
    env_strings.push_back(absl::StrCat(name, "=", value));
  }
  std::vector<char*> child_env;
  for (std::string& entry : env_strings) child_env.push_back(entry.data());
  child_env.push_back(nullptr);

  int out_pipe[2];
  int status_pipe[2];  // close-on-exec: EOF means execve succeeded
  if (pipe2(out_pipe, O_CLOEXEC) != 0) {
    return absl::ErrnoToStatus(errno,
                               absl::StrCat("spawn '", label, "': pipe"));
  }
  if (pipe2(status_pipe, O_CLOEXEC) != 0) {
    const int error = errno;
    close(out_pipe[0]);
    close(out_pipe[1]);
    return absl::ErrnoToStatus(error,
                               absl::StrCat("spawn '", label, "': pipe"));
  }

  // Block every signal across fork so that no handler of ours runs in the
  // child before it resets them.
  sigset_t all;
  sigset_t old_mask;
  sigfillset(&all);
  pthread_sigmask(SIG_SETMASK, &all, &old_mask);
  const pid_t parent = getpid();
  const pid_t pid = fork();
  if (pid == 0) {
    RunChild(parent, out_pipe[1], status_pipe[1], child_argv.data(),
             child_env.data());
  }
  const int fork_error = errno;
  pthread_sigmask(SIG_SETMASK, &old_mask, nullptr);
  close(out_pipe[1]);
  close(status_pipe[1]);
  if (pid < 0) {
    close(out_pipe[0]);
    close(status_pipe[0]);
    return absl::ErrnoToStatus(fork_error,
                               absl::StrCat("spawn '", label, "': fork"));
  }
  // Also set the group here, so that it exists before Spawn returns whatever
  // the scheduling (EACCES after the child's execve is fine: it did it).
  setpgid(pid, pid);

  int exec_error = 0;
  ssize_t n;
  do {
    n = read(status_pipe[0], &exec_error, sizeof(exec_error));
  } while (n < 0 && errno == EINTR);
  close(status_pipe[0]);
  if (n > 0) {
    close(out_pipe[0]);
    int wait_status = 0;
    while (waitpid(pid, &wait_status, 0) < 0 && errno == EINTR) {
    }
    return absl::ErrnoToStatus(
        exec_error,
        absl::StrCat("spawn '", label, "': cannot execute '", argv[0], "'"));
  }

  {
    absl::MutexLock lock(&mu_);
    auto child = std::make_unique<Child>();
    child->label = label;
    child->pid = pid;
    children_[pid] = std::move(child);
  }
  pumps_.emplace_back(&ProcessGroup::Pump, this, out_pipe[0], label);
  return pid;
}

void ProcessGroup::Pump(int fd, std::string label) {
  const std::string prefix = absl::StrCat("[", label, "] ");
  std::string pending;
  auto emit = [&](std::string line) {
    if (echo_) {
      absl::MutexLock lock(&mu_);
      std::fwrite(prefix.data(), 1, prefix.size(), stdout);
      std::fwrite(line.data(), 1, line.size(), stdout);
      std::fputc('\n', stdout);
      std::fflush(stdout);
    }
    if (on_line_) on_line_(label, line);
  };
  char buf[4096];
  while (true) {
    const ssize_t n = read(fd, buf, sizeof(buf));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    pending.append(buf, static_cast<size_t>(n));
    size_t start = 0;
    for (size_t newline; (newline = pending.find('\n', start)) != pending.npos;
         start = newline + 1) {
      size_t end = newline;
      if (end > start && pending[end - 1] == '\r') --end;
      emit(pending.substr(start, end - start));
    }
    pending.erase(0, start);
    while (pending.size() >= kMaxLineBytes) {
      emit(pending.substr(0, kMaxLineBytes));
      pending.erase(0, kMaxLineBytes);
    }
  }
  if (!pending.empty()) emit(std::move(pending));  // last line, no newline
  close(fd);
}

std::optional<ChildExit> ProcessGroup::WaitAny(absl::Duration timeout) {
  const absl::Time deadline = clock_.Now() + timeout;
  while (true) {
    {
      absl::MutexLock lock(&mu_);
      if (children_.empty()) return std::nullopt;  // nothing can exit
      // Only our own children: waitpid(-1) would steal exits from whoever
      // else in this process started one.
      for (auto it = children_.begin(); it != children_.end(); ++it) {
        int wait_status = 0;
        if (waitpid(it->first, &wait_status, WNOHANG) == it->first) {
          ChildExit exit = MakeExit(it->second->label, it->first, wait_status);
          // Anything it left behind in its group goes with it (see top).
          kill(-it->first, SIGKILL);
          children_.erase(it);
          return exit;
        }
      }
    }
    if (interrupted()) return std::nullopt;
    const absl::Duration left = deadline - clock_.Now();
    if (left <= absl::ZeroDuration()) return std::nullopt;
    WaitForInterrupt(static_cast<int>(std::min<int64_t>(
        absl::ToInt64Milliseconds(absl::Ceil(left, absl::Milliseconds(1))),
        kReapPollMs)));
  }
}

std::vector<ChildExit> ProcessGroup::StopAll(absl::Duration grace) {
  // mu_ is taken only around map access: the pumps need it to print, and a
  // child blocked on a full output pipe could not exit during the grace.
  std::vector<pid_t> pids;
  {
    absl::MutexLock lock(&mu_);
    for (const auto& [pid, child] : children_) pids.push_back(pid);
  }
  for (pid_t pid : pids) SignalChild(pid, SIGTERM);

  std::vector<ChildExit> exits;
  auto reap = [&](int options) {
    for (auto it = pids.begin(); it != pids.end();) {
      int wait_status = 0;
      pid_t got;
      do {
        got = waitpid(*it, &wait_status, options);
      } while (got < 0 && errno == EINTR);
      // ECHILD: someone else reaped it; it is gone all the same.
      if (got != *it && !(got < 0 && errno == ECHILD)) {
        ++it;
        continue;
      }
      kill(-*it, SIGKILL);  // stragglers in its group (see top)
      absl::MutexLock lock(&mu_);
      auto child = children_.find(*it);
      if (got == *it && child != children_.end()) {
        exits.push_back(MakeExit(child->second->label, *it, wait_status));
      }
      if (child != children_.end()) children_.erase(child);
      it = pids.erase(it);
    }
  };
  const absl::Time deadline = clock_.Now() + grace;
  while (true) {
    reap(WNOHANG);
    if (pids.empty() || clock_.Now() >= deadline) break;
    // A plain sleep: a second Ctrl-C must not cut the grace short.
    poll(nullptr, 0, kReapPollMs);
  }
  for (pid_t pid : pids) SignalChild(pid, SIGKILL);
  reap(0);
  return exits;
}

std::vector<std::string> ProcessGroup::RunningLabels() const {
  absl::MutexLock lock(&mu_);
  std::vector<std::string> labels;
  for (const auto& [pid, child] : children_) labels.push_back(child->label);
  return labels;
}

}  // namespace hetps
