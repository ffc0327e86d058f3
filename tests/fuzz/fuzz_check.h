// FUZZ_CHECK: an invariant of the code under test. A failure prints the
// condition and aborts, which libFuzzer reports as a crash and saves the
// input. Only for the fuzz targets; library code never aborts on peer input.
#pragma once

#include <cstdio>
#include <cstdlib>

#define FUZZ_CHECK(cond)                                              \
  do {                                                                \
    if (!(cond)) {                                                    \
      std::fprintf(stderr, "%s:%d: invariant failed: %s\n", __FILE__, \
                   __LINE__, #cond);                                  \
      std::abort();                                                   \
    }                                                                 \
  } while (0)
