// TaskPool: threads that run queued tasks, started as the queue needs them
// (up to `max_threads`), and ended after `idle_for` without work. The
// servers answer RPCs on gRPC's callback threads, which must not block: what
// may wait (a pull whose round has closed meanwhile needs its rows read; a
// request held by a bucket move; a checkpoint) runs here instead.
//
// A bounded pool suits CPU work (a thread per core); an unbounded one suits
// tasks that block on each other, which a bound could deadlock.
//
// Thread-safety: every method may be called from any thread, a task
// included. The destructor runs the tasks queued so far, then joins.
#pragma once

#include <cstddef>
#include <deque>
#include <functional>
#include <limits>
#include <list>
#include <string>
#include <thread>

#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace hetps {

class TaskPool {
 public:
  static constexpr size_t kUnbounded = std::numeric_limits<size_t>::max();

  // `name` (at most 15 characters) names the threads for a profiler.
  TaskPool(std::string name, size_t max_threads,
           absl::Duration idle_for = absl::Seconds(10));
  ~TaskPool();
  TaskPool(const TaskPool&) = delete;
  TaskPool& operator=(const TaskPool&) = delete;

  // Queues `task`; a thread runs it as soon as one is free (a new thread
  // starts when none is idle and the bound allows). Throws
  // std::system_error, with `task` dropped unrun, when that thread cannot
  // be started.
  void Run(std::function<void()> task);

  // Threads alive now.
  size_t threads() const;

 private:
  void Loop(std::list<std::thread>::iterator self);
  // Joins threads that ended (their handles wait in `ended_`).
  void JoinEnded() ABSL_LOCKS_EXCLUDED(mu_);

  const std::string name_;
  const size_t max_threads_;
  const absl::Duration idle_for_;
  mutable absl::Mutex mu_;
  absl::CondVar work_;  // a task was queued, or the pool stops
  absl::CondVar left_;  // a thread ended
  std::deque<std::function<void()>> queue_ ABSL_GUARDED_BY(mu_);
  std::list<std::thread> running_ ABSL_GUARDED_BY(mu_);
  std::list<std::thread> ended_ ABSL_GUARDED_BY(mu_);
  size_t idle_ ABSL_GUARDED_BY(mu_) = 0;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace hetps
