#!/usr/bin/env bash
# Builds the libFuzzer targets (tests/fuzz/, clang) and runs each for SECONDS
# (default 60) on a copy of its corpus in tests/fuzz/corpus/<target>/, all at
# once. Fails when any target crashes, leaks, times out or breaks an
# invariant; the input that did it is left in TREE/fuzz-run/<target>/.
#   scripts/fuzz.sh [SECONDS [TREE]]
# TREE: a build tree configured with -DHETPS_FUZZ=ON, where only the targets
# are built (scripts/test.sh passes its ASan tree); by default build-fuzz/,
# configured here with the fuzz targets alone.
set -euo pipefail
cd "$(dirname "$0")/.."
seconds="${1:-60}"
tree="${2:-}"
targets=(codec_fuzzer push_fuzzer pull_fuzzer frame_fuzzer)
jobs=4

if [ -z "$tree" ]; then
  tree=build-fuzz
  scripts/build.sh "$tree" -DHETPS_FUZZ=ON -DCMAKE_CXX_COMPILER=clang++ \
    -DHETPS_BUILD_TESTS=OFF -DHETPS_BUILD_BENCH=OFF
else
  ninja -C "$tree" -j"$(nproc)" "${targets[@]}"
fi

run_dir=$tree/fuzz-run
rm -rf "$run_dir"
export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
for t in "${targets[@]}"; do
  mkdir -p "$run_dir/$t/corpus"
  cp -r "tests/fuzz/corpus/$t/." "$run_dir/$t/corpus/"
  (
    set +e
    "$tree/tests/fuzz/$t" -max_total_time="$seconds" -timeout=10 \
      -rss_limit_mb=2048 -print_final_stats=1 \
      -artifact_prefix="$run_dir/$t/" "$run_dir/$t/corpus" \
      >"$run_dir/$t/log" 2>&1
    echo $? >"$run_dir/$t/rc"
  ) &
  while (($(jobs -rp | wc -l) >= jobs)); do wait -n || true; done
done
wait

failed=0
for t in "${targets[@]}"; do
  rc=$(cat "$run_dir/$t/rc")
  execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$run_dir/$t/log")
  rate=$(sed -n 's/.*exec\/s: \([0-9]*\).*/\1/p' "$run_dir/$t/log" | tail -1)
  if [ "$rc" -eq 0 ]; then
    echo "fuzz $t: ok, ${execs:-?} execs in ${seconds}s (${rate:-?}/s)"
  else
    failed=1
    echo "fuzz $t: FAILED (exit $rc) after ${execs:-?} execs; log $run_dir/$t/log"
    tail -n 40 "$run_dir/$t/log"
    ls "$run_dir/$t"/crash-* "$run_dir/$t"/leak-* "$run_dir/$t"/timeout-* \
      "$run_dir/$t"/oom-* 2>/dev/null || true
  fi
done
exit "$failed"
