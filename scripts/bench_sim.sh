#!/usr/bin/env bash
# The benchmark job 'sim' (benchmarks/harness/bench_jobs.py): the simulator's predictions against measured medians: every policy and auto, the CNN and the Transformer at two rates (and sharded with Adam).
# Knobs (environment, default): OUT (benchmarks/sim_validation), RATES (1gbit 2gbit), THREE_RANKS_RATE (1gbit), PARTS (policies sharded), SHARDED_RATE (1gbit), ROUNDS (8), REPORT_ONLY (0). Arguments go to scripts/bench.sh.
exec "$(dirname "${BASH_SOURCE[0]}")/bench.sh" sim "$@"
