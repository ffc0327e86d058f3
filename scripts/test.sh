#!/usr/bin/env bash
# The whole test suite: installs what is missing, builds, runs every CTest
# test, runs each libFuzzer target for 60 s (scripts/fuzz.sh), then builds
# again with AddressSanitizer + UBSan and runs the tests again.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/deps.sh
scripts/build.sh build
(cd build && ctest --output-on-failure --timeout 600)
scripts/fuzz.sh 60
scripts/build.sh build-asan -DHETPS_SANITIZE=ON -DHETPS_BUILD_BENCH=OFF
export ASAN_OPTIONS=detect_leaks=1:abort_on_error=1
export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
# The DeepFM quality test (a model's AUC after 2M samples) runs in the
# release pass only: under ASan it takes 140 s and covers no code the
# shorter training tests do not.
(cd build-asan && ctest --output-on-failure --timeout 900 \
  -E 'DeepFmComesCloseToTheTeacherOnGeneratedCriteo')
