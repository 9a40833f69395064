#!/usr/bin/env bash
# Overlap benchmark (issue: cross-iteration overlap): 2 ranks inside a network namespace whose
# loopback is shaped to $RATE, the built-in CNN and Transformer, every candidate side by side in
# one job per model. Writes benchmarks/overlap/<model>/results.{json,md,png} and a summary.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
scripts/setup.sh
RATE="${RATE:-1gbit}"
OUT="${OUT:-benchmarks/overlap}"
CANDIDATES="local (no comm),hvd,torch-ddp,commsched:horovod,commsched:mgwfbp,commsched:bytescheduler?partition_bytes=2MiB&credit_bytes=4MiB,commsched:prophet?partition_bytes=2MiB&credit_bytes=0,commsched:dear?fusion_threshold=4MiB"
scripts/netem.sh up "$RATE"
trap 'scripts/netem.sh down' EXIT
export OMP_NUM_THREADS=1 PYTHONWARNINGS="ignore::UserWarning,ignore::FutureWarning"
run() {  # model batch
  scripts/netem.sh run .venv/bin/horovodrun -np 2 --gloo .venv/bin/python -m commsched.bench.compare \
    --model "$1" --batch-size "$2" --rounds 3 --steps 8 --warmup 7 --candidates "$CANDIDATES" \
    --out "$OUT/$1" 2>&1 | grep '\[0\]<stdout>' | sed 's/^\[0\]<stdout>://'
}
run cnn 64
run transformer 8
{
  echo "# Overlap benchmark: 2 ranks, loopback shaped to $RATE"
  echo
  echo "Command: \`RATE=$RATE scripts/bench_overlap.sh\` (each model: one horovodrun job, candidates interleaved round by round; iteration time = slowest rank's; steady state: each round starts with one untimed step and ends with an untimed flush, so every timed step pays for exactly one earlier iteration's traffic)."
  for m in cnn transformer; do echo; sed 's/^# /## /' "$OUT/$m/results.md"; echo; echo "![$m]($m/results.png)"; done
} > "$OUT/README.md"
echo "bench_overlap: wrote $OUT/README.md" >&2
