#!/usr/bin/env bash
# The benchmark job 'collectives' (benchmarks/harness/bench_jobs.py): Gloo's all-reduce, reduce-scatter and all-gather against the engine's ring, 64 KiB to 64 MiB, on 2, 3 and 4 ranks.
# Knobs (environment, default): OUT (benchmarks/collectives), RATE (1gbit), RANKS (2 3 4), ROUNDS (3). Arguments go to scripts/bench.sh.
exec "$(dirname "${BASH_SOURCE[0]}")/bench.sh" collectives "$@"
