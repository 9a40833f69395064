#!/usr/bin/env bash
# K-FAC convergence (K-FAC issue, benchmark report): K-FAC + SGD against SGD and Adam with tuned
# learning rates on scikit-learn's bundled 8x8 digits (no download), one process, steps to a
# target training loss over several seeds. Writes benchmarks/kfac_convergence/{README.md,
# results.json,curves.png}; arguments go to benchmarks.harness.kfac_convergence.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
scripts/setup.sh
OUT="${OUT:-benchmarks/kfac_convergence}"
export OMP_NUM_THREADS=1 PYTHONWARNINGS="ignore::UserWarning"
.venv/bin/python -m benchmarks.harness.kfac_convergence --out "$OUT" "$@"
echo "bench_kfac_convergence: report in $OUT/README.md (curves: $OUT/curves.png)" >&2
