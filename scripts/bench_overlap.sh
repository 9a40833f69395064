#!/usr/bin/env bash
# The benchmark job 'overlap' (benchmarks/harness/bench_jobs.py): 2 ranks (and 3 on the CNN) on a shaped loopback: every candidate and auto, with predictions and the floor.
# Knobs (environment, default): OUT (benchmarks/overlap), CNN_RATE (1gbit), TRANSFORMER_RATE (1gbit), ROUNDS (8). Arguments go to scripts/bench.sh.
exec "$(dirname "${BASH_SOURCE[0]}")/bench.sh" overlap "$@"
