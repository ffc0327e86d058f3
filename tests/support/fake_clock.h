// FakeClock: a Clock whose time moves only when told. Advance() moves it on
// and wakes every WaitUntil whose deadline it passes; SleepFor moves it on by
// the sleep (a sleeping thread is the only thing that would) and records
// the sleep, so retry and back-off loops run to their end at once and a test
// can read the sleeps they took. waiting() lets a test wait until another
// thread is blocked in WaitUntil (an observable condition, not a sleep).
#pragma once

#include <vector>

#include "absl/synchronization/mutex.h"
#include "common/clock.h"

namespace hetps::testing {

class FakeClock final : public Clock {
 public:
  // Now() starts at an arbitrary time; WallNow() at the machine's date, so
  // that gRPC deadlines built from it (RpcDeadline) mean what they say.
  FakeClock();

  absl::Time Now() const override;
  absl::Time WallNow() const override;
  void SleepFor(absl::Duration d) override;
  bool WaitUntil(absl::CondVar& cv, absl::Mutex& mu,
                 absl::Time deadline) override;

  void Advance(absl::Duration d);
  // Threads blocked in WaitUntil now.
  int waiting() const;
  // Blocks (really) until `n` threads are blocked in WaitUntil.
  void AwaitWaiting(int n) const;
  // The sleeps taken so far, in order.
  std::vector<absl::Duration> sleeps() const;

 private:
  struct Waiter {
    absl::CondVar* cv;
    absl::Mutex* mu;
  };
  void WakeAll();

  const absl::Time wall_start_;
  mutable absl::Mutex mu_;
  absl::Duration elapsed_ ABSL_GUARDED_BY(mu_);
  std::vector<Waiter> waiters_ ABSL_GUARDED_BY(mu_);
  std::vector<absl::Duration> sleeps_ ABSL_GUARDED_BY(mu_);
};

}  // namespace hetps::testing
