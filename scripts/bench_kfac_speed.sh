#!/usr/bin/env bash
# The benchmark job 'kfac_speed' (benchmarks/harness/bench_jobs.py): 2 ranks on a shaped loopback, the CNN: K-FAC pipelined + fused + lpt against unpipelined + round_robin.
# Knobs (environment, default): OUT (benchmarks/kfac_speed), RATE (1gbit). Arguments go to scripts/bench.sh.
exec "$(dirname "${BASH_SOURCE[0]}")/bench.sh" kfac_speed "$@"
