#!/usr/bin/env bash
# The benchmark job 'kfac_convergence' (benchmarks/harness/bench_jobs.py): one process, scikit-learn's digits: K-FAC + SGD against SGD and Adam, steps to a target loss.
# Knobs (environment, default): OUT (benchmarks/kfac_convergence), ARGS (empty). Arguments go to scripts/bench.sh.
exec "$(dirname "${BASH_SOURCE[0]}")/bench.sh" kfac_convergence "$@"
