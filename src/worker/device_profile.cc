#include "worker/device_profile.h"

#include <algorithm>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace hetps {

DeviceProfile::DeviceProfile(const DeviceProfileConfig* profile,
                             uint64_t bytes_per_sample, Clock& clock,
                             absl::Time start)
    : profile_(profile),
      bytes_per_sample_(bytes_per_sample),
      clock_(clock),
      start_(start) {}

std::string DeviceProfile::Describe() const {
  if (!profile_) return "real machine (not emulated)";
  std::string out = "emulated device:";
  absl::StrAppend(&out,
                  profile_->throughput > 0
                      ? absl::StrFormat(" %.0f samples/s", profile_->throughput)
                      : " full speed");
  if (profile_->memory_mb > 0) {
    absl::StrAppend(&out, absl::StrFormat(", %.0f MB", profile_->memory_mb));
  }
  if (profile_->bandwidth_mbps > 0) {
    absl::StrAppend(&out,
                    absl::StrFormat(", %.0f Mbit/s", profile_->bandwidth_mbps));
  }
  for (const SlowdownConfig& d : profile_->slowdowns) {
    absl::StrAppend(&out,
                    absl::StrFormat(", %.0f%% speed from %.0f s to %.0f s",
                                    100 * d.factor, d.from_s, d.to_s));
  }
  return out;
}

absl::Status DeviceProfile::CheckMemory(uint64_t samples) const {
  if (!profile_ || profile_->memory_mb <= 0) return absl::OkStatus();
  const double need_mb =
      static_cast<double>(samples * bytes_per_sample_) / (1024.0 * 1024.0);
  if (need_mb <= profile_->memory_mb) return absl::OkStatus();
  return absl::ResourceExhaustedError(absl::StrFormat(
      "emulated out of memory: a batch of %d samples needs %.1f MB, the "
      "emulated device has %.0f MB (device_profiles memory_mb)",
      samples, need_mb, profile_->memory_mb));
}

double DeviceProfile::SpeedFactor(absl::Time now) const {
  if (!profile_) return 1;
  return SlowdownFactorAt(profile_->slowdowns,
                          absl::ToDoubleSeconds(now - start_));
}

void DeviceProfile::Pace(uint64_t samples, absl::Time began) const {
  if (!profile_ || profile_->throughput <= 0) return;
  const double seconds = static_cast<double>(samples) /
                         (profile_->throughput * SpeedFactor(began));
  clock_.SleepUntil(began + absl::Seconds(seconds));
}

void DeviceProfile::Throttle(uint64_t bytes, absl::Time began) const {
  if (!profile_ || profile_->bandwidth_mbps <= 0) return;
  const double seconds =
      static_cast<double>(bytes) * 8 / (profile_->bandwidth_mbps * 1e6);
  clock_.SleepUntil(began + absl::Seconds(seconds));
}

}  // namespace hetps
