// What every hetps process sets first thing: the CLI, the benchmarks, and
// the Python module when it is imported.
//
//  - glibc keeps large buffers instead of returning each to the OS.
//    Requests and replies of a few hundred KB to many MB are allocated and
//    freed on every call; by default glibc maps and unmaps each one and
//    faults its pages in again on the next call (measured: 2x slower at 1M
//    keys; a 10k x 8 push from Python 0.9 ms instead of 0.6,
//    docs/BENCHMARKS.md).
//  - one malloc arena for all threads. With glibc's default of one per
//    thread (up to 8 per core), a buffer freed on a gRPC thread goes back
//    to that thread's arena, whose heaps are 64 MB mappings that glibc
//    unmaps as soon as they empty, whatever M_TRIM_THRESHOLD says, and a
//    request of 64 MB or more cannot fit in one at all: every large request
//    and reply faulted its pages in again (measured: 1M keys x dim 16 pushed
//    in ~340 ms instead of ~82, pulled in ~330 instead of ~60; a 100k x 16
//    pull ~9 instead of ~7.7 ms, docs/BENCHMARKS.md section 1). Most small
//    allocations come from each thread's tcache without taking the arena's
//    lock, so the one arena is rarely contended.
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
  mallopt(M_ARENA_MAX, 1);
#ifdef NDEBUG
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
#endif
}

}  // namespace hetps
