#!/usr/bin/env bash
# issue 15: one mpirun command starts the main job (DeepFM on MovieLens, 1
# epoch): 6 ranks of `hetps run`, ranks 0-1 the servers, 2-5 the workers,
# meeting at a rendezvous on this machine. Passes when mpirun exits 0 (so
# the servers stopped by themselves once every worker was done), all four
# workers reported, and rank 0's final test AUC meets the loopback bar
# (0.785, TrainingTest.MovieLensDeepFmReachesTheAucBarInOneEpoch).
#
#   tests/launchers/mpirun_test.sh build/hetps
set -euo pipefail
hetps=$(realpath "${1:?usage: mpirun_test.sh path/to/hetps}")
root=$(cd "$(dirname "$0")/../.." && pwd)
python=/usr/bin/python3
command -v mpirun >/dev/null ||
  { echo "FAIL: no mpirun (scripts/deps.sh installs openmpi-bin)"; exit 1; }
out=$(mktemp -d /tmp/hetps-mpirun.XXXXXX)
trap 'rm -rf "$out"' EXIT
port=$("$python" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')

# Each rank's output also goes to a file of its own: mpirun forwards the
# ranks' output in pieces of at most 1 KiB, so a long line (a worker's
# report) can be cut by another rank's in the merged log.
if ! timeout 240 mpirun --allow-run-as-root --oversubscribe -np 6 \
  --output-filename "$out/ranks" \
  "$hetps" run "$root/examples/movielens.yaml" --set train.epochs=1 \
  --set "cluster.rendezvous=127.0.0.1:$port" >"$out/mpirun.log" 2>&1; then
  tail -40 "$out/mpirun.log"
  echo "FAIL: mpirun exited non-zero"
  exit 1
fi
cat "$out"/ranks/*/rank.*/std* >"$out/by-rank.log"
grep -c 'every worker is done: stopping' "$out/by-rank.log" |
  grep -qx 2 || { tail -20 "$out/mpirun.log"; echo "FAIL: servers did not stop by themselves"; exit 1; }
grep -h -o 'HETPS_REPORT .*' "$out"/ranks/*/rank.*/stdout | cut -d' ' -f2- | "$python" -c '
import json, sys
reports = {r["rank"]: r for r in map(json.loads, sys.stdin)}
print("reports from workers %s, test AUC %.4f"
      % (sorted(reports), reports.get(0, {}).get("test_auc", 0)))
if sorted(reports) != [0, 1, 2, 3]:
    sys.exit("FAIL: expected reports from workers 0-3")
if reports[0]["test_auc"] < 0.785:
    sys.exit("FAIL: test AUC below the loopback bar 0.785")
'
echo "PASS"
