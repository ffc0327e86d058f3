// Keeps glibc from returning every large buffer to the OS. Requests and
// replies of a few hundred KB to many MB are allocated and freed on every
// call; by default glibc maps and unmaps each one and faults its pages in
// again on the next call (measured: 2x slower at 1M keys; a 10k x 8 push
// from Python 0.9 ms instead of 0.6, docs/BENCHMARKS.md). Called first
// thing by every hetps process (the CLI, the benchmarks) and by the Python
// module when it is imported.
#pragma once

#include <malloc.h>

namespace hetps {

inline void TuneMalloc() {
  mallopt(M_MMAP_THRESHOLD, 1 << 30);
  mallopt(M_TRIM_THRESHOLD, 1 << 30);
}

}  // namespace hetps
