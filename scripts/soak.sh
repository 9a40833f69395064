#!/usr/bin/env bash
# Soak run (issue: reliability, item 7): 2,000 steps of an overlap policy on 2 ranks; resident
# memory, threads and open files sampled every 50 steps; clean shutdown. Writes benchmarks/soak/.
set -euo pipefail
# shellcheck source=lib/common.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib/common.sh"
POLICY="${POLICY:-bytescheduler}"
STEPS="${STEPS:-2000}"
OUT="${OUT:-benchmarks/soak}"
.venv/bin/horovodrun -np 2 --gloo .venv/bin/python -m benchmarks.harness.soak --policy "$POLICY" \
  --steps "$STEPS" --out "$OUT" 2>&1 | rank0_stdout
echo "soak: wrote $OUT/results.json and results.png" >&2
