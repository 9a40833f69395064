#!/usr/bin/env bash
# K-FAC speed benchmark (issue: SPD-KFAC): 2 ranks inside a network namespace whose loopback is
# shaped to RATE, the built-in CNN, factors and decompositions refreshed every step. Pipelined +
# fused + lpt against unpipelined + round_robin (and the two mixed variants), side by side in one
# horovodrun job. Writes benchmarks/kfac_speed/results.{json,md,png} and README.md.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
scripts/setup.sh
RATE="${RATE:-1gbit}"
OUT="${OUT:-benchmarks/kfac_speed}"
export NETNS="${NETNS:-cskfac}"
trap 'scripts/netem.sh down' EXIT
export OMP_NUM_THREADS=1 PYTHONWARNINGS="ignore::UserWarning,ignore::FutureWarning"
scripts/netem.sh up "$RATE"
scripts/netem.sh run .venv/bin/horovodrun -np 2 --gloo .venv/bin/python -m commsched.bench.kfac_speed \
  --batch-size 64 --warmup 8 --rounds 3 --steps 5 --link-note "loopback shaped to $RATE" \
  --out "$OUT" 2>&1 | grep '\[0\]<stdout>' | sed 's/^\[0\]<stdout>://'
{
  echo "# K-FAC speed: pipelined + fused + lpt against unpipelined + round_robin"
  echo
  echo "Script: \`RATE=$RATE scripts/bench_kfac_speed.sh\` (one horovodrun job in a namespace whose loopback is shaped to $RATE; variants interleaved round by round; iteration time = time between the slowest rank's consecutive step completions)."
  echo
  cat "$OUT/results.md"
  echo
  echo "![results](results.png)"
} > "$OUT/README.md"
echo "bench_kfac_speed: wrote $OUT/README.md" >&2
