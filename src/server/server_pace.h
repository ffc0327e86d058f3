// ServerPace: a server run as an emulated slower machine (server_profiles
// in the job config; DESIGN.md: DeviceProfile, for servers). After a
// request's table work of duration w, the handler sleeps the extra time the
// slower machine would need, w · (1 / speed − 1). The extra times of all
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

  // Sleeps the emulated extra time of `work` and returns the emulated
  // service time, work / speed (the work itself without a profile).
  absl::Duration Pace(absl::Duration work);

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
