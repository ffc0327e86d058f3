#include "support/fake_clock.h"

#include <algorithm>

namespace hetps::testing {
namespace {

const absl::Time kStart = absl::FromUnixSeconds(1000000);

}  // namespace

FakeClock::FakeClock()
    : wall_start_(absl::Now()), elapsed_(absl::ZeroDuration()) {}

absl::Time FakeClock::Now() const {
  absl::MutexLock lock(&mu_);
  return kStart + elapsed_;
}

absl::Time FakeClock::WallNow() const {
  absl::MutexLock lock(&mu_);
  return wall_start_ + elapsed_;
}

void FakeClock::SleepFor(absl::Duration d) {
  {
    absl::MutexLock lock(&mu_);
    sleeps_.push_back(d);
    if (d > absl::ZeroDuration()) elapsed_ += d;
  }
  WakeAll();
}

bool FakeClock::WaitUntil(absl::CondVar& cv, absl::Mutex& mu,
                          absl::Time deadline) {
  {
    absl::MutexLock lock(&mu_);
    if (kStart + elapsed_ >= deadline) return true;
    waiters_.push_back({&cv, &mu});
  }
  // The caller holds `mu` until Wait releases it, and WakeAll takes `mu`
  // before it signals: a wake-up between the registration above and the
  // wait is not lost.
  cv.Wait(&mu);
  absl::MutexLock lock(&mu_);
  waiters_.erase(std::find_if(waiters_.begin(), waiters_.end(),
                              [&](const Waiter& w) { return w.cv == &cv; }));
  return kStart + elapsed_ >= deadline;
}

void FakeClock::Advance(absl::Duration d) {
  {
    absl::MutexLock lock(&mu_);
    elapsed_ += d;
  }
  WakeAll();
}

void FakeClock::WakeAll() {
  std::vector<Waiter> waiters;
  {
    absl::MutexLock lock(&mu_);
    waiters = waiters_;
  }
  for (const Waiter& w : waiters) {
    absl::MutexLock lock(w.mu);
    w.cv->SignalAll();
  }
}

int FakeClock::waiting() const {
  absl::MutexLock lock(&mu_);
  return static_cast<int>(waiters_.size());
}

void FakeClock::AwaitWaiting(int n) const {
  auto enough = [this, n]() ABSL_SHARED_LOCKS_REQUIRED(mu_) {
    return static_cast<int>(waiters_.size()) >= n;
  };
  absl::MutexLock lock(&mu_, absl::Condition(&enough));
}

std::vector<absl::Duration> FakeClock::sleeps() const {
  absl::MutexLock lock(&mu_);
  return sleeps_;
}

}  // namespace hetps::testing
