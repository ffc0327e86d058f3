#!/usr/bin/env bash
# A hetps job across test hosts (hosts.sh, sourced here), for the tests
# beside it and bench/hetero/netns_bench.sh: server s<i> on host s<i>,
# worker w<i> on host w<i>, every role's output in $out/<role><i>.log.
# Sourcing sets `root` (the repository) and `run` (the hosts' RUN: the
# sourcing shell's pid); job_setup makes `out`. The script sets `hetps`
# (the binary) and `config` (the roles' arguments, an array: --config ...
# --set ..., cluster.ps_endpoints on the hosts). With HETPS_NETNS_KEEP set,
# the logs stay in $out.

# hetps and config come from the script that sources this file.
# shellcheck disable=SC2154
python=/usr/bin/python3
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
run=$$
# shellcheck source=tests/netns/hosts.sh
source "$root/tests/netns/hosts.sh"

job_fail() {
  echo "FAIL: $*"
  exit 1
}

# Skips (77) where namespaces cannot be made; makes $out and the trap
# that tears the hosts down and shows every role's last lines on failure.
job_setup() {
  local why
  if ! why=$(hosts_can_run); then
    echo "SKIP: $why"
    exit 77
  fi
  out=$(mktemp -d /tmp/hetps-netns.XXXXXX)
  trap job_cleanup EXIT
  trap 'exit 130' INT TERM
}

job_cleanup() {
  local rc=$? f
  hosts_down "$run"
  if [ $rc -ne 0 ]; then
    for f in "$out"/*.log; do
      [ -e "$f" ] || continue
      echo "---- $(basename "$f") (last 15 lines)"
      tail -15 "$f"
    done
  fi
  if [ -n "${HETPS_NETNS_KEEP:-}" ]; then
    echo "logs kept in $out"
  else
    rm -rf "$out"
  fi
}

# Starts servers 0..$1-1 and returns once each printed its listening line
# (within 30 s). `ip netns exec` becomes the role: ${servers[i]} is its pid.
job_start_servers() {
  servers=()
  local s n=0 pid
  for ((s = 0; s < $1; s++)); do
    ip netns exec "$(hosts_ns "$run" "s$s")" "$hetps" server "${config[@]}" \
      --rank $s >"$out/server$s.log" 2>&1 &
    servers+=($!)
  done
  for _ in $(seq 300); do
    n=$(cat "$out"/server*.log | grep -c '^HETPS_LISTENING' || true)
    [ "$n" -eq "$1" ] && return 0
    for pid in "${servers[@]}"; do
      kill -0 "$pid" 2>/dev/null || job_fail "a server exited before listening"
    done
    sleep 0.1
  done
  job_fail "servers did not listen within 30 s"
}

job_start_workers() {
  workers=()
  local w
  for ((w = 0; w < $1; w++)); do
    ip netns exec "$(hosts_ns "$run" "w$w")" "$hetps" worker "${config[@]}" \
      --rank $w >"$out/worker$w.log" 2>&1 &
    workers+=($!)
  done
}

# The job's status as JSON, asked from host $1 ("" while it cannot say).
job_status() {
  ip netns exec "$(hosts_ns "$run" "$1")" "$hetps" status \
    --coordinator "$(hosts_addr "$run" s0):7100" --json 2>/dev/null || true
}

# Waits (0.1 s apart, at most $2 s) until the status read from host w0
# passes the Python expression $1 over `s` (the status JSON) and `w` (its
# workers by rank), and keeps that status in $out/${3:-status}.json. Fails
# the test when time runs out.
job_await() {
  local expr=$1 limit=$2 file="$out/${3:-status}.json" s
  for _ in $(seq $((limit * 10))); do
    s=$(job_status w0)
    if [ -n "$s" ] && echo "$s" | "$python" -c "
import json, sys
s = json.load(sys.stdin)
w = {x['rank']: x for x in s.get('workers', [])}
sys.exit(0 if ($expr) else 1)" 2>/dev/null; then
      echo "$s" >"$file"
      return 0
    fi
    sleep 0.1
  done
  job_fail "waited $limit s for: $expr"
}

# Every worker exits 0, then the servers stop on SIGTERM (exit 0).
job_finish() {
  local i
  for i in "${!workers[@]}"; do
    wait "${workers[$i]}" || job_fail "worker $i exited with $?"
  done
  for i in "${!servers[@]}"; do kill -TERM "${servers[$i]}" 2>/dev/null || true; done
  for i in "${!servers[@]}"; do
    wait "${servers[$i]}" || job_fail "server $i exited with $? after SIGTERM"
  done
}

# Worker $1's report (its HETPS_REPORT line) as JSON.
job_report() {
  grep -h -o 'HETPS_REPORT .*' "$out/worker$1.log" | tail -1 | cut -d' ' -f2-
}
