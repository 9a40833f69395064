#!/usr/bin/env bash
# The benchmark job 'overhead' (benchmarks/harness/bench_jobs.py): a world of one: every policy and auto beside the plain optimizer (and on a GPU where one is).
# Knobs (environment, default): OUT (benchmarks/overhead), INSTANCES (4), ROUNDS (10), WARMUP (110). Arguments go to scripts/bench.sh.
exec "$(dirname "${BASH_SOURCE[0]}")/bench.sh" overhead "$@"
