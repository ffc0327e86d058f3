// Clock: the one source of time. Everything that reads the time, sleeps or
// waits with a timeout takes a Clock& (LevelDB's Env and Ninja's injected
// interfaces are the models), so that tests drive time by hand (FakeClock,
// tests/support/fake_clock.h) and nothing that judges liveness reads the
// wall clock: an NTP step must not drop a worker.
//
//  - Now() is monotonic: an absl::Time on an arbitrary timeline, never a
//    date. Only differences and comparisons of its values mean anything.
//  - WallNow() is the date, for what is one: a checkpoint's creation time
//    and the absolute deadlines gRPC takes (RpcDeadline).
//  - SleepFor and WaitUntil block; a FakeClock makes them follow its own
//    time instead of the machine's.
//
// Thread-safety: every method may be called from any thread.
#pragma once

#include <chrono>

#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace hetps {

class Clock {
 public:
  virtual ~Clock() = default;

  virtual absl::Time Now() const = 0;
  virtual absl::Time WallNow() const = 0;

  // Blocks the caller for `d` (returns at once for d <= 0).
  virtual void SleepFor(absl::Duration d) = 0;

  // As absl::CondVar::WaitWithDeadline with this clock's time: waits on
  // `cv` (the caller holds `mu`, released while waiting) until it is
  // signalled or Now() reaches `deadline`; may wake spuriously. Returns
  // true when the deadline has passed.
  virtual bool WaitUntil(absl::CondVar& cv, absl::Mutex& mu,
                         absl::Time deadline) = 0;

  void SleepUntil(absl::Time t) { SleepFor(t - Now()); }

  // The process's clock: steady time for Now(), the system clock for
  // WallNow(), real sleeps and waits.
  static Clock& Real();
};

// A gRPC deadline `seconds` from now on `clock`'s wall time.
std::chrono::system_clock::time_point RpcDeadline(const Clock& clock,
                                                  double seconds);

// The CPU time this process has used, all threads together, in seconds.
double ProcessCpuSeconds();

// The CPU time the calling thread has used.
absl::Duration ThreadCpuTime();

}  // namespace hetps
