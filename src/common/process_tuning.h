// What every hetps process sets first thing: the CLI, the benchmarks, and
// the Python module when it is imported.
//
//  - glibc keeps large buffers instead of returning each to the OS.
//    Requests and replies of a few hundred KB to many MB are allocated and
//    freed on every call; by default glibc maps and unmaps each one and
//    faults its pages in again on the next call (measured: 2x slower at 1M
//    keys; a 10k x 8 push from Python 0.9 ms instead of 0.6,
//    docs/BENCHMARKS.md).
//  - abseil's mutex deadlock detection is off in optimized builds. Debian's
//    abseil is built with it on: every Lock then records the lock order in
//    one graph behind a process-wide spin lock (measured: 94 ns instead of
//    35 for a nested pair of uncontended locks; a few percent of a server's
//    CPU with hundreds of workers). Builds without NDEBUG keep it.
#pragma once

#include <malloc.h>

#include "absl/synchronization/mutex.h"

namespace hetps {

inline void TuneProcess() {
  mallopt(M_MMAP_THRESHOLD, 1 << 30);
  mallopt(M_TRIM_THRESHOLD, 1 << 30);
#ifdef NDEBUG
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
#endif
}

}  // namespace hetps
