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

absl::Duration ServerPace::Pace(absl::Duration work) {
  if (!profile_) return work;
  const absl::Time now = clock_.Now();
  const double speed = Speed(now);
  if (speed >= 1) return work;
  const absl::Duration extra = work * (1 / speed - 1);
  absl::Time until;
  {
    absl::MutexLock lock(&mu_);
    busy_until_ = std::max(busy_until_, now) + extra;
    until = busy_until_;
  }
  clock_.SleepUntil(until);
  return work + extra;
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
