#!/usr/bin/env bash
# Set-up if needed, then the main job: 2 ranks under horovodrun train a built-in model on
# synthetic data with hvd.DistributedOptimizer, PyTorch DDP and every commsched policy (and
# `auto`), side by side, and print median iteration times and ratios: first on the plain
# loopback, then, where a network namespace can be made (root with `ip` and `tc`), on a loopback
# shaped to ${RATE:-1gbit}. Arguments go to commsched.bench.compare (e.g. --model transformer).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
"$ROOT/scripts/setup.sh"
cd "$ROOT"
export OMP_NUM_THREADS=1 PYTHONWARNINGS="ignore::UserWarning"
RATE="${RATE:-1gbit}"
CANDIDATES="${CANDIDATES:-local (no comm),hvd,torch-ddp,commsched:horovod,commsched:ddp,commsched:mgwfbp,commsched:bytescheduler,commsched:prophet,commsched:dear?fusion_threshold=4MiB,commsched:auto}"
compare() {
  "$@" "$ROOT/.venv/bin/horovodrun" -np "${NP:-2}" --gloo "$ROOT/.venv/bin/python" \
    -m commsched.bench.compare --candidates "$CANDIDATES" "${ARGS[@]}" 2>&1 \
    | grep '\[0\]<stdout>' | sed 's/^\[0\]<stdout>://'
}
ARGS=("$@")

echo "== 1. Unshaped loopback: communication is cheap, there is little to hide. Every policy"
echo "==    should cost about what hvd costs (the scheduler's own work is all that differs)."
compare env
echo
echo "Columns: median/p10/p90 ms of an iteration (the slowest rank's); vs hvd, vs torch-ddp: that"
echo "median over theirs; vs bound: over max(compute alone, one all-reduce of every gradient);"
echo "payload MB/iter: what one rank hands its collectives (dear's reduce-scatter its whole buffer,"
echo "its all-gather only its own share, so 1.5x an all-reduce's); sent MB/iter: what it sends on"
echo "a ring (about the same for every policy)."

why=""
if [ "$(id -u)" != 0 ]; then why="it needs root (network namespaces and tc)"
elif ! command -v ip >/dev/null || ! command -v tc >/dev/null; then why="'ip' and 'tc' (iproute2) are not installed"
fi
if [ -n "$why" ]; then
  echo
  echo "demo: the shaped-network table is skipped: $why. Run as root with iproute2 to see where"
  echo "      scheduling wins (scripts/netem.sh shapes a private loopback)."
  exit 0
fi
trap '"$ROOT/scripts/netem.sh" down' EXIT
"$ROOT/scripts/netem.sh" up "$RATE"
echo
echo "== 2. Loopback shaped to $RATE: the network is the bottleneck. Here scheduling hides"
echo "==    communication behind computation: compare each policy with hvd and the bound."
compare "$ROOT/scripts/netem.sh" run
