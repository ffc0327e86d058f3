#include "common/task_pool.h"

#include <pthread.h>

#include <utility>

namespace hetps {

TaskPool::TaskPool(std::string name, size_t max_threads,
                   absl::Duration idle_for)
    : name_(std::move(name).substr(0, 15)),
      max_threads_(std::max<size_t>(1, max_threads)),
      idle_for_(idle_for) {}

TaskPool::~TaskPool() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
    work_.SignalAll();
    // A thread may still start another (a task that queues a task); wait
    // until the queue is empty and every thread has left.
    while (!queue_.empty() || !running_.empty()) left_.Wait(&mu_);
  }
  JoinEnded();
}

void TaskPool::Run(std::function<void()> task) {
  JoinEnded();
  absl::MutexLock lock(&mu_);
  queue_.push_back(std::move(task));
  if (idle_ >= queue_.size() || running_.size() >= max_threads_) {
    work_.Signal();
    return;
  }
  running_.emplace_front();
  auto self = running_.begin();
  try {
    *self = std::thread([this, self] { Loop(self); });
  } catch (...) {
    // No thread to be had: the task is dropped unrun, the caller told.
    running_.erase(self);
    queue_.pop_back();
    throw;
  }
}

size_t TaskPool::threads() const {
  absl::MutexLock lock(&mu_);
  return running_.size();
}

void TaskPool::Loop(std::list<std::thread>::iterator self) {
  pthread_setname_np(pthread_self(), name_.c_str());
  absl::MutexLock lock(&mu_);
  while (true) {
    if (!queue_.empty()) {
      std::function<void()> task = std::move(queue_.front());
      queue_.pop_front();
      mu_.Unlock();
      task();
      task = nullptr;  // its captures die outside the lock too
      mu_.Lock();
      continue;
    }
    if (stopping_) break;
    ++idle_;
    const bool timed_out = work_.WaitWithTimeout(&mu_, idle_for_);
    --idle_;
    if (timed_out && queue_.empty()) break;
  }
  // The handle moves to `ended_`, where the next Run or the destructor
  // joins it: a thread cannot join itself.
  ended_.splice(ended_.end(), running_, self);
  left_.SignalAll();
}

void TaskPool::JoinEnded() {
  std::list<std::thread> ended;
  {
    absl::MutexLock lock(&mu_);
    ended.swap(ended_);
  }
  for (std::thread& t : ended) t.join();
}

}  // namespace hetps
