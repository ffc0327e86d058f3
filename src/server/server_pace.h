// ServerPace: a server run as an emulated slower machine (server_profiles
// in the job config; DESIGN.md: DeviceProfile, for servers). After a
// request's table work, the handler sleeps the extra time the slower machine
// would need, c · (1 / speed − 1) for the c of it the thread spent on the
// CPU: time off the CPU (preempted by a neighbour on a shared host, waiting
// for a lock) is not stretched, or a scheduler slice of a few ms on a busy
// machine would become ten times that at a tenth of the speed. The service
// time a request reports (its load, shard/access_stats.h) is its wall time
// plus the extra. The extra times of all
// requests are laid end to end on one timeline, so concurrent requests
// queue behind each other: the emulated machine's capacity shrinks, not
// only its latency. A server without a profile does nothing here.
//
// Thread-safety: Pace may be called concurrently.
#pragma once

#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/clock.h"
#include "hetps/config.h"

namespace hetps {

class ServerPace {
 public:
  // `profile` may be null (a real machine); it must outlive this. Slow-downs
  // count from `start`.
  ServerPace(const ServerProfileConfig* profile, Clock& clock,
             absl::Time start);

  // Where some table work began: the clock's time, this thread's CPU time.
  struct Work {
    absl::Time began;
    absl::Duration cpu_began;
  };
  Work Begin() const;

  // Sleeps the emulated extra time of the work since `work` (on this
  // thread) and returns its service time.
  absl::Duration Pace(const Work& work);

  // The same for work that took `wall` on the clock, `cpu` of it on the CPU:
  // sleeps cpu · (1 / speed − 1) and returns wall plus that (`wall` alone
  // without a profile).
  absl::Duration Pace(absl::Duration wall, absl::Duration cpu);

  // The speed now: the profile's times its active slow-downs (1: none).
  double Speed(absl::Time now) const;

  // "emulated server: 50% speed, ..." or "real machine (not emulated)".
  std::string Describe() const;

 private:
  const ServerProfileConfig* const profile_;
  Clock& clock_;
  const absl::Time start_;
  absl::Mutex mu_;
  absl::Time busy_until_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
};

}  // namespace hetps
