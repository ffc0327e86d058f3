#!/usr/bin/env bash
# Test hosts: network namespaces with their own addresses, joined by veth
# pairs to a bridge that lives in a namespace of its own, so nothing is
# added to the machine's own network and no packet can leave the set.
# Needs root (CAP_NET_ADMIN). Source it (tests, benchmarks) or run it:
#
#   tests/netns/hosts.sh up RUN HOST...     # HOST i gets 10.77.0.(i+1)/24
#   tests/netns/hosts.sh limit RUN HOST RATE  # tc tbf both ways, e.g. 20mbit
#   tests/netns/hosts.sh link RUN HOST up|down
#   tests/netns/hosts.sh exec RUN HOST CMD...
#   tests/netns/hosts.sh down RUN
#
# RUN names one set: its namespaces are hetps<RUN>-<HOST> and hetps<RUN>-sw
# (HOST: up to 12 characters, it also names the bridge's end of its link).
# Use the creating shell's pid ($$) as RUN, so parallel runs never share
# names and `hosts_sweep` can remove what a killed run left behind.
# Links: `tbf` limits bandwidth for real; `netem` is not available on these
# machines, so there is no delay or loss emulation (latency is a veth's).
set -euo pipefail

HOSTS_SUBNET=10.77.0

hosts_ns() { echo "hetps$1-$2"; }

# The address of HOST in RUN, read from its namespace.
hosts_addr() {
  ip -n "$(hosts_ns "$1" "$2")" -o -4 addr show dev eth0 |
    awk '{split($4, a, "/"); print a[1]}'
}

# Whether process $1 runs (a zombie nobody reaped yet does not).
hosts_alive() {
  local state
  state=$(ps -o stat= -p "$1" 2>/dev/null) && [[ $state != Z* ]]
}

# Removes the namespaces of runs whose creating process is gone, and what
# still runs inside them.
hosts_sweep() {
  local ns run
  for ns in $(ip netns list 2>/dev/null | awk '{print $1}' | grep '^hetps[0-9]*-' || true); do
    run=${ns#hetps}
    run=${run%%-*}
    if ! hosts_alive "$run"; then
      ip netns pids "$ns" 2>/dev/null | xargs -r kill -9 2>/dev/null || true
      ip netns del "$ns" 2>/dev/null || true
    fi
  done
}

# Whether namespaces can be made here; prints the reason when not.
hosts_can_run() {
  local probe="hetps$$-probe" err
  if ! command -v ip >/dev/null || ! command -v tc >/dev/null; then
    echo "the ip and tc commands (Debian iproute2) are missing"
    return 1
  fi
  if ! err=$(ip netns add "$probe" 2>&1); then
    echo "cannot create a network namespace: $err"
    return 1
  fi
  ip netns del "$probe"
}

hosts_up() {
  local run=$1
  shift
  hosts_sweep
  local sw
  sw=$(hosts_ns "$run" sw)
  ip netns add "$sw"
  ip -n "$sw" link add br0 type bridge
  ip -n "$sw" link set br0 up
  local i=0 host ns
  for host in "$@"; do
    ns=$(hosts_ns "$run" "$host")
    ip netns add "$ns"
    # Made inside the switch's namespace, the peer inside the host's: the
    # pair never exists in the machine's own namespace.
    ip -n "$sw" link add "v-$host" type veth peer name eth0 netns "$ns"
    ip -n "$sw" link set "v-$host" master br0 up
    ip -n "$ns" addr add "$HOSTS_SUBNET.$((i + 1))/24" dev eth0
    ip -n "$ns" link set eth0 up
    ip -n "$ns" link set lo up
    i=$((i + 1))
  done
}

# Both directions of HOST's link to the bridge at RATE (tc units: 20mbit).
hosts_limit() {
  local run=$1 host=$2 rate=$3
  # A burst of two full frames: a larger bucket fills while a worker
  # computes and lets its next push out at the veth's speed, so a link of
  # sporadic pushes would not look limited at all. latency bounds the queue.
  local tbf=(tbf rate "$rate" burst 3028 latency 100ms)
  ip netns exec "$(hosts_ns "$run" "$host")" \
    tc qdisc replace dev eth0 root "${tbf[@]}"
  ip netns exec "$(hosts_ns "$run" sw)" \
    tc qdisc replace dev "v-$host" root "${tbf[@]}"
}

hosts_link() {
  ip -n "$(hosts_ns "$1" "$2")" link set eth0 "$3"
}

hosts_exec() {
  local run=$1 host=$2
  shift 2
  ip netns exec "$(hosts_ns "$run" "$host")" "$@"
}

hosts_down() {
  local run=$1 ns
  for ns in $(ip netns list 2>/dev/null | awk '{print $1}' | grep "^hetps$run-" || true); do
    # Roles a failed test left running inside go first.
    ip netns pids "$ns" 2>/dev/null | xargs -r kill -9 2>/dev/null || true
    ip netns del "$ns" 2>/dev/null || true
  done
}

if [ "${BASH_SOURCE[0]}" = "$0" ]; then
  cmd=${1:?usage: hosts.sh up|limit|link|exec|down RUN ...}
  shift
  case $cmd in
    up | limit | link | exec | down | addr) "hosts_$cmd" "$@" ;;
    *)
      echo "unknown command '$cmd'" >&2
      exit 2
      ;;
  esac
fi
