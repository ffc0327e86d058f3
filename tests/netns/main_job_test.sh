#!/usr/bin/env bash
# issue 15: the main job (DeepFM on MovieLens, 1 epoch) with 2 servers and 4
# workers, each on a test host of its own (hosts.sh), worker 3 behind a
# real 10 Mbit/s link (tc tbf both ways), compress.codec adaptive. Passes
# when every role exits cleanly, rank 0's final test AUC meets the loopback
# bar (0.785, TrainingTest.MovieLensDeepFmReachesTheAucBarInOneEpoch) and
# the job's status shows worker 3's pushes compressed clearly harder than
# every other worker's. Exit 77 (CTest: skipped) with the reason where
# namespaces cannot be made.
#
#   tests/netns/main_job_test.sh build/hetps
set -euo pipefail
hetps=$(realpath "${1:?usage: main_job_test.sh path/to/hetps}")
# shellcheck source=tests/netns/job.sh
source "$(dirname "$0")/job.sh"
job_setup

hosts_up "$run" s0 s1 w0 w1 w2 w3
hosts_limit "$run" w3 10mbit
# Every worker computes a batch of 64 in ~11 ms (an emulated device at
# 6000 samples/s): a push's ~9 KB take ~0.5 ms on a veth link, within the
# adaptive budget (a quarter of the compute), and ~7.5 ms at 10 Mbit/s, well
# over it. (At 20 Mbit/s, ~4 ms, the push sat near the budget: on CI's loaded
# machine the compute stretched, the budget with it, and worker 3 compressed
# only 1.35x.)
config=(--config "$root/examples/movielens.yaml"
  --set train.epochs=1 --set compress.codec=adaptive
  --set "device_profiles=[{ranks: [0, 1, 2, 3], throughput: 6000}]"
  --set "cluster.ps_endpoints=$(hosts_addr "$run" s0):7100,$(hosts_addr "$run" s1):7100")
job_start_servers 2
job_start_workers 4
# The codecs once worker 3 has sent 1 MB of gradients as fp32 (about a
# third of its share).
job_await "w[3].get('raw_bytes', 0) > 1000000" 120
job_finish

job_report 0 | "$python" -c '
import json, sys
report = json.load(sys.stdin)
status = json.load(open(sys.argv[1]))
auc = report["test_auc"]
ratio = {w["rank"]: (w["raw_bytes"] / w["sent_bytes"], w["codec"])
         for w in status["workers"]}
print("test AUC %.4f; raw/sent per worker: %s" % (auc, ratio))
if auc < 0.785:
    sys.exit("FAIL: test AUC %.4f below the loopback bar 0.785" % auc)
# The narrow link is compressed harder over the run: its bytes shrink at
# least 1.4 times as much as any other workers (measured at 10 Mbit/s:
# alone 1.86 against <= 1.01; beside three busy loops 2.95, some int8,
# against <= 1.03). Its codec of the moment is not
# compared: its transfer sits near the budget, so single pushes may still
# go out as fp32.
others = max(r for rank, (r, _) in ratio.items() if rank != 3)
if not ratio[3][0] >= 1.4 * others:
    sys.exit("FAIL: worker 3 (10 Mbit/s) on %s, raw/sent %.2f, the others "
             "up to %.2f" % (ratio[3][1], ratio[3][0], others))
' "$out/status.json"
echo "PASS"
