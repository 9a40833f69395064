#!/usr/bin/env bash
# Compression convergence (issue 15, item 5; issue 55): PowerSGD rank 1, 2, 4 and top-k 1%, 10%
# against uncompressed on scikit-learn's bundled 8x8 digits, commsched's DistributedOptimizer in a
# world of one, SGD momentum 0.9 (top-k with DGC's momentum correction), tuned lr, several seeds.
# Writes benchmarks/compression_convergence/{README.md, results.json}; arguments go to
# benchmarks.harness.compression_convergence.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
scripts/setup.sh
OUT="${OUT:-benchmarks/compression_convergence}"
export OMP_NUM_THREADS=1 PYTHONWARNINGS="ignore::UserWarning"
.venv/bin/python -m benchmarks.harness.compression_convergence --out "$OUT" "$@"
echo "bench_compression_convergence: report in $OUT/README.md" >&2
