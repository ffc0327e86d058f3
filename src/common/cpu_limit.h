// The CPU this process may use, for the saturation diagnostic
// (src/coord/diagnostics.h): its affinity mask (`taskset`, a cpuset),
// lowered to its cgroup's CPU quota where one is set (a container's CPU
// limit), and how often that quota ran out.
#pragma once

#include <cstdint>

namespace hetps {

struct CpuLimit {
  double cpus = 0;         // CPUs it may use (a quota may make it fractional)
  uint64_t periods = 0;    // the quota's enforcement periods so far (0: none)
  uint64_t throttled = 0;  // of those, periods in which the quota ran out
};

// Reads /proc/self/cgroup and the cgroup's files (v2 `cpu.max`,
// `cpu.stat`; v1 `cpu.cfs_quota_us`, `cpu.cfs_period_us`, `cpu.stat`) now:
// the process's own cgroup only, not its parents'.
CpuLimit ReadCpuLimit();

}  // namespace hetps
