#!/usr/bin/env bash
# Set-up if needed, then the main job: 2 ranks under horovodrun train a built-in model on
# synthetic data with hvd.DistributedOptimizer, PyTorch DDP and every commsched policy, side by
# side, and print median iteration times and ratios. Arguments go to commsched.bench.compare
# (e.g. --model transformer, --out runs/demo).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
"$ROOT/scripts/setup.sh"
export OMP_NUM_THREADS=1 PYTHONWARNINGS="ignore::UserWarning"
exec "$ROOT/.venv/bin/horovodrun" -np "${NP:-2}" --gloo "$ROOT/.venv/bin/python" \
  -m commsched.bench.compare "$@"
