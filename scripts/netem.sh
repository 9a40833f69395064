#!/usr/bin/env bash
# Emulates a bottleneck network for benchmarks: a network namespace whose loopback is shaped by
# a token-bucket filter. Traffic stays on that namespace's own loopback. Needs root.
#   scripts/netem.sh up [RATE]   create namespace $NETNS (default csnet), shape lo to RATE (1gbit)
#   scripts/netem.sh run CMD...  run CMD inside the namespace
#   scripts/netem.sh show        print the qdisc
#   scripts/netem.sh down        delete the namespace
set -euo pipefail
NETNS="${NETNS:-csnet}"
cmd="${1:-}"; shift || true
case "$cmd" in
  up)
    rate="${1:-1gbit}"
    ip netns list | grep -qw "$NETNS" || ip netns add "$NETNS"
    ip -n "$NETNS" link set lo up
    ip netns exec "$NETNS" tc qdisc replace dev lo root tbf rate "$rate" burst 512kb latency 100ms
    echo "netem: namespace $NETNS, loopback shaped to $rate" >&2 ;;
  run) exec ip netns exec "$NETNS" "$@" ;;
  show) ip netns exec "$NETNS" tc qdisc show dev lo ;;
  down) ip netns delete "$NETNS" 2>/dev/null || true ;;
  *) echo "usage: $0 up [RATE] | run CMD... | show | down" >&2; exit 2 ;;
esac
