#!/usr/bin/env bash
# The whole test suite: installs what is missing, builds, runs every CTest
# test (the Python module's pytest files among them, label "python"), builds
# again with clang under AddressSanitizer + UBSan, the libFuzzer targets
# included, runs each of them for 60 s (scripts/fuzz.sh) and the tests
# again, then builds under ThreadSanitizer and runs the tests a third time.
# Both clang builds also check the lock annotations (-Wthread-safety as
# errors).
set -euo pipefail
cd "$(dirname "$0")/.."
# Each step prints what it took, so a CI log shows where the time goes.
step_began=$SECONDS
took() {
  echo "[test.sh] $1 took $((SECONDS - step_began)) s (total $SECONDS s)"
  step_began=$SECONDS
}
scripts/deps.sh
took packages
scripts/build.sh build
took "release build"
# Two tests at a time; those that judge timings run alone (RUN_SERIAL).
(cd build && ctest -j2 --output-on-failure --timeout 600)
took "release tests"
# One sanitized tree for the ASan tests and the fuzz targets: the fuzzers'
# coverage feedback costs the tests less than a tree of their own would.
scripts/build.sh build-asan -DCMAKE_CXX_COMPILER=clang++ -DHETPS_SANITIZE=ON \
  -DHETPS_FUZZ=ON -DHETPS_BUILD_BENCH=OFF
took "ASan build (the fuzz targets too)"
scripts/fuzz.sh 60 build-asan
took "fuzz run"
export ASAN_OPTIONS=detect_leaks=1:abort_on_error=1
export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
# The sanitizer builds have no Python module (a plain python3 cannot load
# sanitized libraries), so the pytest files run in the release pass only, as
# do the tests labelled "quality" (they judge a model's quality or a run's
# timings) and "integration" (their point is an outside tool: Chromium,
# Prometheus, mpirun, network namespaces); tests/CMakeLists.txt says why.
(cd build-asan && ctest -j2 --output-on-failure --timeout 900 \
  -LE "quality|integration")
took "ASan tests"
# ThreadSanitizer: Debian's abseil and gRPC are not built with it, so
# tests/support/tsan_absl.cc shows abseil's Mutex to TSan, only accesses
# made by our code are judged (ignore_noninstrumented_modules), and
# tests/tsan.supp leaves out the one report about gRPC's own hand-over.
scripts/build.sh build-tsan -DCMAKE_CXX_COMPILER=clang++ -DHETPS_TSAN=ON \
  -DHETPS_BUILD_BENCH=OFF
took "TSan build"
export TSAN_OPTIONS="ignore_noninstrumented_modules=1 halt_on_error=1"
TSAN_OPTIONS+=" suppressions=$PWD/tests/tsan.supp"
(cd build-tsan && ctest -j2 --output-on-failure --timeout 900 \
  -LE "quality|integration")
took "TSan tests"
