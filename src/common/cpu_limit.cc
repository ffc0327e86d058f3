#include "common/cpu_limit.h"

#include <sched.h>

#include <algorithm>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace hetps {
namespace {

// `nr_periods` and `nr_throttled` of a cgroup's cpu.stat (the same names
// in v1 and v2).
void ReadThrottling(const std::string& dir, CpuLimit* limit) {
  std::ifstream stat(dir + "/cpu.stat");
  std::string name;
  uint64_t value = 0;
  while (stat >> name >> value) {
    if (name == "nr_periods") limit->periods = value;
    if (name == "nr_throttled") limit->throttled = value;
  }
}

}  // namespace

CpuLimit ReadCpuLimit() {
  CpuLimit limit;
  cpu_set_t set;
  CPU_ZERO(&set);
  limit.cpus = sched_getaffinity(0, sizeof(set), &set) == 0
                   ? CPU_COUNT(&set)
                   : std::thread::hardware_concurrency();
  std::ifstream groups("/proc/self/cgroup");
  std::string line;
  while (std::getline(groups, line)) {
    // hierarchy:controllers:path; v2 is "0::path".
    const std::vector<std::string> f =
        absl::StrSplit(line, absl::MaxSplits(':', 2));
    if (f.size() != 3) continue;
    std::string dir;
    double quota = -1, period = 0;
    if (f[1].empty()) {
      dir = "/sys/fs/cgroup" + f[2];
      std::ifstream max(dir + "/cpu.max");
      std::string q;
      if (max >> q >> period && q != "max") quota = std::stod(q);
    } else if (absl::StrContains(absl::StrCat(",", f[1], ","), ",cpu,")) {
      dir = "/sys/fs/cgroup/" + f[1] + f[2];
      std::ifstream q(dir + "/cpu.cfs_quota_us");
      std::ifstream p(dir + "/cpu.cfs_period_us");
      if (!(q >> quota && p >> period)) quota = -1;
    }
    if (quota > 0 && period > 0) {
      limit.cpus = std::min(limit.cpus, quota / period);
      ReadThrottling(dir, &limit);
    }
  }
  return limit;
}

}  // namespace hetps
