#!/usr/bin/env bash
# The whole test suite: installs what is missing, builds, runs every CTest
# test (the Python module's pytest files among them, label "python"), builds
# again with clang under AddressSanitizer + UBSan, the libFuzzer targets
# included, runs each of them for 60 s (scripts/fuzz.sh) and the tests
# again, then builds under ThreadSanitizer and runs the tests a third time.
# Both clang builds also check the lock annotations (-Wthread-safety as
# errors). Each sanitizer tree builds in the background, at idle priority,
# while the tests before it run.
set -euo pipefail
cd "$(dirname "$0")/.."
# Each step prints what it took, so a CI log shows where the time goes.
step_began=$SECONDS
took() {
  echo "[test.sh] $1 took $((SECONDS - step_began)) s (total $SECONDS s)"
  step_began=$SECONDS
}
# A sanitizer tree builds while the tests before it run, in the idle
# scheduling class (chrt --idle): it gets only the CPU they leave, and
# yields to them as soon as they want it. The release tests leave much: the
# ones that run alone keep 0.64 of the 2 cores busy on average (four of
# them measured). The build's output goes to DIR/build.log, shown if it
# fails; its process group is stopped if this script ends first.
background=()
trap 'for pid in "${background[@]}"; do kill -- "-$pid" 2>/dev/null; done' EXIT
build_in_background() {
  local dir=$1
  shift
  mkdir -p "$dir"
  # Its own process group (job control), in this session: a new session
  # (setsid) would be a scheduling group of its own (autogroup), which
  # shares the CPU evenly with this one whatever the class inside it.
  set -m
  chrt --idle 0 scripts/build.sh "$dir" "$@" >"$dir/build.log" 2>&1 &
  set +m
  background+=($!)
}
await_build() {
  local dir=$1 pid=$2
  if ! wait "$pid"; then
    tail -n 80 "$dir/build.log"
    echo "[test.sh] building $dir failed (the whole log: $dir/build.log)"
    exit 1
  fi
  local left=() p
  for p in "${background[@]}"; do [ "$p" = "$pid" ] || left+=("$p"); done
  background=("${left[@]}")
}
scripts/deps.sh
took packages
scripts/build.sh build
took "release build"
# One sanitized tree for the ASan tests and the fuzz targets: the fuzzers'
# coverage feedback costs the tests less than a tree of their own would.
build_in_background build-asan -DCMAKE_CXX_COMPILER=clang++ \
  -DHETPS_SANITIZE=ON -DHETPS_FUZZ=ON -DHETPS_BUILD_BENCH=OFF
asan_build=$!
# Two tests at a time; those that judge timings run alone (RUN_SERIAL).
(cd build && ctest -j2 --output-on-failure --timeout 600)
took "release tests (the ASan tree building beside them)"
await_build build-asan "$asan_build"
took "rest of the ASan build (the fuzz targets too)"
build_in_background build-tsan -DCMAKE_CXX_COMPILER=clang++ -DHETPS_TSAN=ON \
  -DHETPS_BUILD_BENCH=OFF
tsan_build=$!
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
took "ASan tests (the TSan tree building beside them)"
# ThreadSanitizer: Debian's abseil and gRPC are not built with it, so
# tests/support/tsan_absl.cc shows abseil's Mutex to TSan, only accesses
# made by our code are judged (ignore_noninstrumented_modules), and
# tests/tsan.supp leaves out the one report about gRPC's own hand-over.
await_build build-tsan "$tsan_build"
took "rest of the TSan build"
export TSAN_OPTIONS="ignore_noninstrumented_modules=1 halt_on_error=1"
TSAN_OPTIONS+=" suppressions=$PWD/tests/tsan.supp"
(cd build-tsan && ctest -j2 --output-on-failure --timeout 900 \
  -LE "quality|integration")
took "TSan tests"
