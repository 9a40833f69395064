#!/usr/bin/env bash
# Soak run (issue: reliability, item 7): 2,000 steps of an overlap policy on 2 ranks; resident
# memory, threads and open files sampled every 50 steps; clean shutdown. Writes benchmarks/soak/.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
scripts/setup.sh
POLICY="${POLICY:-bytescheduler}"
STEPS="${STEPS:-2000}"
OUT="${OUT:-benchmarks/soak}"
export OMP_NUM_THREADS=1 PYTHONWARNINGS="ignore::UserWarning,ignore::FutureWarning"
.venv/bin/horovodrun -np 2 --gloo .venv/bin/python -m commsched.bench.soak --policy "$POLICY" \
  --steps "$STEPS" --out "$OUT" 2>&1 | grep '\[0\]<stdout>' | sed 's/^\[0\]<stdout>://'
echo "soak: wrote $OUT/results.json and results.png" >&2
