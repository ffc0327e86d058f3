#!/usr/bin/env bash
# The whole test suite: installs what is missing, builds, runs every CTest
# test, runs each libFuzzer target for 60 s (scripts/fuzz.sh), then builds
# again with AddressSanitizer + UBSan and runs the tests again.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/deps.sh
scripts/build.sh build
# Unit tests two at a time; cluster tests are RUN_SERIAL (they time things).
(cd build && ctest -j2 --output-on-failure --timeout 600)
scripts/fuzz.sh 60
scripts/build.sh build-asan -DHETPS_SANITIZE=ON -DHETPS_BUILD_BENCH=OFF
export ASAN_OPTIONS=detect_leaks=1:abort_on_error=1
export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
# The tests that judge a model's quality (AUC against a bar or another run)
# run in the release pass only: under the sanitizers they take 3.5 minutes.
# Their code runs sanitized elsewhere: models in the gradient-check unit
# tests, codecs and error feedback in their unit tests and push_fuzzer, the
# trainer in every other cluster test.
quality='DeepFmComesCloseToTheTeacherOnGeneratedCriteo|OverCompressionIsFlagged'
quality+='|Int8WithErrorFeedbackSendsFewerBytesAtTheSameAuc'
quality+='|MovieLensDeepFmReachesTheAucBarInOneEpoch'
quality+='|OneAndFourSyncWorkersReachTheSameAuc'
(cd build-asan && ctest -j2 --output-on-failure --timeout 900 -E "$quality")
