#!/usr/bin/env bash
# The benchmark job 'compression_convergence' (benchmarks/harness/bench_jobs.py): one process, scikit-learn's digits: PowerSGD and top-k against uncompressed.
# Knobs (environment, default): OUT (benchmarks/compression_convergence), ARGS (empty). Arguments go to scripts/bench.sh.
exec "$(dirname "${BASH_SOURCE[0]}")/bench.sh" compression_convergence "$@"
