// The only file of src/ that reads the machine's clocks.
#include "common/clock.h"

#include <time.h>

namespace hetps {
namespace {

class RealClock final : public Clock {
 public:
  absl::Time Now() const override {
    return absl::UnixEpoch() +
           absl::FromChrono(
               std::chrono::steady_clock::now().time_since_epoch());
  }

  absl::Time WallNow() const override { return absl::Now(); }

  void SleepFor(absl::Duration d) override {
    if (d > absl::ZeroDuration()) absl::SleepFor(d);
  }

  bool WaitUntil(absl::CondVar& cv, absl::Mutex& mu,
                 absl::Time deadline) override {
    const absl::Duration left = deadline - Now();
    if (left <= absl::ZeroDuration()) return true;
    // A relative timeout: the condition variable measures it on the
    // monotonic clock, so the wall clock cannot cut or stretch it.
    cv.WaitWithTimeout(&mu, left);
    return Now() >= deadline;
  }
};

}  // namespace

Clock& Clock::Real() {
  static RealClock* clock = new RealClock();  // stateless; never destroyed
  return *clock;
}

std::chrono::system_clock::time_point RpcDeadline(const Clock& clock,
                                                  double seconds) {
  return absl::ToChronoTime(clock.WallNow() + absl::Seconds(seconds));
}

double ProcessCpuSeconds() {
  timespec cpu{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &cpu);
  return static_cast<double>(cpu.tv_sec) + cpu.tv_nsec * 1e-9;
}

absl::Duration ThreadCpuTime() {
  timespec cpu{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &cpu);
  return absl::DurationFromTimespec(cpu);
}

}  // namespace hetps
