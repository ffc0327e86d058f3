#!/usr/bin/env bash
# issue 15: real link faults in one sync job (DeepFM on MovieLens, 2 epochs,
# 2 servers and 4 workers on test hosts of their own, every worker an
# emulated device at 2000 samples/s, server.heartbeat_timeout_s 4):
#  1. worker 1's link down for 3 s: it resumes, nobody drops it;
#  2. worker 2's link down until the coordinator dropped it: when the link
#     is back it rejoins by itself (a new incarnation) and trains on;
#  3. server 1's link down for 6 s, longer than the heartbeat timeout: the
#     workers wait and retry (client.connect_deadline_s is 30 s) and go on.
# Passes when every role exits cleanly, each sample of each epoch is in
# exactly one finished chunk, worker 2 (only) rejoined once, and the final
# test AUC meets the 2-epoch bar of the main job on loopback (0.785).
# Exit 77 (CTest: skipped) with the reason where namespaces cannot be made.
#
#   tests/netns/link_faults_test.sh build/hetps
set -euo pipefail
hetps=$(realpath "${1:?usage: link_faults_test.sh path/to/hetps}")
# shellcheck source=tests/netns/job.sh
source "$(dirname "$0")/job.sh"
job_setup

hosts_up "$run" s0 s1 w0 w1 w2 w3
config=(--config "$root/examples/movielens.yaml"
  --set server.heartbeat_timeout_s=4 --set client.heartbeat_interval_s=0.25
  --set "device_profiles=[{ranks: [0, 1, 2, 3], throughput: 2000}]"
  --set "cluster.ps_endpoints=$(hosts_addr "$run" s0):7100,$(hosts_addr "$run" s1):7100")
job_start_servers 2
job_start_workers 4
step_of() { "$python" -c "import json; print(next(w['step'] for w in json.load(open('$out/$1.json'))['workers'] if w['rank'] == $2))"; }

job_await "all(w[r]['step'] >= 30 for r in range(4))" 60
echo "1. worker 1's link down for 3 s"
hosts_link "$run" w1 down
sleep 3
hosts_link "$run" w1 up
job_await "w[1]['live']" 5 back1
step=$(step_of back1 1)
job_await "w[1]['step'] >= $step + 20" 30

echo "2. worker 2's link down until it is dropped"
hosts_link "$run" w2 down
job_await "not w[2]['live']" 30
hosts_link "$run" w2 up
job_await "w[2]['live']" 30 back2
step=$(step_of back2 2)
job_await "w[2]['live'] and w[2]['step'] >= $step + 20" 30

echo "3. server 1's link down for 6 s"
hosts_link "$run" s1 down
sleep 6
hosts_link "$run" s1 up
# The job's record before the servers stop: every worker gone, having
# finished its data.
job_await "all(not x['live'] and x['left_reason'] == 'finished its data' for x in s['workers'])" 120 end
job_finish

for r in 0 1 2 3; do job_report $r >"$out/report$r.json"; done
"$python" - "$out" <<'PY'
import json, sys
out = sys.argv[1]
end = json.load(open(f"{out}/end.json"))
reports = [json.load(open(f"{out}/report{r}.json")) for r in range(4)]
auc = reports[0]["test_auc"]
rejoins = [r["rejoins"] for r in reports]
print("test AUC %.4f, finished samples %d, rejoins per worker %s, "
      "discarded pushes %s" % (auc, end["finished_samples"], rejoins,
                               [r["discarded_pushes"] for r in reports]))
# ml-latest-small's train split (test_fraction 0.1, split_seed 1) holds
# 90772 ratings: two epochs, each rating in exactly one finished chunk.
if end["finished_samples"] != 2 * 90772:
    sys.exit("FAIL: %d samples in finished chunks, not 2 x 90772"
             % end["finished_samples"])
if rejoins != [0, 0, 1, 0]:
    sys.exit("FAIL: rejoins %s, expected worker 2's only" % rejoins)
if auc < 0.785:
    sys.exit("FAIL: test AUC %.4f below the bar 0.785" % auc)
PY
echo "PASS"
