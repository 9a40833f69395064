#!/usr/bin/env bash
# Collectives benchmark (issue: every policy at its paper's strength, item 3): all-reduce,
# reduce-scatter and all-gather as torch.distributed (Gloo) runs them, beside the engine's own
# ring reduce-scatter and all-gather (csrc/ring.h), 64 KiB to 64 MiB, on 2, 3 and 4 ranks. With
# root and iproute2 the ranks run inside a namespace whose loopback is shaped to RATE (default
# 1gbit: where the overlap benchmark runs DeAR); RATE=none runs on the plain loopback.
# Writes benchmarks/collectives/results.{json,md,png}, and each world size's own run in ranks<N>/.
set -euo pipefail
# shellcheck source=lib/common.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib/common.sh"
RATE="${RATE:-1gbit}"
RANKS="${RANKS:-2 3 4}"
ROUNDS="${ROUNDS:-3}"
OUT="${OUT:-benchmarks/collectives}"
trap 'scripts/netem.sh down' EXIT
prefix=()
note="plain loopback"
if [ "$RATE" != none ]; then
  scripts/netem.sh up "$RATE"
  prefix=(scripts/netem.sh run)
  note="loopback shaped to $RATE"
fi
dirs=()
for n in $RANKS; do
  "${prefix[@]}" .venv/bin/torchrun --nproc-per-node "$n" --master-port 29533 \
    -m benchmarks.harness.collectives --rounds "$ROUNDS" --out "$OUT/ranks$n" --note "$note"
  dirs+=("$OUT/ranks$n")
done
.venv/bin/python -m benchmarks.harness.collectives --out "$OUT" --note "$note" --merge "${dirs[@]}"
{
  echo "# Collectives on Gloo: torch's reduce-scatter and all-gather against the engine's ring"
  echo
  echo "Command: \`RATE=$RATE RANKS=\"$RANKS\" ROUNDS=$ROUNDS scripts/bench_collectives.sh\` ($note; float32 buffers; each figure the median over rounds of the slowest rank's mean time over 3 calls; sizes and operations interleaved within each round)."
  echo
  tail -n +3 "$OUT/results.md"
  echo
  echo "![ratios](results.png)"
} > "$OUT/README.md"
echo "bench_collectives: wrote $OUT/README.md" >&2
