#include "server/server_pace.h"

#include <algorithm>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace hetps {

ServerPace::ServerPace(const ServerProfileConfig* profile, Clock& clock,
                       absl::Time start)
    : profile_(profile), clock_(clock), start_(start) {}

double ServerPace::Speed(absl::Time now) const {
  if (!profile_) return 1;
  return profile_->speed *
         SlowdownFactorAt(profile_->slowdowns,
                          absl::ToDoubleSeconds(now - start_));
}

ServerPace::Work ServerPace::Begin() const {
  return {clock_.Now(), profile_ ? ThreadCpuTime() : absl::ZeroDuration()};
}

absl::Duration ServerPace::Pace(const Work& work) {
  const absl::Duration wall = clock_.Now() - work.began;
  if (!profile_) return wall;
  return Pace(wall, ThreadCpuTime() - work.cpu_began);
}

absl::Duration ServerPace::Pace(absl::Duration wall, absl::Duration cpu) {
  if (!profile_) return wall;
  const absl::Time now = clock_.Now();
  const double speed = Speed(now);
  if (speed >= 1) return wall;
  const absl::Duration extra = cpu * (1 / speed - 1);
  absl::Time until;
  {
    absl::MutexLock lock(&mu_);
    busy_until_ = std::max(busy_until_, now) + extra;
    until = busy_until_;
  }
  clock_.SleepUntil(until);
  return wall + extra;
}

std::string ServerPace::Describe() const {
  if (!profile_) return "real machine (not emulated)";
  std::string out =
      absl::StrFormat("emulated server: %.0f%% speed", 100 * profile_->speed);
  for (const SlowdownConfig& d : profile_->slowdowns) {
    absl::StrAppend(&out, absl::StrFormat(", x%.2f from %.0f s to %.0f s",
                                          d.factor, d.from_s, d.to_s));
  }
  return out;
}

}  // namespace hetps
