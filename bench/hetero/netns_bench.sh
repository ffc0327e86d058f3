#!/usr/bin/env bash
# bench/hetero on real links: the reference cluster of bench/hetero (3
# servers, workers 0-2 at 1000 samples/s and 3-9 at 300, DeepFM on
# MovieLens, rank 0 evaluating every second) with every role on a test host
# of its own (tests/netns/hosts.sh) and real tbf links instead of emulated
# bandwidth: servers and the fast workers at FAST, the slow workers at SLOW.
# Runs sync with equal batches and semi_async (proportional batches), each
# with fp32 pushes and with compress.codec adaptive, and prints one JSON
# document: per run the final test AUC, wall time, time to the target (99.5%
# of the best final AUC of the four) and the gradient bytes sent. As root.
#
#   bench/hetero/netns_bench.sh build/hetps [FAST [SLOW [OUT.json]]]
#   bench/hetero/netns_bench.sh build/hetps 1gbit 100mbit docs/hetero-netns.json
set -euo pipefail
hetps=$(realpath "${1:?usage: netns_bench.sh path/to/hetps [FAST [SLOW [OUT]]]}")
fast=${2:-1gbit}
slow=${3:-100mbit}
result=${4:-/dev/stdout}
# shellcheck source=tests/netns/job.sh
source "$(dirname "$0")/../../tests/netns/job.sh"
job_setup

servers=(s0 s1 s2)
workers=(w0 w1 w2 w3 w4 w5 w6 w7 w8 w9)
hosts_up "$run" "${servers[@]}" "${workers[@]}"
for h in "${servers[@]}" w0 w1 w2; do hosts_limit "$run" "$h" "$fast"; done
for h in w3 w4 w5 w6 w7 w8 w9; do hosts_limit "$run" "$h" "$slow"; done
endpoints=""
for h in "${servers[@]}"; do endpoints+="${endpoints:+,}$(hosts_addr "$run" "$h"):7100"; done

runs=()
for codec in none adaptive; do
  for mode in sync_equal semi_async; do
    case $mode in
      sync_equal) sets=(--set mode=sync --set planner.batch_plan=fixed) ;;
      semi_async) sets=(--set mode=semi_async --set planner.batch_plan=proportional) ;;
    esac
    config=(--config "$root/bench/hetero/reference.yaml" "${sets[@]}"
      --set "compress.codec=$codec" --set "cluster.ps_endpoints=$endpoints")
    echo "running $mode, codec $codec (links $fast / $slow)" >&2
    job_start_servers 3
    start=$(date +%s%N)
    job_start_workers 10
    job_finish
    wall_ms=$((($(date +%s%N) - start) / 1000000))
    reports="$out/$mode-$codec.reports"
    for r in 0 1 2 3 4 5 6 7 8 9; do job_report $r; done >"$reports"
    runs+=("$mode $codec $wall_ms $reports")
  done
done

printf '%s\n' "${runs[@]}" | "$python" -c '
import json, sys
fast, slow = sys.argv[1], sys.argv[2]
runs = []
for line in sys.stdin:
    mode, codec, wall_ms, path = line.split()
    reports = [json.loads(l) for l in open(path)]
    rank0 = next(r for r in reports if r["rank"] == 0)
    curve = [(e["at_s"], e["auc"]) for e in rank0["evals"] if e["epoch"] < 0]
    runs.append({"mode": mode, "codec": codec, "wall_s": int(wall_ms) / 1000,
                 "test_auc": rank0["test_auc"], "curve": curve,
                 "gradient_bytes_sent": sum(r["sent_bytes"] for r in reports),
                 "gradient_bytes_raw": sum(r["raw_bytes"] for r in reports),
                 "sent_by_codec": [r["sent_by_codec"] for r in reports]})
target = 0.995 * max(r["test_auc"] for r in runs)
for r in runs:
    r["time_to_target_s"] = next((t for t, a in r["curve"] if a >= target),
                                 None)
print(json.dumps({"links": {"servers_and_fast_workers": fast,
                            "slow_workers": slow},
                  "target_auc": target, "runs": runs}, indent=1))
' "$fast" "$slow" >"$result"
