#!/usr/bin/env bash
# Emulates a bottleneck network for benchmarks: a network namespace whose loopback is shaped by
# a token-bucket filter. Traffic stays on that namespace's own loopback. Needs root.
# Note [A link without free bursts]: a NIC never sends faster than its line rate, so the bucket
# holds half a millisecond of it (64 KiB at 1 Gbit/s, BURST overrides) and the loopback's MTU is
# cut to jumbo Ethernet's 9000 bytes, which a bucket that small needs (tbf drops any packet
# larger than its bucket; loopback's own MTU is 64 KiB). With the fixed 512 KiB bucket used
# before, every block sent after an idle gap left at memory speed for its first 512 KiB:
# 256 KiB all-reduces between compute gaps ran at 1.5x the link (190 against 125 MB/s at
# 1 Gbit/s), a speed-up no real link gives and that the affine cost model of the planners and
# the simulator cannot represent. Measured with this shaping, 2 ranks: torch's Gloo all-reduce
# of 256 KiB to 16 MiB at 121-125 MB/s at 1 Gbit/s, Horovod's of 16 MiB at 97% of the link at
# 1 and 2 Gbit/s. A smaller bucket (32 KiB at 2 Gbit/s) starved Horovod's transfers (82%).
set -euo pipefail
NETNS="${NETNS:-csnet}"
cmd="${1:-}"; shift || true

# Half a millisecond of line rate in KiB (RATE as tc writes it: 1gbit, 2500mbit), at least 16 KiB.
bucket_for() {
  local rate="$1" kbit
  case "$rate" in
    *gbit) kbit=$(( ${rate%gbit} * 1000000 )) ;;
    *mbit) kbit=$(( ${rate%mbit} * 1000 )) ;;
    *) echo "netem: RATE must be <N>gbit or <N>mbit, got $rate (or set BURST)" >&2; exit 2 ;;
  esac
  local kib=$(( kbit / 16 / 1024 ))  # kbit/s / 16 = bytes per half millisecond
  echo "$(( kib < 16 ? 16 : kib ))kb"
}
case "$cmd" in
  up)
    rate="${1:-1gbit}"
    burst="${BURST:-$(bucket_for "$rate")}"
    ip netns list | grep -qw "$NETNS" || ip netns add "$NETNS"
    ip -n "$NETNS" link set lo mtu 9000 up
    ip netns exec "$NETNS" tc qdisc replace dev lo root tbf rate "$rate" burst "$burst" latency 100ms
    echo "netem: namespace $NETNS, loopback shaped to $rate (MTU 9000, bucket $burst)" >&2 ;;
  run) exec ip netns exec "$NETNS" "$@" ;;
  show) ip netns exec "$NETNS" tc qdisc show dev lo ;;
  down) ip netns delete "$NETNS" 2>/dev/null || true ;;
  *) echo "usage: $0 up [RATE] | run CMD... | show | down" >&2; exit 2 ;;
esac
