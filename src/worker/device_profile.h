// DeviceProfile: makes this worker behave like the machine its device profile
// describes (DESIGN.md), so a mixed cluster can be reproduced on one
// computer. Every log line and report of an emulated worker says so.
//
//  - Speed: a batch of n samples takes at least n / (throughput · factor(t))
//    seconds; Pace() sleeps off what the real computation left over. The
//    factor is 1 except inside a slow-down window of the profile (t counts
//    from the start of training).
//  - Memory: a batch whose BytesPerSample estimate exceeds memory_mb fails
//    with RESOURCE_EXHAUSTED, as an out-of-memory would.
//  - Link: a transfer of b bytes takes at least b · 8 / bandwidth_mbps µs;
//    Throttle() sleeps off the rest.
// Without a profile every call is free and nothing is emulated.
#pragma once

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "common/clock.h"
#include "hetps/config.h"

namespace hetps {

class DeviceProfile {
 public:
  // `profile` may be nullptr (a real machine). `bytes_per_sample`:
  // JobShape::bytes_per_sample. Slow-downs count from `start` on `clock`,
  // which also does the sleeping.
  DeviceProfile(const DeviceProfileConfig* profile, uint64_t bytes_per_sample,
                Clock& clock, absl::Time start);

  bool emulated() const { return profile_ != nullptr; }
  double memory_mb() const { return profile_ ? profile_->memory_mb : 0; }
  // One line for the log: "emulated: 300 samples/s, 512 MB, 100 Mbit/s".
  std::string Describe() const;

  // RESOURCE_EXHAUSTED when a batch of `samples` does not fit.
  absl::Status CheckMemory(uint64_t samples) const;

  // The speed factor at `now` (1 outside slow-downs).
  double SpeedFactor(absl::Time now) const;

  // Sleeps until a batch of `samples` begun at `began` has taken as long as
  // this device would take.
  void Pace(uint64_t samples, absl::Time began) const;

  // Sleeps until a transfer of `bytes` begun at `began` has taken as long as
  // this device's link would take.
  void Throttle(uint64_t bytes, absl::Time began) const;

 private:
  const DeviceProfileConfig* profile_;
  const uint64_t bytes_per_sample_;
  Clock& clock_;
  const absl::Time start_;
};

}  // namespace hetps
